"""`python3 -m normgrad.bench_torch --sync`: what synchronizing batch norm
costs a training step. For each process count P (--procs, default 2 and 4)
it runs the same DistributedDataParallel step over gloo, each process with
its share of the batch, twice: with normgrad's SyncBatchNorm
(``convert_sync_batchnorm``) and with normgrad's BatchNorm (``convert``,
each process's own statistics). Their difference is the synchronization's
cost. The two alternate step by step in the same processes, so host drift
hits both alike; the slowest rank's step is the step time, and medians are
reported.

It also counts, in the SyncBatchNorm step, the collectives and bytes the
synchronized layers send (normgrad.torch.sync_stats: agreements included),
times a small all_reduce on the same group (the α of the scaling model in
docs/scale-out.md) and puts the model's prediction, k·α·⌈log2 P⌉ plus
the bytes at the measured bandwidth, beside the measured difference.

The cores are shared: P processes of max(1, threads / P) threads each, so
P = 4 on 2 cores is oversubscribed (two processes per core), and the
output says so."""
import math
import statistics
import time

import torch
import torch.distributed as dist

from normgrad.ranks import run_ranks


def _model(name, sync, layout):
    import torchvision
    import normgrad.torch as ngt
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)()
    model = ngt.convert_sync_batchnorm(model) if sync else ngt.convert(model)
    return model.to(memory_format=layout).train()


def _latency(n, reps=200):
    """Median seconds of an all_reduce of n doubles on the world group."""
    t = torch.zeros(n, dtype=torch.float64)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _worker(rank, workdir, world, cfg):
    import normgrad
    import normgrad.torch as ngt
    threads = max(1, cfg["threads"] // world)
    torch.set_num_threads(threads)
    normgrad.set_num_threads(threads)
    mf = torch.channels_last if cfg["layout"] == "channels_last" else torch.contiguous_format
    per_rank = cfg["batch"] // world + (1 if rank < cfg["batch"] % world else 0)
    torch.manual_seed(1 + rank)
    x = torch.randn(per_rank, 3, cfg["size"], cfg["size"]).contiguous(memory_format=mf)
    labels = torch.randint(0, 1000, (per_rank,))
    runs = {}
    for sync in (True, False):
        model = _model(cfg["model"], sync, mf)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        runs[sync] = (ddp, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    times = {True: [], False: []}
    counts = []
    for i in range(cfg["steps"] + 1):
        for sync in (True, False):
            ddp, opt = runs[sync]
            dist.barrier()  # every rank starts the step together
            ngt.sync_stats(reset=True)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(ddp(x), labels).backward()
            opt.step()
            dt = (time.perf_counter() - t0) * 1e3
            if i > 0:  # the first step warms caches and compiles kernels
                times[sync].append(dt)
                if sync:
                    counts.append(ngt.sync_stats())
    small = _latency(1)
    big = _latency(4096)  # 32 KiB: the bandwidth term
    dist.barrier()  # every rank past its last collective before any leaves
    return {"sync": times[True], "bn": times[False],
            "counts": {k: statistics.median(c[k] for c in counts) for k in counts[0]},
            "alpha_s": small, "beta_s_per_byte": max(0.0, big - small) / (4096 * 8)}


def _run(world, cfg):
    per_rank = run_ranks(_worker, world, args=(world, cfg))
    # A step ends when its slowest rank does.
    step = {k: statistics.median(max(ts) for ts in zip(*(p[k] for p in per_rank)))
            for k in ("sync", "bn")}
    r0 = per_rank[0]
    return step, r0["counts"], r0["alpha_s"], r0["beta_s_per_byte"]


def run_sync(args, out):
    rows = []
    model = args.model or "resnet50"
    for layout in args.layouts:
        for world in args.procs:
            cfg = {"model": model, "batch": args.batch, "size": args.size, "steps": args.steps,
                   "threads": args.threads, "layout": layout}
            step, counts, alpha, beta = _run(world, cfg)
            k, nbytes = counts["collectives"], counts["bytes"]
            levels = math.ceil(math.log2(world))
            predicted = levels * (k * alpha + nbytes * beta) * 1e3
            threads = max(1, args.threads // world)
            row = {"model": model, "batch": args.batch, "size": args.size, "layout": layout,
                   "processes": world, "threads_per_process": threads,
                   "oversubscribed": world * threads > args.threads,
                   "sync_ms": step["sync"], "bn_ms": step["bn"],
                   "sync_cost_ms": step["sync"] - step["bn"], "collectives_per_step": k,
                   "bytes_per_step": nbytes, "agreement_ms": counts["agreement_s"] * 1e3,
                   "data_collectives_ms": counts["data_s"] * 1e3, "alpha_us": alpha * 1e6,
                   "beta_us_per_kib": beta * 1024e6, "model_ms": predicted}
            rows.append(row)
            print("%s batch %d %dx%d %-13s %d processes x %d thread%s%s: SyncBatchNorm %8.1f ms, "
                  "BatchNorm %8.1f ms, difference %+7.1f ms (%+.1f%%); %d collectives, %.0f KiB "
                  "per step, rank 0 in them %.0f ms (agreements %.0f ms); gloo all_reduce %.0f us "
                  "+ %.2f us/KiB; model %.1f ms"
                  % (model, args.batch, args.size, args.size, layout, world, threads,
                     "" if threads == 1 else "s",
                     " (oversubscribed)" if row["oversubscribed"] else "", step["sync"],
                     step["bn"], row["sync_cost_ms"], 100 * row["sync_cost_ms"] / step["bn"], k,
                     nbytes / 1024, row["agreement_ms"] + row["data_collectives_ms"],
                     row["agreement_ms"], alpha * 1e6, beta * 1024e6, predicted), flush=True)
    out["sync"] = rows
