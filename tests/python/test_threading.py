"""normgrad.torch runs the JIT on torch's OpenMP pool when torch's CPU ops
use OpenMP (so a batch norm does not compete for the cores with the threads
torch's last op left spinning), keeps a NORMGRAD_THREADING the user set,
and gives the same bits on either runtime."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: normgrad.torch is not tested")
import normgrad  # noqa: E402
import normgrad.torch as ngt  # noqa: E402


def torch_uses_openmp():
    return "ATen parallel backend: OpenMP" in torch.__config__.parallel_info()


def runtime_in_fresh_process(env_value):
    env = dict(os.environ)
    env.pop("NORMGRAD_THREADING", None)
    if env_value is not None:
        env["NORMGRAD_THREADING"] = env_value
    code = "import normgrad, normgrad.torch; print(normgrad.thread_runtime())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def test_import_shares_torchs_openmp_pool():
    if not normgrad.has_openmp_runtime():
        pytest.skip("this build of normgrad has no OpenMP (libgomp)")
    if not torch_uses_openmp():
        pytest.skip("this torch's ATen parallel backend is not OpenMP")
    assert runtime_in_fresh_process(None) == "openmp"


def test_a_users_choice_is_kept():
    assert runtime_in_fresh_process("tbb") == "tbb"


def test_an_unknown_runtime_is_refused():
    with pytest.raises(normgrad.Error, match="neither tbb nor openmp"):
        normgrad.set_thread_runtime("gomp")


@pytest.mark.parametrize("layout", ["NCHW", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_runtimes_give_the_same_bits(layout, dtype):
    if not normgrad.has_openmp_runtime():
        pytest.skip("this build of normgrad has no OpenMP (libgomp)")
    torch.manual_seed(1)
    mf = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(16, 48, 20, 20).to(dtype).contiguous(memory_format=mf)
    g = torch.randn(16, 48, 20, 20).to(dtype).contiguous(memory_format=mf)
    before = normgrad.thread_runtime()
    results = {}
    try:
        for runtime in ("tbb", "openmp"):
            normgrad.set_thread_runtime(runtime)
            m = ngt.BatchNorm2d(48)
            xi = x.clone().requires_grad_()
            with ngt.recording() as ran:
                y = m(xi)
                y.backward(g)
            kernels = [p.kernel for cg in ran for p in cg.partitions]
            assert len(kernels) == 2 and all(k.startswith("jit:") for k in kernels), kernels
            results[runtime] = (y.detach(), xi.grad, m.weight.grad, m.bias.grad, m.running_var)
    finally:
        normgrad.set_thread_runtime(before)
    for a, b in zip(results["tbb"], results["openmp"]):
        assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.int16) if b.dtype == torch.bfloat16 else b)
