"""normgrad.torch's forward on the JIT, its memory pool, formats, input rules and
torch.fx fusion, against torch in float64 (never against normgrad itself)."""
import warnings

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: normgrad.torch is not tested")
import normgrad  # noqa: E402
import normgrad.torch as ngt  # noqa: E402


def rel(a, b):
    b = b.double()
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


def kernels(ran):
    """The kernels of the compiled graphs recorded by ngt.recording()."""
    return [p.kernel for cg in ran for p in cg.partitions]


@pytest.mark.parametrize("layout", ["NCHW", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_forward_runs_on_the_jit_and_keeps_the_format(layout, dtype):
    torch.manual_seed(1)
    x = torch.randn(6, 20, 9, 11).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    ours = ngt.BatchNorm2d(20)
    ref = torch.nn.BatchNorm2d(20).double()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-0.5, 0.5)
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)
    with ngt.recording() as ran:
        y = ours(x)
    assert y.dtype == dtype
    assert y.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
    limit = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    assert rel(y, ref(x.double())) < limit
    assert len(ran) == 1 and ":fwd:" in kernels(ran)[0] and kernels(ran)[0].startswith("jit:"), \
        kernels(ran)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_running_statistics_follow_torch(momentum):
    torch.manual_seed(2)
    ours = ngt.BatchNorm2d(7, momentum=momentum)
    ref = torch.nn.BatchNorm2d(7, momentum=momentum).double()
    for step in range(3):
        x = torch.randn(4, 7, 5, 5) * (step + 1) + step
        ours(x)
        ref(x.double())
    assert int(ours.num_batches_tracked) == 3
    assert rel(ours.running_mean, ref.running_mean) < 1e-6
    assert rel(ours.running_var, ref.running_var) < 1e-6  # unbiased, as torch keeps it


def test_a_constant_channel_normalises_to_beta():
    # pytorch#5410: E[x^2] - E[x]^2 in f32 gives a constant 1e7 channel a
    # variance, and dst of +-1 instead of 0.
    x = torch.randn(8, 3, 16, 16)
    x[:, 1] = 1e7
    y = ngt.BatchNorm2d(3)(x)
    assert torch.equal(y[:, 1], torch.zeros_like(y[:, 1]))


def test_f16_channels_last_has_no_nan():
    # pytorch#147303: sums of f16 squares overflow; normgrad sums in f32.
    torch.manual_seed(3)
    x = (torch.randn(16, 8, 32, 32) * 300).half().contiguous(memory_format=torch.channels_last)
    y = ngt.BatchNorm2d(8).half()(x)
    assert torch.isfinite(y).all()
    ref = torch.nn.BatchNorm2d(8).double()(x.double())
    assert rel(y, ref) < 2e-3


def test_offset_data_keeps_its_statistics():
    # f32 data at an offset of 1e4 sigma: the batch mean and variance (here
    # through momentum 1: the running buffers take them) to 1e-6 relative.
    torch.manual_seed(4)
    x = torch.randn(8, 4, 20, 20).double() + 1e4
    m = ngt.BatchNorm2d(4, momentum=1.0)
    m(x.float())
    xf = x.float().double()
    n = xf.numel() // 4
    mean = xf.mean(dim=(0, 2, 3))
    var = xf.var(dim=(0, 2, 3), unbiased=False) * n / (n - 1)
    assert ((m.running_mean.double() - mean).abs() / mean.abs()).max() < 1e-6
    assert ((m.running_var.double() - var).abs() / var).max() < 1e-6


def test_a_gradient_in_another_format_is_not_copied_whole():
    torch.manual_seed(5)
    x = torch.randn(4, 16, 8, 8).contiguous(memory_format=torch.channels_last)
    g = torch.randn(4, 16, 8, 8)  # plain NCHW
    ours, ref = ngt.BatchNorm2d(16), torch.nn.BatchNorm2d(16).double()
    xo, xr = x.clone().requires_grad_(), x.double().contiguous().requires_grad_()
    y = ours(xo)
    with ngt.recording() as ran:
        y.backward(g)
    ref(xr).backward(g.double())
    assert rel(xo.grad, xr.grad) < 2e-6
    assert xo.grad.is_contiguous(memory_format=torch.channels_last)
    # This backward's graph (channels_last src, an NCHW gradient's strides in
    # src's N,H,W,C order) runs on the JIT's strided or staged walk.
    assert len(ran) == 1, kernels(ran)
    kernel = kernels(ran)[0]
    assert "+staged" in kernel or "+strided" in kernel, kernel


def test_outputs_come_back_to_the_pool():
    normgrad.empty_cache()
    held = normgrad.memory_stats()["allocated_bytes"]  # blocks other tests' tensors still hold
    m = ngt.BatchNorm2d(32)
    x = torch.randn(16, 32, 32, 32)  # 2 MiB: pooled
    for _ in range(2):
        xi = x.clone().requires_grad_()
        m(xi).sum().backward()
    before = normgrad.memory_stats()
    for _ in range(3):
        xi = x.clone().requires_grad_()
        m(xi).sum().backward()
    after = normgrad.memory_stats()
    assert after["misses"] == before["misses"], (before, after)  # steady: no new blocks
    assert after["hits"] >= before["hits"] + 6  # dst and diff_src each step
    assert after["allocated_bytes"] > 0  # the last step's diff_src, held by xi.grad
    del xi
    assert normgrad.memory_stats()["allocated_bytes"] == held  # every tensor gave its block back
    normgrad.empty_cache()
    assert normgrad.memory_stats()["cached_bytes"] == 0


def test_the_pool_keeps_no_more_than_its_peak_use():
    # Steps alternating two shapes: under "limit" the pool keeps both shapes'
    # blocks, more than it ever had in use at once; under "peak" (the
    # default) a miss gives cached blocks back first, past a sixteenth of
    # the peak.
    assert normgrad.cache_policy() == "peak"
    held = {}
    try:
        for policy in ("limit", "peak"):
            normgrad.empty_cache()
            normgrad.reset_peak_memory_stats()
            normgrad.set_cache_policy(policy)
            m = ngt.BatchNorm2d(32)
            most = 0
            for i in range(6):
                x = torch.randn(16, 32, 32 if i % 2 else 48, 32).requires_grad_()
                m(x).sum().backward()
                del x
                s = normgrad.memory_stats()
                peak = s["peak_allocated_bytes"]
                most = max(most, s["cached_bytes"] + s["allocated_bytes"] - peak - peak // 16)
            held[policy] = most
    finally:
        normgrad.set_cache_policy("peak")
        normgrad.empty_cache()
    assert held["peak"] <= 0 < held["limit"], held
    with pytest.raises(normgrad.Error, match="neither peak nor limit"):
        normgrad.set_cache_policy("all")
    assert normgrad.cache_policy() == "peak"


HEAP_SCRIPT = r"""
import sys, torch, normgrad, normgrad.torch as ngt
torch.manual_seed(3)
m = ngt.BatchNorm2d(32)
ref = torch.nn.BatchNorm2d(32).double()

def step(shape):
    x = torch.randn(*shape)
    xi, xr = x.clone().requires_grad_(), x.double().requires_grad_()
    gy = torch.randn(*shape)
    m(xi).backward(gy)
    ref(xr).backward(gy.double())
    err = ((xi.grad.double() - xr.grad).norm() / xr.grad.norm()).item()
    assert err < 1e-5, err

def pool_calls():
    s = normgrad.memory_stats()
    return s["hits"] + s["misses"]

assert not normgrad.heap_retention()
normgrad.set_heap_retention(True)
assert normgrad.heap_retention()
small = (16, 32, 32, 32)     # 2 MiB: from torch's allocator over the kept heap
large = (10, 32, 160, 160)   # 31.25 MiB: still the heap's
huge = (9, 32, 192, 192)     # 40.5 MiB: glibc would map it afresh, so the pool's
for shape in (small, large):
    before = pool_calls()
    step(shape)
    assert pool_calls() == before, (shape, normgrad.memory_stats())
before = pool_calls()
step(huge)
assert pool_calls() >= before + 2, normgrad.memory_stats()  # dst and diff_src
normgrad.set_heap_retention(False)
assert not normgrad.heap_retention()
before = pool_calls()
step(small)
assert pool_calls() >= before + 2, normgrad.memory_stats()
print("ok")
"""


def test_heap_retention_takes_outputs_up_to_32_mib_from_torch():
    # In its own process: glibc's thresholds are process-wide, and setting
    # them back (off) does not restore glibc's moving ones for later tests.
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", HEAP_SCRIPT], capture_output=True, text=True,
                       env=dict(os.environ), timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


@pytest.mark.parametrize("bad, rule", [
    (lambda: torch.randn(4, 8, 3, 3, dtype=torch.float64), "rule: dtype"),
    (lambda: torch.randn(1, 8, 1, 1), "rule: N * spatial > 1"),
    (lambda: torch.randn(4, 8), "expected 4D input"),
    (lambda: torch.empty(4, 8, 3, 3, device="meta"), "rule: device == cpu"),
])
def test_bad_input_names_the_module_and_the_rule(bad, rule):
    with pytest.raises(normgrad.Error, match="normgrad.torch.BatchNorm2d"):
        try:
            ngt.BatchNorm2d(8)(bad())
        except normgrad.Error as e:
            assert rule in str(e), str(e)
            raise


def test_fused_forward_and_backward_match_torch():
    torch.manual_seed(6)
    x = torch.randn(4, 8, 6, 6)
    r = torch.randn(4, 8, 6, 6)
    g = torch.randn(4, 8, 6, 6)
    ours = ngt.BatchNorm2d(8, fuse_relu=True)
    ref = torch.nn.BatchNorm2d(8).double()
    xo, ro = x.clone().requires_grad_(), r.clone().requires_grad_()
    xr, rr = x.double().requires_grad_(), r.double().requires_grad_()
    with ngt.recording() as ran:
        yo = ours(xo, ro)
    yr = torch.relu(ref(xr) + rr)
    assert rel(yo, yr) < 1e-6
    with ngt.recording() as ran_bwd:
        yo.backward(g)
    yr.backward(g.double())
    assert rel(xo.grad, xr.grad) < 2e-6
    assert rel(ro.grad, rr.grad) < 1e-6
    assert rel(ours.weight.grad, ref.weight.grad) < 1e-5
    # One kernel: the NCX rows walk (grouped for these short rows where the
    # JIT generates code) with the Add and the ReLU fused.
    assert len(ran) == 1, kernels(ran)
    assert ":fwd:rows" in kernels(ran)[0] and kernels(ran)[0].endswith("+add+relu"), kernels(ran)
    # The backward: one kernel too, which masks the gradient through the
    # ReLU and writes it for the residual as a side output.
    assert len(ran_bwd) == 1, kernels(ran_bwd)
    assert "+diff_dst_relu_bwd+side_out" in kernels(ran_bwd)[0], kernels(ran_bwd)


def test_convert_fuse_traces_torchvision_resnets():
    torchvision = pytest.importorskip("torchvision", reason="python3-torchvision is not installed")
    import copy
    torch.manual_seed(7)
    base = torchvision.models.resnet18()
    ref = copy.deepcopy(base).double()
    ours = ngt.convert(copy.deepcopy(base), fuse=True)
    assert ours.normgrad_fused == 17  # stem BN+ReLU, 8 x BN+ReLU, 8 x BN+Add+ReLU
    x = torch.randn(2, 3, 64, 64)
    xo, xr = x.clone().requires_grad_(), x.double().requires_grad_()
    with ngt.recording() as ran:
        lo = ours(xo).square().mean()
    lr = ref(xr).square().mean()
    assert abs(lo.item() - lr.item()) / lr.item() < 1e-5
    lo.backward()
    lr.backward()
    assert rel(xo.grad, xr.grad) < 1e-4
    po, pr = dict(ours.named_parameters()), dict(ref.named_parameters())
    assert max(rel(po[k].grad, pr[k].grad) for k in pr) < 1e-4
    fused = [k for k in kernels(ran) if "+add+relu" in k]
    assert len(fused) == 8, kernels(ran)  # one per BasicBlock


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
            return torch.relu(self.bn(x))
        return self.bn(x)


def test_an_untraceable_model_is_converted_with_a_warning():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m = ngt.convert(Branchy(), fuse=True)
    assert isinstance(m.bn, ngt.BatchNorm2d)
    assert any("cannot trace" in str(x.message) for x in w), [str(x.message) for x in w]


def test_bench_torch_heap_configuration_takes_outputs_from_torch(bench_memory):
    """bench_torch --memory's -heap suffix retains glibc's heap in that child:
    its normgrad outputs (at most 32 MiB here) never touch the pool, while the
    same configuration without it does; --heap is refused where it cannot act."""
    import subprocess
    import sys
    rows = bench_memory(["torch", "normgrad", "normgrad-heap"])
    calls = {k: r["pool"]["hits"] + r["pool"]["misses"] for k, r in rows.items()}
    assert calls["normgrad-heap"] == 0, calls
    assert calls["normgrad"] > 0, calls  # outputs of 256 KiB or more: the pool's
    for bad in (["--memory", "--heap"], ["--sync", "--heap"]):
        r = subprocess.run([sys.executable, "-m", "normgrad.bench_torch"] + bad,
                           capture_output=True, text=True)
        assert r.returncode == 2 and "--heap" in r.stderr, r.stderr


def test_bench_torch_per_layer_table_times_eval_too(tmp_path):
    """The per-layer table times the eval forward beside the training one,
    for torch and normgrad alike, and writes both ratios."""
    import json
    import subprocess
    import sys
    out = tmp_path / "layers.json"
    subprocess.run([sys.executable, "-m", "normgrad.bench_torch", "--shapes", "2x8x5x5",
                    "--layouts", "NCHW,channels_last", "--dtypes", "f32,bf16", "--runs", "2",
                    "--threads", "1", "--json", str(out)], check=True, capture_output=True,
                   timeout=300)
    rows = json.loads(out.read_text())["layers"]
    assert [(r["layout"], r["dtype"]) for r in rows] == [
        ("NCHW", "f32"), ("NCHW", "bf16"), ("channels_last", "f32"), ("channels_last", "bf16")]
    for r in rows:
        for side in ("torch_ms", "normgrad_ms"):
            assert set(r[side]) == {"fwd", "bwd", "step", "eval"}
            assert all(v > 0 for v in r[side].values()), r
        assert r["eval_speedup"] == pytest.approx(r["torch_ms"]["eval"] / r["normgrad_ms"]["eval"])


@pytest.mark.parametrize("training", [False, True])
def test_forward_without_a_graph_matches_torch(training):
    """Under no_grad the forward runs without autograd's Function machinery:
    the same values, no grad_fn, the running statistics moved once per call
    in training, and parameters that are not dense f32 (an f64 weight, a
    strided running_var) still read correctly."""
    torch.manual_seed(4)
    x = (torch.randn(5, 12, 7, 6) * 3 + 40).to(torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    ours = ngt.BatchNorm2d(12).train(training)
    ref = torch.nn.BatchNorm2d(12).double().train(training)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-0.5, 0.5)
        ours.running_mean.uniform_(35, 45)
        ours.running_var.uniform_(5, 15)
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(ref, name).copy_(getattr(ours, name))
    # Not dense f32: read through a converted copy, never by the raw pointer.
    ours.running_var = torch.empty(24)[::2].copy_(ours.running_var)
    ours.weight = torch.nn.Parameter(ours.weight.detach().double())
    # Without a graph to record, autograd's Function.apply is not called.
    import normgrad._batch_norm as bn

    def recorded(*args):
        raise AssertionError("no_grad forward went through autograd.Function.apply")

    apply, bn._BatchNormFunction.apply = bn._BatchNormFunction.apply, recorded
    try:
        with torch.no_grad():
            y = ours(x)
            want = ref(x.double())
    finally:
        bn._BatchNormFunction.apply = apply
    assert y.grad_fn is None and not y.requires_grad
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert rel(y, want) < 8e-3
    assert torch.allclose(ours.running_mean.double(), ref.running_mean, rtol=1e-5, atol=1e-5)
    assert torch.allclose(ours.running_var.double(), ref.running_var, rtol=1e-4, atol=1e-4)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked)
