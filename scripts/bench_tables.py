#!/usr/bin/env python3
"""Markdown tables of a `normgrad bench --json` run, as docs/performance.md shows them.

Per case: the JIT's time and oneDNN's (plain layout, pre-blocked nChw16c, and
nChw16c with the reorders timed), their ratios, the traffic bounds the bench
computed (bound_ms), and how near each kernel came to its own layout's bound.
Then the geomeans over the five batch-32 ResNet-50 layers.
Ratios are speed-ups: above 1 means the JIT is faster.

    scripts/bench_tables.py docs/bench/bench-resnet50.json
"""
import json
import math
import sys


def fmt(v, spec="{:.2f}"):
    return "–" if v is None else spec.format(v)


def ratio(a, b):
    return b / a if a and b else None


def main(path):
    with open(path) as f:
        doc = json.load(f)
    host = doc.get("host", {})
    print(f"host: {host.get('cpu_model')}, {doc['threads']} threads, L3 {host.get('l3_bytes', 0) >> 20} MiB; "
          f"probe {doc['roofline_start_gbps']:.0f} GB/s at start, {doc['roofline_end_gbps']:.0f} at end, "
          f"highest {doc['roofline_gbps']:.0f}; read-only {host.get('read_only_start_gbps', 0):.0f}"
          f"/{host.get('read_only_end_gbps', 0):.0f} GB/s\n")
    print("| case | probe GB/s | jit ms | oneDNN plain | nChw16c | +reorders | jit/plain | jit/nChw16c "
          "| jit/+reorders | bound: plain / nChw16c ms | jit % of bound | nChw16c % of its bound |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    groups = {}
    for c in doc["cases"]:
        t = {r["backend"]: r["median_ms"] for r in c["results"] if r.get("median_ms", 0) > 0}
        jit, dnnl, blk, reo = t.get("jit"), t.get("dnnl"), t.get("dnnl-blocked"), t.get("dnnl-reorder")
        probe = max(c["roofline_before_gbps"], c["roofline_after_gbps"])
        bound = c.get("bound_ms", {})
        pb, bb = bound.get(c["layout"]), bound.get("nChw16c")
        print(f"| {c['name']} | {probe:.0f} | {fmt(jit)} | {fmt(dnnl)} | {fmt(blk)} | {fmt(reo)} "
              f"| {fmt(ratio(jit, dnnl))} | {fmt(ratio(jit, blk))} | {fmt(ratio(jit, reo))} "
              f"| {fmt(pb)} / {fmt(bb)} | {fmt(pb and jit and 100 * pb / jit, '{:.0f}%')} "
              f"| {fmt(bb and blk and 100 * bb / blk, '{:.0f}%')} |")
        if c["shape"][0] == 32:
            g = groups.setdefault((c["layout"], c["dtype"]), {"dnnl": [], "blk": [], "reo": []})
            for key, other in (("dnnl", dnnl), ("blk", blk), ("reo", reo)):
                if ratio(jit, other):
                    g[key].append(ratio(jit, other))
    print("\n| five batch-32 layers | jit/plain geomean (min) | jit/nChw16c geomean (min) "
          "| jit/+reorders geomean (min) |")
    print("| --- | ---: | ---: | ---: |")
    for (layout, dt), g in sorted(groups.items()):
        cells = []
        for key in ("dnnl", "blk", "reo"):
            v = g[key]
            cells.append(f"{math.exp(sum(map(math.log, v)) / len(v)):.2f}x ({min(v):.2f}x)" if v else "–")
        print(f"| {layout} {dt} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench_tables.py BENCH.json")
    main(sys.argv[1])
