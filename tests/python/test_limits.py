"""The Python tests' dtype limits (limits.py) reject wrong results: a real
normgrad result passes, the same scaled by 1.03 or with its last 1% of
elements zeroed fails, for every dtype."""
import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: normgrad.torch is not tested")
import normgrad.torch as ngt  # noqa: E402

from limits import close  # noqa: E402


def wrong_results(t):
    scaled = t * 1.03
    zeroed = t.clone()
    flat = zeroed.view(-1)
    flat[-max(1, flat.numel() // 100):] = 0
    return {"scaled by 1.03": scaled, "last 1% zeroed": zeroed}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_wrong_gradient_fails_the_limit(dtype):
    torch.manual_seed(0)
    x = torch.randn(8, 16, 10, 10).to(dtype)
    g = torch.randn(8, 16, 10, 10).to(dtype)
    ours = ngt.BatchNorm2d(16)
    ref = torch.nn.BatchNorm2d(16).double()
    xo = x.clone().requires_grad_()
    xr = x.double().requires_grad_()
    ours(xo).backward(g)
    ref(xr).backward(g.double())
    close(xo.grad, xr.grad, dtype, "diff_src")
    for what, bad in wrong_results(xo.grad).items():
        with pytest.raises(AssertionError):
            close(bad.to(dtype), xr.grad, dtype, what)
