"""Benchmark normgrad.torch against torch's own batch norm, as a PyTorch user runs it.

    /usr/bin/python3 -m normgrad.bench_torch                 # the per-layer table
    /usr/bin/python3 -m normgrad.bench_torch --model resnet50 # a training step
    /usr/bin/python3 -m normgrad.bench_torch --json out.json --threads 2
    /usr/bin/python3 -m normgrad.bench_torch --memory        # peak memory of a step
    /usr/bin/python3 -m normgrad.bench_torch --sync          # SyncBatchNorm's cost, 2 and 4 processes

Per layer: the five batch-32 BatchNorm shapes of ResNet-50, NCHW and
channels_last, f32 and bf16: the forward, the backward and the whole
forward + backward of torch.nn.BatchNorm2d and of normgrad.torch.BatchNorm2d
on the same tensors, and the eval forward (running statistics, no grad), each
output fresh (as autograd allocates it), so page faults count where they
happen. Also the per-call time at 1x32x8x8, where
the overhead shows.

--model resnet50: torchvision's ResNet-50 (random init, synthetic data,
batch 16, 160x160 unless told), torch's against ``convert(model, fuse=True)``,
SGD training steps interleaved in one process, medians; with the profiler's
share of the step spent in batch norm (and in ReLU/add, which fusion takes).

--model resnet50 --compile: also ``normgrad.torch.compile(model)`` in the
interleaving (AOT autograd, BN+ReLU outputs recomputed in the backward).

--model resnet50 --autocast: the same step with the forward and loss under
``torch.autocast("cpu", torch.bfloat16)`` (bf16 convolutions, so bf16 batch
norms), as a bf16 training script runs it; --memory --autocast likewise.

--model resnet50 --leaky: the same with every ReLU swapped for
LeakyReLU(0.01) (--leaky-inplace: keeping torchvision's inplace=True), and
a third model, ``convert(model, inplace_abn=True)`` (InPlaceABN), in the
interleaving.

--memory: the peak resident memory of a training step of that LeakyReLU
ResNet-50 (--relu: of the ReLU one), each configuration (torch, normgrad's
BatchNorm, normgrad's InPlaceABN, each of the two with checkpoint="blocks",
and normgrad.torch.compile; --svg plots peak against step time) in a fresh
subprocess, so no configuration inherits another's
heap, --repeats times (medians: glibc's heap makes the peak vary by a few
percent from process to process). It reports the process's peak RSS over
--steps steps, that peak minus the RSS before the first step (the step's
own), and the bytes autograd saves for the backward (activations,
parameters excluded).

--sync: what synchronizing costs: a DistributedDataParallel step over gloo
on --procs processes (default 2,4), with normgrad's SyncBatchNorm against
normgrad's BatchNorm, interleaved in the same processes; the collectives and
bytes per step, gloo's measured latency, and the scaling model's prediction
(docs/scale-out.md). Processes share --threads cores (4 on 2 cores are
oversubscribed, and the output says so).

Runs alternate torch and normgrad case by case (host state drifts); every
figure is a median over --runs repetitions.
"""
import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch

import normgrad
import normgrad.torch as ngt
from normgrad._bench_models import make_model, with_leaky_relu, without_bn_and_activations  # noqa: F401

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
    res = {k: {"fwd": [], "bwd": [], "step": [], "eval": []} for k in mods}
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
            m.eval()  # the running statistics, as a validation pass runs
            with torch.no_grad():
                t0 = time.perf_counter()
                y = m(x)
                r["eval"].append((time.perf_counter() - t0) * 1e3)
            m.train()
            del y
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
                       "speedup": r["torch"]["step"] / r["normgrad"]["step"],
                       "eval_speedup": r["torch"]["eval"] / r["normgrad"]["eval"]}
                rows.append(row)
                print("%-14s %-13s %-4s  torch fwd %8.3f ms bwd %8.3f ms  normgrad fwd %8.3f ms "
                      "bwd %8.3f ms  fwd+bwd %6.2fx torch's speed  eval %6.2fx" % (
                          row["shape"], layout, dt, r["torch"]["fwd"], r["torch"]["bwd"],
                          r["normgrad"]["fwd"], r["normgrad"]["bwd"], row["speedup"],
                          row["eval_speedup"]), flush=True)
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



def autocast(args):
    """The forward's context: bf16 autocast with --autocast, else nothing."""
    if args.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_model(args, out):
    results = []
    prefix = "leaky-" if args.leaky else ""
    names = (["torch", "normgrad"] + (["normgrad-abn"] if args.leaky else []) +
             (["normgrad-ckpt"] if args.checkpoint else []) +
             (["normgrad-compile"] if args.compile else []) + ["no-bn"])
    if args.pool_allocator:  # torch and each normgrad mode again, torch's tensors from the pool
        names += [n + "-alloc" for n in names if n.startswith("normgrad") or n == "torch"]
    for layout in args.layouts:
        mf = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        models = {k: make_model(args.model, prefix + k.replace("-alloc", "") if k != "no-bn"
                                else k, args.leaky_inplace) for k in names}
        x = torch.randn(args.batch, 3, args.size, args.size).contiguous(memory_format=mf)
        labels = torch.randint(0, 1000, (args.batch,))
        steps = {}
        for name, m in models.items():
            m.to(memory_format=mf).train()
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

            def step(m=m, opt=opt, alloc=name.endswith("-alloc")):
                if alloc:
                    ngt.set_pool_allocator(True)
                try:
                    opt.zero_grad(set_to_none=True)
                    with autocast(args):
                        loss = torch.nn.functional.cross_entropy(m(x), labels)
                    loss.backward()
                    opt.step()
                finally:  # only this model's step: the others run on torch's allocator
                    if alloc:
                        ngt.set_pool_allocator(False)
            steps[name] = step
        times = {k: [] for k in models}
        for i in range(args.steps + 1):
            for name, step in steps.items():
                t0 = time.perf_counter()
                step()
                times[name].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        shares = {k: bn_share(models[k], steps[k], mf) for k in models
                  if k not in ("no-bn", "normgrad-compile") and not k.endswith("-alloc")}
        # Batch norm and its activations' share of torch's step, measured as
        # the same model without them (interleaved above), and how much of
        # that time normgrad's step wins back.
        bn_ms = med["torch"] - med["no-bn"]
        won = (med["torch"] - med["normgrad"]) / bn_ms if bn_ms > 0 else float("nan")
        row = {"model": args.model, "batch": args.batch, "size": args.size, "layout": layout,
               "autocast": "bf16" if args.autocast else None,
               "torch_ms": med["torch"], "normgrad_ms": med["normgrad"],
               "speedup": med["torch"] / med["normgrad"],
               "fused": getattr(models["normgrad"], "normgrad_fused", 0),
               "no_bn_ms": med["no-bn"], "bn_relu_share": bn_ms / med["torch"],
               "won_back": won,
               "profile_share": shares}
        if args.leaky:
            row["activation"] = "leaky_relu" + (" (inplace)" if args.leaky_inplace else "")
            row["normgrad_abn_ms"] = med["normgrad-abn"]
            row["abn_swapped"] = getattr(models["normgrad-abn"], "normgrad_inplace_abn", 0)
        results.append(row)
        print("%s batch %d %dx%d %-13s%s torch %8.1f ms  normgrad %8.1f ms  %.2fx  (BN share: "
              "torch %.0f%%, normgrad %.0f%%; %d fused)"
              % (args.model, args.batch, args.size, args.size, layout,
                 " bf16-autocast" if args.autocast else "", med["torch"],
                 med["normgrad"], row["speedup"], 100 * shares["torch"]["batch_norm"],
                 100 * shares["normgrad"]["batch_norm"], row["fused"]), flush=True)
        print("  without BN and ReLU %8.1f ms: they take %.0f%% of torch's step; normgrad wins "
              "back %.0f%% of that time" % (med["no-bn"], 100 * bn_ms / med["torch"], 100 * won),
              flush=True)
        if args.leaky:
            print("  with LeakyReLU: InPlaceABN %8.1f ms (%d swapped), %.2fx torch, %.2fx "
                  "normgrad's BatchNorm" % (med["normgrad-abn"], row["abn_swapped"],
                                            med["torch"] / med["normgrad-abn"],
                                            med["normgrad"] / med["normgrad-abn"]), flush=True)
        if args.compile:
            row["normgrad_compile_ms"] = med["normgrad-compile"]
            row["compiled_batch_norms"] = models["normgrad-compile"].normgrad_batch_norms
            print("  compile: %8.1f ms, %.2fx torch's speed, %.2fx convert(fuse=True)'s (%d batch "
                  "norms on normgrad)" % (med["normgrad-compile"],
                                          med["torch"] / med["normgrad-compile"],
                                          med["normgrad"] / med["normgrad-compile"],
                                          row["compiled_batch_norms"]), flush=True)
        if args.checkpoint:
            row["normgrad_ckpt_ms"] = med["normgrad-ckpt"]
            print("  checkpoint='blocks' (fused): %8.1f ms, %.2fx torch's speed"
                  % (med["normgrad-ckpt"], med["torch"] / med["normgrad-ckpt"]), flush=True)
        for name in (n for n in names if n.endswith("-alloc")):
            row[name.replace("-", "_") + "_ms"] = med[name]
            print("  %s (torch's allocations from normgrad's pool): %8.1f ms, %.2fx torch's "
                  "speed" % (name, med[name], med["torch"] / med[name]), flush=True)
    out["model"] = results


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def saved_bytes(model, x, args):
    """Bytes of the distinct storages autograd saves for the backward of model(x)
    (under autocast with --autocast), parameters excluded."""
    seen = {}

    def pack(t):
        s = t.storage()
        seen[s.data_ptr()] = s.size() * s.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(args):
        model(x)
    params = {p.data_ptr() for p in model.parameters()}
    return sum(v for k, v in seen.items() if k not in params)


def memory_child(args):
    """One configuration's training steps in this (fresh) process: prints a JSON
    line with the peak RSS, the RSS before the first step, the step times and
    the activation bytes saved for the backward."""
    layout = args.layouts[0]
    mf = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    config = args.memory_child
    if config.endswith("-heap"):  # glibc's heap retained (normgrad.set_heap_retention)
        normgrad.set_heap_retention(True)
        config = config[:-len("-heap")]
    if config.endswith("-alloc"):  # torch's allocations from normgrad's pool too
        ngt.set_pool_allocator(True)
        config = config[:-len("-alloc")]
    if config.endswith("-nopool"):  # normgrad's caching pool off: its blocks not held
        normgrad.set_cache_limit(0)
        config = config[:-len("-nopool")]
    if config.endswith("-limit"):  # the pool keeps every freed block (up to its limit)
        normgrad.set_cache_policy("limit")
        config = config[:-len("-limit")]
    model = make_model(args.model, config, args.leaky_inplace)
    model = model.to(memory_format=mf).train()
    x = torch.randn(args.batch, 3, args.size, args.size).contiguous(memory_format=mf)
    labels = torch.randint(0, 1000, (args.batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    before = rss_kib()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast(args):
            loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"config": args.memory_child, "layout": layout, "peak_kib": peak,
                      "before_kib": before, "step_ms": statistics.median(times[1:] or times),
                      "saved_bytes": saved_bytes(model, x, args), "pool": normgrad.memory_stats()}))


def run_memory(args, out):
    rows = []
    for layout in args.layouts:
        prefix = "" if args.relu else "leaky-"
        configs = [prefix + c for c in args.configs]
        runs = {c: [] for c in configs}
        for _ in range(args.repeats):  # configurations alternate, as elsewhere
            for config in configs:
                cmd = [sys.executable, "-m", "normgrad.bench_torch", "--memory-child", config,
                       "--model", args.model, "--batch", str(args.batch), "--size",
                       str(args.size), "--steps", str(args.steps), "--threads",
                       str(args.threads), "--layouts", layout]
                cmd += ["--leaky-inplace"] if args.leaky_inplace else []
                cmd += ["--autocast"] if args.autocast else []
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise SystemExit("normgrad.bench_torch --memory: %s failed:\n%s"
                                     % (config, done.stderr[-2000:]))
                runs[config].append(json.loads(done.stdout.strip().splitlines()[-1]))
        for config in configs:
            row = dict(runs[config][0])
            for k in ("peak_kib", "before_kib", "step_ms", "saved_bytes"):
                row[k] = statistics.median(r[k] for r in runs[config])
            row["peak_kib_runs"] = [r["peak_kib"] for r in runs[config]]
            row["leaky_inplace"] = args.leaky_inplace
            row["autocast"] = "bf16" if args.autocast else None
            rows.append(row)
        base = next(r for r in rows if r["config"] == prefix + "torch" and r["layout"] == layout)
        for r in rows:
            if r["layout"] != layout:
                continue
            own, base_own = r["peak_kib"] - r["before_kib"], base["peak_kib"] - base["before_kib"]
            r["peak_vs_torch"] = r["peak_kib"] / base["peak_kib"]
            r["step_peak_vs_torch"] = own / base_own
            r["saved_vs_torch"] = r["saved_bytes"] / base["saved_bytes"]
            print("%s batch %d %dx%d %-13s %-19s peak %6.0f MiB (%5.1f%%)  step's own %6.0f MiB "
                  "(%5.1f%%)  saved %6.0f MiB (%5.1f%%)  step %7.1f ms"
                  % (args.model, args.batch, args.size, args.size, layout, r["config"],
                     r["peak_kib"] / 1024, 100 * r["peak_vs_torch"], own / 1024,
                     100 * r["step_peak_vs_torch"], r["saved_bytes"] / 2**20,
                     100 * r["saved_vs_torch"], r["step_ms"]), flush=True)
    out["memory"] = rows
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(memory_svg(rows, "%s batch %d %dx%d%s" % (
                args.model, args.batch, args.size, args.size,
                ", bf16 autocast" if args.autocast else "")))


def memory_svg(rows, title):
    """A scatter plot (SVG, no plotting library): each configuration's peak memory
    growth against its step time, one marker shape per layout."""
    w, h, left, bottom, top, right = 720, 440, 70, 50, 40, 190
    xs = [r["step_ms"] for r in rows]
    ys = [(r["peak_kib"] - r["before_kib"]) / 1024 for r in rows]
    x0, x1 = 0.0, max(xs) * 1.1
    y0, y1 = 0.0, max(ys) * 1.1

    def px(x):
        return left + (x - x0) / (x1 - x0) * (w - left - right)

    def py(y):
        return h - bottom - (y - y0) / (y1 - y0) * (h - bottom - top)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (w, h), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="14">Peak memory growth against step time: %s</text>'
           % (left, title)]
    for k in range(6):
        xv, yv = x0 + (x1 - x0) * k / 5, y0 + (y1 - y0) * k / 5
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'
                   % (px(xv), top, px(xv), h - bottom))
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                   % (left, py(yv), w - right, py(yv)))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%.0f</text>'
                   % (px(xv), h - bottom + 16, xv))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.0f</text>'
                   % (left - 6, py(yv) + 4, yv))
    out.append('<text x="%.1f" y="%d" text-anchor="middle">step time (ms, median)</text>'
               % ((left + w - right) / 2, h - 12))
    out.append('<text x="16" y="%.1f" transform="rotate(-90 16 %.1f)" text-anchor="middle">'
               'peak RSS growth (MiB, median)</text>' % ((top + h - bottom) / 2,
                                                       (top + h - bottom) / 2))
    for r, x, y in zip(rows, xs, ys):
        color = colors[configs.index(r["config"]) % len(colors)]
        if r["layout"] == "channels_last":
            out.append('<rect x="%.1f" y="%.1f" width="9" height="9" fill="%s"/>'
                       % (px(x) - 4.5, py(y) - 4.5, color))
        else:
            out.append('<circle cx="%.1f" cy="%.1f" r="5" fill="%s"/>' % (px(x), py(y), color))
    for k, c in enumerate(configs):
        y = top + 10 + 18 * k
        out.append('<circle cx="%d" cy="%d" r="5" fill="%s"/><text x="%d" y="%d">%s</text>'
                   % (w - right + 16, y, colors[k % len(colors)], w - right + 26, y + 4, c))
    y = top + 10 + 18 * len(configs) + 8
    out.append('<text x="%d" y="%d">circle: NCHW; square: channels_last</text>'
               % (w - right + 10, y))
    out.append("</svg>\n")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m normgrad.bench_torch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a torchvision model (resnet50): time its training step")
    p.add_argument("--leaky", action="store_true",
                   help="with --model: ReLUs swapped for LeakyReLU(0.01), InPlaceABN timed too")
    p.add_argument("--leaky-inplace", action="store_true",
                   help="the swapped LeakyReLUs keep torchvision's inplace=True")
    p.add_argument("--sync", action="store_true",
                   help="time a SyncBatchNorm step (DDP, gloo) against a BatchNorm one on "
                        "--procs processes (model: --model, default resnet50)")
    p.add_argument("--procs", default="2,4",
                   help="with --sync: process counts, comma-separated (default 2,4)")
    p.add_argument("--memory", action="store_true",
                   help="peak RSS of a training step of --model (default resnet50) with "
                        "LeakyReLU: torch, normgrad BatchNorm, InPlaceABN, each in a fresh process")
    p.add_argument("--repeats", type=int, default=3,
                   help="with --memory: fresh processes per configuration (median)")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    p.add_argument("--configs", default="torch,normgrad,normgrad-abn,normgrad-ckpt,"
                   "normgrad-abn-ckpt,normgrad-ckpt-nopool",
                   help="with --memory: configurations, comma-separated: torch, normgrad "
                        "(fuse=True), normgrad-abn (inplace_abn=True), normgrad-ckpt and "
                        "normgrad-abn-ckpt (the same with checkpoint='blocks'), "
                        "normgrad-compile (normgrad.torch.compile); a -nopool "
                        "suffix runs one with normgrad's caching pool off (set_cache_limit(0)), "
                        "a -limit suffix with the pool keeping every freed block "
                        "(set_cache_policy('limit')), an -alloc suffix with torch's allocations "
                        "from normgrad's pool (normgrad.torch.set_pool_allocator()), and a -heap "
                        "suffix (torch's too) with glibc's heap retained "
                        "(normgrad.set_heap_retention())")
    p.add_argument("--autocast", action="store_true",
                   help="--model and --memory: the forward and loss under torch.autocast('cpu', "
                        "torch.bfloat16), as a bf16 training script runs them")
    p.add_argument("--checkpoint", action="store_true",
                   help="with --model: also time convert(fuse=True, checkpoint='blocks')")
    p.add_argument("--compile", action="store_true",
                   help="with --model: also time normgrad.torch.compile(model)")
    p.add_argument("--heap", action="store_true",
                   help="--model and the per-layer table: glibc's heap retained "
                        "(normgrad.set_heap_retention()) for torch and normgrad alike")
    p.add_argument("--pool-allocator", action="store_true",
                   help="--model: torch and each normgrad mode also with torch's allocations "
                        "from normgrad's pool during its step (normgrad.torch.set_pool_allocator)")
    p.add_argument("--relu", action="store_true",
                   help="with --memory: the model keeps its ReLUs (default: LeakyReLU, which "
                        "InPlaceABN needs)")
    p.add_argument("--svg", help="with --memory: plot each configuration's peak against its "
                                 "step time here")
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
    args.configs = args.configs.split(",")
    known = ("torch", "normgrad", "normgrad-abn", "normgrad-ckpt", "normgrad-abn-ckpt",
             "normgrad-compile")
    for c in args.configs:
        base = c
        for suffix in ("-heap", "-alloc", "-nopool", "-limit"):  # memory_child's order
            base = base[:-len(suffix)] if base.endswith(suffix) else base
        if base not in known or (base == "torch" and c not in ("torch", "torch-heap",
                                                               "torch-alloc")):
            p.error("--configs: '%s' is not one of %s (each but torch may end in -limit, then "
                    "-nopool; each, then, in -alloc, then -heap)" % (c, ", ".join(known)))
    if args.repeats < 1:
        p.error("--repeats takes a count of 1 or more")
    if args.pool_allocator or any("-alloc" in c for c in args.configs):
        ok, why = ngt.pool_allocator_available()
        if not ok:
            p.error(why)
    if "torch" not in args.configs:
        p.error("--configs: torch is the baseline every other configuration is compared with")
    args.dtypes = args.dtypes.split(",")
    for layout in args.layouts:
        if layout not in ("NCHW", "channels_last"):
            p.error("layouts are NCHW and channels_last")
    for dt in args.dtypes:
        if dt not in DTYPES:
            p.error("dtypes are f32 and bf16")
    try:
        args.procs = [int(v) for v in args.procs.split(",")]
    except ValueError:
        p.error("--procs takes process counts, e.g. 2,4")
    if any(v < 2 for v in args.procs):
        p.error("--procs: every process count must be at least 2 (got %s)" % args.procs)
    try:
        args.shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    except ValueError:
        p.error("--shapes takes NxCxHxW lists, e.g. 32x256x56x56,1x32x8x8")
    if any(len(s) != 4 or min(s) < 1 for s in args.shapes):
        p.error("--shapes takes NxCxHxW with positive sizes")
    torch.set_num_threads(args.threads)
    normgrad.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args)
        return 0
    if args.memory:
        args.model = args.model or "resnet50"
    if args.heap and args.memory:
        p.error("--heap: with --memory, give each configuration its -heap suffix")
    if args.heap and args.sync:
        p.error("--heap: --sync's ranks are processes of their own; it takes --model or the "
                "per-layer table")
    if args.heap:
        normgrad.set_heap_retention(True)
    out = {"host": host(), "threads": args.threads, "torch": torch.__version__,
           "normgrad": normgrad.__version__, "heap_retention": normgrad.heap_retention()}
    print("host: %s; %d threads; torch %s%s" % (out["host"], args.threads, torch.__version__,
                                               "; glibc's heap retained" if args.heap else ""))
    if args.sync:
        from normgrad._bench_sync import run_sync
        run_sync(args, out)
    elif args.memory:
        run_memory(args, out)
    elif args.model:
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
