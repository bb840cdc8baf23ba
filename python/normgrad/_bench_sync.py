"""`python3 -m normgrad.bench_torch --sync`: a SyncBatchNorm training step
(normgrad.torch.convert_sync_batchnorm, DistributedDataParallel over gloo)
on 2 processes, each with half the batch, against the same model in 1
process with the whole batch (a group of one), and against torch's
BatchNorm in 1 process. Each configuration uses the same cores: 2 processes
of threads/2 threads, or 1 process of `threads`. The steps are timed in
each process and the slowest rank's median is the step time."""
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _model(name, sync):
    import torchvision
    import normgrad.torch as ngt
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)()
    return ngt.convert_sync_batchnorm(model) if sync else model


def _worker(rank, world, cfg, out_dir):
    import normgrad
    threads = max(1, cfg["threads"] // world)
    torch.set_num_threads(threads)
    normgrad.set_num_threads(threads)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out_dir, "rendezvous"),
                            rank=rank, world_size=world)
    try:
        mf = torch.channels_last if cfg["layout"] == "channels_last" else torch.contiguous_format
        model = _model(cfg["model"], cfg["sync"]).to(memory_format=mf).train()
        ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        per_rank = cfg["batch"] // world + (1 if rank < cfg["batch"] % world else 0)
        torch.manual_seed(1 + rank)
        x = torch.randn(per_rank, 3, cfg["size"], cfg["size"]).contiguous(memory_format=mf)
        labels = torch.randint(0, 1000, (per_rank,))
        times = []
        for _ in range(cfg["steps"] + 1):
            dist.barrier()  # every rank starts the step together
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(ddp(x), labels).backward()
            opt.step()
            times.append((time.perf_counter() - t0) * 1e3)
        with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
            json.dump(times[1:], f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _step_ms(world, cfg):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(world, cfg, d), nprocs=world, join=True)
        per_rank = []
        for r in range(world):
            with open(os.path.join(d, "rank%d.json" % r)) as f:
                per_rank.append(json.load(f))
    # A step ends when its slowest rank does.
    return statistics.median(max(ts) for ts in zip(*per_rank))


def run_sync(args, out):
    rows = []
    if args.batch // 2 < 16 and args.threads // 2 < 2:
        # torch 1.13 (aten/src/ATen/native/Convolution.cpp, use_mkldnn) runs a
        # 1x1 convolution on its slow native path when the batch is under 16
        # and the process has one thread: ResNet-50's step is then ~10x slower
        # in each process, whatever batch norm does.
        print("note: %d samples per process on one thread: torch takes its slow 1x1 "
              "convolution path below 16 (use --batch 32 or more)" % (args.batch // 2), flush=True)
    for layout in args.layouts:
        cfg = {"model": args.model or "resnet50", "batch": args.batch, "size": args.size,
               "steps": args.steps, "threads": args.threads, "layout": layout}
        sync2 = _step_ms(2, dict(cfg, sync=True))
        sync1 = _step_ms(1, dict(cfg, sync=True))
        torch1 = _step_ms(1, dict(cfg, sync=False))
        row = {"model": cfg["model"], "batch": args.batch, "size": args.size, "layout": layout,
               "threads": args.threads, "sync_2proc_ms": sync2, "sync_1proc_ms": sync1,
               "torch_1proc_ms": torch1}
        rows.append(row)
        print("%s batch %d %dx%d %-13s SyncBatchNorm 2 processes x %d threads %8.1f ms; "
              "1 process x %d threads %8.1f ms (%.2fx); torch BatchNorm 1 process %8.1f ms "
              "(%.2fx)" % (cfg["model"], args.batch, args.size, args.size, layout,
                           max(1, args.threads // 2), sync2, args.threads, sync1, sync1 / sync2,
                           torch1, torch1 / sync2), flush=True)
    out["sync"] = rows
