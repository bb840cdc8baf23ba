"""normgrad.torch.InPlaceABN against float64 torch: the output written over
the input, gradients through BatchNormTrainingBackwardFromDst, running
statistics, the conversion of a BN + LeakyReLU network, and the errors."""
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import normgrad  # noqa: E402
from normgrad import torch as ngt  # noqa: E402

from limits import close  # noqa: E402


def reference(x, weight, bias, eps, slope):
    """act(bn(x)) with scale |weight| + eps, in whatever dtype x has (torch ops)."""
    y = F.batch_norm(x, None, None, weight.abs() + eps, bias, True, 0.0, eps)
    return F.leaky_relu(y, slope) if slope is not None else y


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("activation,slope", [("leaky_relu", 0.01), ("leaky_relu", 0.2),
                                              ("identity", None)])
def test_forward_in_place_and_gradients_match_float64(channels_last, activation, slope):
    torch.manual_seed(0)
    x0 = torch.randn(4, 24, 9, 7) * 2 + 0.5
    if channels_last:
        x0 = x0.contiguous(memory_format=torch.channels_last)
    m = ngt.InPlaceABN(24, activation=activation, activation_param=slope)
    with torch.no_grad():
        m.weight.uniform_(-1.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    w64 = m.weight.detach().double().requires_grad_()
    b64 = m.bias.detach().double().requires_grad_()
    xr = x0.double().requires_grad_()
    y64 = reference(xr, w64, b64, m.eps, slope)
    g = torch.randn_like(y64)
    y64.backward(g)

    leaf = x0.clone().requires_grad_()
    x = leaf * 1  # a non-leaf, as a layer's output is
    ptr = x.data_ptr()
    y = m(x)
    assert y.data_ptr() == ptr, "the output is written over the input"
    assert y.is_contiguous(memory_format=torch.channels_last) == channels_last
    close(y.detach(), y64.detach(), torch.float32)
    y.backward(g.float())
    close(leaf.grad, xr.grad, torch.float32)
    close(m.weight.grad, w64.grad, torch.float32)
    close(m.bias.grad, b64.grad, torch.float32)


def test_running_statistics_follow_torch():
    torch.manual_seed(1)
    x = torch.randn(8, 6, 5, 5) * 3 + 1
    m = ngt.InPlaceABN(6, momentum=0.3)
    t = nn.BatchNorm2d(6, momentum=0.3)
    t(x.clone())
    m(x.clone())
    assert torch.allclose(m.running_mean, t.running_mean, rtol=1e-5, atol=1e-6)
    assert torch.allclose(m.running_var, t.running_var, rtol=1e-5, atol=1e-6)


def test_eval_uses_running_statistics_in_place_without_grad():
    m = ngt.InPlaceABN(5, activation_param=0.1).eval()
    with torch.no_grad():
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
        m.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 4, 4)
    want = F.leaky_relu(F.batch_norm(x, m.running_mean, m.running_var, m.weight.abs() + m.eps,
                                     m.bias, False, 0.0, m.eps), 0.1)
    with torch.no_grad():
        y = m(x)
    assert y is x and torch.allclose(y, want, atol=1e-5)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_bf16_and_f16_data(dt):
    torch.manual_seed(2)
    x0 = torch.randn(4, 32, 6, 6).to(dt)
    m = ngt.InPlaceABN(32)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    w64 = m.weight.detach().double().requires_grad_()
    b64 = m.bias.detach().double().requires_grad_()
    xr = x0.double().requires_grad_()  # float64 from the same rounded inputs
    y64 = reference(xr, w64, b64, m.eps, 0.01)
    g = torch.randn_like(y64).to(dt)
    y64.backward(g.double())
    leaf = x0.clone().requires_grad_()
    y = m(leaf * 1)
    y.backward(g)
    close(y, y64, dt, "dst")
    close(leaf.grad, xr.grad, dt, "diff_src")
    # x̂ is recovered from the rounded output: the data dtype bounds these too.
    close(m.weight.grad, w64.grad, dt, "diff_gamma")
    close(m.bias.grad, b64.grad, dt, "diff_beta")


class Net(nn.Module):
    """conv -> BN -> LeakyReLU, conv -> BN -> Add -> LeakyReLU, and a BN -> ReLU."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.act = nn.LeakyReLU(0.01)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.conv3 = nn.Conv2d(16, 16, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.act(self.bn1(self.conv1(x)))
        out2 = self.bn2(self.conv2(out))
        out2 += out
        out2 = self.act(out2)
        return self.relu(self.bn3(self.conv3(out2))).mean(dim=(2, 3))


def test_convert_swaps_bn_leaky_relu_and_matches_torch_gradients():
    torch.manual_seed(3)
    ref = Net()
    model = Net()
    model.load_state_dict(ref.state_dict())
    ref64 = Net().double()
    ref64.load_state_dict(ref.state_dict())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        model = ngt.convert(model, inplace_abn=True)
    assert model.normgrad_inplace_abn == 2
    assert isinstance(model.bn1, ngt.InPlaceABN) and model.bn1.activation == "leaky_relu"
    # BN -> Add -> LeakyReLU: one InPlaceABN called with the residual.
    assert isinstance(model.bn2, ngt.InPlaceABN) and model.bn2.activation == "leaky_relu"
    assert "bn2(conv2, " in model.code
    assert isinstance(model.bn3, ngt.BatchNorm2d)  # BN -> ReLU stays
    assert any("ReLU has no inverse" in str(x.message) for x in w)
    x = torch.randn(4, 3, 12, 12)
    grads = {}
    for name, net, xin in (("ng", model, x), ("t32", ref, x), ("t64", ref64, x.double())):
        out = net(xin)
        out.square().sum().backward()
        grads[name] = {k: p.grad.double() for k, p in net.named_parameters()}
    for k in grads["t64"]:
        err_ng = rel(grads["ng"][k], grads["t64"][k])
        err_t = rel(grads["t32"][k], grads["t64"][k])
        assert err_ng < max(5 * err_t, 1e-4), (k, err_ng, err_t)


@pytest.mark.parametrize("kwargs,message", [
    ({"activation": "relu"}, "'relu' has no inverse"),
    ({"activation": "elu"}, "not supported"),
    ({"activation_param": 0.0}, "must be finite and > 0"),
    ({"activation_param": -1.0}, "must be finite and > 0"),
    ({"activation": "identity", "activation_param": 0.01}, "only read with leaky_relu"),
])
def test_bad_activation_is_named(kwargs, message):
    with pytest.raises(normgrad.Error, match=message):
        ngt.InPlaceABN(8, **kwargs)


def test_leaky_relu_slope_defaults_to_mapillarys():
    assert ngt.InPlaceABN(8).activation_param == 0.01
    assert ngt.InPlaceABN(8, activation="identity").activation_param is None


def test_leaf_that_requires_grad_is_refused():
    m = ngt.InPlaceABN(4)
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    with pytest.raises(normgrad.Error, match="leaf tensor that requires grad"):
        m(x)


def test_non_contiguous_input_is_refused_not_copied():
    m = ngt.InPlaceABN(4)
    x = torch.randn(2, 4, 6, 6)[:, :, ::2]
    with pytest.raises(normgrad.Error, match="neither contiguous nor channels_last"):
        m(x)


@pytest.mark.parametrize("channels_last", [False, True])
def test_residual_form_matches_float64(channels_last):
    torch.manual_seed(4)
    x0 = torch.randn(4, 16, 6, 5) * 1.5
    r0 = torch.randn(4, 16, 6, 5)
    if channels_last:
        x0 = x0.contiguous(memory_format=torch.channels_last)
    m = ngt.InPlaceABN(16, activation_param=0.05)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    xr, rr = x0.double().requires_grad_(), r0.double().requires_grad_()
    w64 = m.weight.detach().double().requires_grad_()
    b64 = m.bias.detach().double().requires_grad_()
    y64 = F.leaky_relu(F.batch_norm(xr, None, None, w64.abs() + m.eps, b64, True, 0.0, m.eps) + rr,
                       0.05)
    g = torch.randn_like(y64)
    y64.backward(g)
    lx, lr = x0.clone().requires_grad_(), r0.clone().requires_grad_()
    x = lx * 1
    y = m(x, lr * 1)
    assert y.data_ptr() == x.data_ptr()
    y.backward(g.float())
    close(y.detach(), y64.detach(), torch.float32)
    close(lx.grad, xr.grad, torch.float32)
    close(lr.grad, rr.grad, torch.float32)
    close(m.weight.grad, w64.grad, torch.float32)
    close(m.bias.grad, b64.grad, torch.float32)


def test_memory_bench_shows_fewer_saved_bytes(tmp_path):
    """bench_torch --memory on a small torchvision ResNet-18: InPlaceABN keeps
    fewer bytes for the backward than torch (an exact count, not a timing)."""
    pytest.importorskip("torchvision")
    import json
    import subprocess
    import sys
    out = tmp_path / "mem.json"
    subprocess.run([sys.executable, "-m", "normgrad.bench_torch", "--memory", "--model",
                    "resnet18", "--batch", "2", "--size", "64", "--steps", "2", "--repeats", "1",
                    "--layouts", "NCHW", "--configs", "torch,normgrad,normgrad-abn,normgrad-ckpt",
                    "--json", str(out)], check=True, capture_output=True)
    rows = {r["config"]: r for r in json.loads(out.read_text())["memory"]}
    assert set(rows) == {"leaky-torch", "leaky-normgrad", "leaky-normgrad-abn",
                         "leaky-normgrad-ckpt"}
    # checkpoint="blocks" keeps only the stem's and the blocks' inputs.
    assert rows["leaky-normgrad-ckpt"]["saved_bytes"] < rows["leaky-normgrad-abn"]["saved_bytes"]
    # normgrad's BatchNorm saves what torch's does, up to its small statistics tensors.
    assert abs(rows["leaky-normgrad"]["saved_bytes"] / rows["leaky-torch"]["saved_bytes"] - 1) < 0.02
    assert rows["leaky-normgrad-abn"]["saved_bytes"] < 0.7 * rows["leaky-torch"]["saved_bytes"]
    assert all(r["peak_kib"] > r["before_kib"] > 0 for r in rows.values())
