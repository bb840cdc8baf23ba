"""The numeric limits of the Python tests, tied to what each dtype allows.

A result is compared with float64 computed from the same rounded inputs, by
relative L2: 1e-5 for f32, 1e-3 for f16 and 1e-2 for bf16 data (bf16 keeps
8 significant bits, f16 11; one rounding of the output alone costs about
2e-3 and 2.5e-4 of relative L2). test_limits.py shows that a result scaled by
1.03, or with its last elements zeroed, fails each of them.
"""
import torch

REL_L2 = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def rel_l2(a, ref):
    a, ref = a.detach().double(), ref.detach().double()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def close(a, ref, dtype, what=""):
    """Asserts that `a` is within dtype's relative L2 of the float64 `ref`."""
    err = rel_l2(a, ref)
    assert err <= REL_L2[dtype], "%s: relative L2 %.3g over the %s limit %.0e" % (
        what or "result", err, dtype, REL_L2[dtype])
    return err
