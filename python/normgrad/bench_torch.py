"""Benchmark normgrad.torch against torch's own batch norm, as a PyTorch user runs it.

    /usr/bin/python3 -m normgrad.bench_torch                 # the per-layer table
    /usr/bin/python3 -m normgrad.bench_torch --model resnet50 # a training step
    /usr/bin/python3 -m normgrad.bench_torch --json out.json --threads 2

Per layer: the five batch-32 BatchNorm shapes of ResNet-50, NCHW and
channels_last, f32 and bf16: the forward, the backward and the whole
forward + backward of torch.nn.BatchNorm2d and of normgrad.torch.BatchNorm2d
on the same tensors, each output fresh (as autograd allocates it), so page
faults count where they happen. Also the per-call time at 1x32x8x8, where
the overhead shows.

--model resnet50: torchvision's ResNet-50 (random init, synthetic data,
batch 16, 160x160 unless told), torch's against ``convert(model, fuse=True)``,
SGD training steps interleaved in one process, medians; with the profiler's
share of the step spent in batch norm (and in ReLU/add, which fusion takes).

Runs alternate torch and normgrad case by case (host state drifts); every
figure is a median over --runs repetitions.
"""
import argparse
import copy
import json
import platform
import statistics
import sys
import time

import torch

import normgrad
import normgrad.torch as ngt

LAYERS = [(32, 64, 112, 112), (32, 256, 56, 56), (32, 512, 28, 28), (32, 1024, 14, 14),
          (32, 2048, 7, 7)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def host():
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return name


def median_ms(fn, runs):
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def layer_case(shape, layout, dt, runs):
    """{'torch': {...}, 'normgrad': {...}} with fwd, bwd and step medians in ms."""
    torch.manual_seed(0)
    mf = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(shape).to(DTYPES[dt]).contiguous(memory_format=mf)
    g = torch.randn(shape).to(DTYPES[dt]).contiguous(memory_format=mf)
    c = shape[1]
    mods = {"torch": torch.nn.BatchNorm2d(c), "normgrad": ngt.BatchNorm2d(c)}
    res = {k: {"fwd": [], "bwd": [], "step": []} for k in mods}
    for _ in range(runs + 1):  # the first round warms up (compiles, pools)
        for name, m in mods.items():
            xi = x.detach().requires_grad_()
            t0 = time.perf_counter()
            y = m(xi)
            t1 = time.perf_counter()
            y.backward(g)
            t2 = time.perf_counter()
            r = res[name]
            r["fwd"].append((t1 - t0) * 1e3)
            r["bwd"].append((t2 - t1) * 1e3)
            r["step"].append((t2 - t0) * 1e3)
            del y, xi
    return {k: {p: statistics.median(v[1:]) for p, v in r.items()} for k, r in res.items()}


def run_layers(args, out):
    rows = []
    for shape in args.shapes:
        for layout in args.layouts:
            for dt in args.dtypes:
                runs = args.runs if shape[0] > 1 else max(args.runs, 200)
                r = layer_case(shape, layout, dt, runs)
                row = {"shape": "x".join(map(str, shape)), "layout": layout, "dtype": dt,
                       "torch_ms": r["torch"], "normgrad_ms": r["normgrad"],
                       "speedup": r["torch"]["step"] / r["normgrad"]["step"]}
                rows.append(row)
                print("%-14s %-13s %-4s  torch fwd %8.3f bwd %8.3f  normgrad fwd %8.3f bwd %8.3f  "
                      "fwd+bwd %6.2fx" % (row["shape"], layout, dt, r["torch"]["fwd"],
                                          r["torch"]["bwd"], r["normgrad"]["fwd"],
                                          r["normgrad"]["bwd"], row["speedup"]), flush=True)
    out["layers"] = rows


def bn_share(model, step, mf):
    """The profiler's share of one step in batch norm, ReLU and add (self CPU time)."""
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    total = 0.0
    parts = {"batch_norm": 0.0, "relu": 0.0, "add": 0.0}
    for e in prof.key_averages():
        t = e.self_cpu_time_total
        total += t
        k = e.key.lower()
        if "batch_norm" in k or "normgrad" in k or "batchnorm" in k:
            parts["batch_norm"] += t
        elif "threshold_backward" in k or "relu" in k:
            parts["relu"] += t
        elif k in ("aten::add", "aten::add_"):
            parts["add"] += t
    return {k: v / total if total else 0.0 for k, v in parts.items()}


def run_model(args, out):
    import torchvision
    results = []
    for layout in args.layouts:
        torch.manual_seed(0)
        mf = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        base = getattr(torchvision.models, args.model)()
        models = {"torch": copy.deepcopy(base), "normgrad": ngt.convert(copy.deepcopy(base),
                                                                         fuse=True)}
        x = torch.randn(args.batch, 3, args.size, args.size).contiguous(memory_format=mf)
        labels = torch.randint(0, 1000, (args.batch,))
        steps = {}
        for name, m in models.items():
            m.to(memory_format=mf).train()
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

            def step(m=m, opt=opt):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(m(x), labels).backward()
                opt.step()
            steps[name] = step
        times = {k: [] for k in models}
        for i in range(args.steps + 1):
            for name, step in steps.items():
                t0 = time.perf_counter()
                step()
                times[name].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        shares = {k: bn_share(models[k], steps[k], mf) for k in models}
        row = {"model": args.model, "batch": args.batch, "size": args.size, "layout": layout,
               "torch_ms": med["torch"], "normgrad_ms": med["normgrad"],
               "speedup": med["torch"] / med["normgrad"],
               "fused": getattr(models["normgrad"], "normgrad_fused", 0),
               "profile_share": shares}
        results.append(row)
        print("%s batch %d %dx%d %-13s torch %8.1f ms  normgrad %8.1f ms  %.2fx  (BN share: "
              "torch %.0f%%, normgrad %.0f%%; %d fused)"
              % (args.model, args.batch, args.size, args.size, layout, med["torch"],
                 med["normgrad"], row["speedup"], 100 * shares["torch"]["batch_norm"],
                 100 * shares["normgrad"]["batch_norm"], row["fused"]), flush=True)
    out["model"] = results


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m normgrad.bench_torch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a torchvision model (resnet50): time its training step")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--steps", type=int, default=5, help="training steps per model (median)")
    p.add_argument("--runs", type=int, default=7, help="repetitions per layer case (median)")
    p.add_argument("--threads", type=int, default=2, help="torch and normgrad threads")
    p.add_argument("--layouts", default="NCHW,channels_last")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in LAYERS) + ",1x32x8x8",
                   help="per-layer cases, NxCxHxW comma-separated (default: ResNet-50's five "
                        "batch-32 shapes and 1x32x8x8)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    args.layouts = args.layouts.split(",")
    args.dtypes = args.dtypes.split(",")
    for layout in args.layouts:
        if layout not in ("NCHW", "channels_last"):
            p.error("layouts are NCHW and channels_last")
    for dt in args.dtypes:
        if dt not in DTYPES:
            p.error("dtypes are f32 and bf16")
    try:
        args.shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    except ValueError:
        p.error("--shapes takes NxCxHxW lists, e.g. 32x256x56x56,1x32x8x8")
    if any(len(s) != 4 or min(s) < 1 for s in args.shapes):
        p.error("--shapes takes NxCxHxW with positive sizes")
    torch.set_num_threads(args.threads)
    normgrad.set_num_threads(args.threads)
    out = {"host": host(), "threads": args.threads, "torch": torch.__version__,
           "normgrad": normgrad.__version__}
    print("host: %s; %d threads; torch %s" % (out["host"], args.threads, torch.__version__))
    if args.model:
        run_model(args, out)
    else:
        run_layers(args, out)
    out["pool"] = normgrad.memory_stats()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
