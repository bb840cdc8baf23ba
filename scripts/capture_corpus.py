#!/usr/bin/env python3
"""capture_corpus.py: capture torchvision models' training steps and judge them.

For each model and variant (NCHW or channels_last, f32 or under bf16
autocast) it captures the step with normgrad.capture, lists its partitions
with `normgrad partitions --json`, and runs `normgrad run --cut-unsupported
--check` on each seed. It fails (exit 1) when a capture that torch itself can
run fails, when a batch-norm-family op is not on a supported partition, or
when a check fails; and prints a Markdown table: ops, partitions, the batch
norms fused with a neighbour out of all, the ops handed back, and the time of
`normgrad partitions` end to end.

    PYTHONPATH=build/python /usr/bin/python3 scripts/capture_corpus.py \\
        --normgrad build/bin/normgrad --seeds 20
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "densenet121", "efficientnet_b0",
          "regnet_x_400mf", "vgg11_bn", "shufflenet_v2_x1_0"]
VARIANTS = {"nchw": [], "channels_last": ["--channels-last"], "nchw-bf16": ["--autocast", "bf16"],
            "channels_last-bf16": ["--channels-last", "--autocast", "bf16"]}
# Not in the default set: the model with every nn.ReLU a LeakyReLU(0.01)
# (its backward reads the activation's input: the forward's side output).
EXTRA_VARIANTS = {"nchw-leaky": ["--leaky-relu", "0.01"],
                  "channels_last-leaky": ["--channels-last", "--leaky-relu", "0.01"]}
BN_KINDS = ("BatchNormForwardTraining", "BatchNormTrainingBackward", "BatchNormInference")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--normgrad", required=True, help="the normgrad command")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="of %s" % ", ".join(list(VARIANTS) + list(EXTRA_VARIANTS)))
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--dir", help="keep the graphs here (default: a temporary folder)")
    a = p.parse_args(argv)
    for variant in a.variants.split(","):
        if variant not in VARIANTS and variant not in EXTRA_VARIANTS:
            p.error("no variant %r" % variant)
    try:
        import functorch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError as e:
        print("capture_corpus: skipped: %s (install python3-torch and python3-torchvision)" % e)
        return 77
    out_dir = a.dir or tempfile.mkdtemp(prefix="ng_corpus_")
    os.makedirs(out_dir, exist_ok=True)
    failures = []
    print("| model | variant | ops | partitions | batch norms fused / all | ops handed back "
          "| `partitions` s | seeds passed |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for model in a.models.split(","):
        for variant in a.variants.split(","):
            row = run_one(a, out_dir, model, variant, failures)
            print("| %s | %s | %s |" % (model, variant, " | ".join(str(x) for x in row)))
            sys.stdout.flush()
    for f in failures:
        print("FAILED: " + f, file=sys.stderr)
    return 1 if failures else 0


def run_one(a, out_dir, model, variant, failures):
    path = os.path.join(out_dir, "%s-%s.json" % (model, variant))
    cap = subprocess.run([sys.executable, "-m", "normgrad.capture", model, "--batch", str(a.batch),
                          "--size", str(a.size), "-o", path] + flags(variant),
                         capture_output=True, text=True)
    if cap.returncode != 0:
        why = (cap.stderr.strip().splitlines() or ["?"])[-1]
        # What torch itself cannot run on this host (torch 1.13 has no bf16
        # backward for ReLU6, and no bf16 convolution without AVX-512) is a
        # limit of torch, said as such; anything else is capture's failure.
        eager = torch_step(model, variant, a)
        if eager:
            return ["torch cannot run it: " + eager] + [""] * 6
        failures.append("%s %s: capture: %s" % (model, variant, why))
        return ["capture failed"] + [""] * 6
    with open(path) as f:
        ops = json.load(f)["graph"]
    t0 = time.perf_counter()
    parts = subprocess.run([a.normgrad, "partitions", "--json", path], capture_output=True,
                           text=True)
    seconds = time.perf_counter() - t0
    if parts.returncode != 0:
        failures.append("%s %s: partitions: %s" % (model, variant, parts.stderr.strip()))
        return [len(ops), "failed"] + [""] * 5
    listed = json.loads(parts.stdout)
    bn_all = bn_fused = handed_back = 0
    for part in listed:
        n_bn = sum(1 for k in part["ops"] if k in BN_KINDS)
        bn_all += n_bn
        if n_bn and (not part["supported"] or part["backend"] == "ref"):
            failures.append("%s %s: partition %d (%s) runs on %s" %
                            (model, variant, part["id"], "+".join(part["ops"]),
                             part["backend"] or "nothing"))
        if n_bn and len(part["ops"]) > 1:
            bn_fused += n_bn
        if not part["supported"]:
            handed_back += len(part["ops"])
    passed = 0
    for seed in range(1, a.seeds + 1):
        r = subprocess.run([a.normgrad, "run", path, "--cut-unsupported", "--check", "--seed",
                            str(seed)], capture_output=True, text=True)
        if r.returncode == 0:
            passed += 1
        else:
            lines = [l for l in r.stdout.splitlines() if "FAIL" in l] or r.stderr.splitlines()
            failures.append("%s %s seed %d: %s" % (model, variant, seed,
                                                   (lines or ["?"])[0][:300]))
    return [len(ops), len(listed), "%d / %d" % (bn_fused, bn_all), handed_back,
            "%.2f" % seconds, "%d / %d" % (passed, a.seeds)]


def flags(variant):
    """The capture's flags for a variant of VARIANTS or EXTRA_VARIANTS."""
    return VARIANTS[variant] if variant in VARIANTS else EXTRA_VARIANTS[variant]


def torch_step(model, variant, a):
    """torch's own eager step of the variant: None when it runs, else the error."""
    code = ("import torch, torchvision\n"
            "from normgrad.capture import leaky_relus\n"
            "m = torchvision.models.%s(num_classes=10)\n"
            "if %r:\n"
            "    leaky_relus(m, 0.01)\n"
            "x = torch.randn(%d, 3, %d, %d)\n"
            "if %r:\n"
            "    m = m.to(memory_format=torch.channels_last)\n"
            "    x = x.to(memory_format=torch.channels_last)\n"
            "with torch.autocast('cpu', dtype=torch.bfloat16, enabled=%r):\n"
            "    m(x).float().sum().backward()\n" %
            (model, "leaky" in variant, a.batch, a.size, a.size, "channels_last" in variant,
             "bf16" in variant))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode == 0:
        return None
    return ((r.stderr.strip().splitlines() or ["?"])[-1]).split("RuntimeError: ")[-1]


if __name__ == "__main__":
    sys.exit(main())
