"""normgrad.capture: a model's training step through AOT autograd as one
graph. The batch norms map to normgrad's ops with torch's semantics (the
captured graph, run on normgrad, gives torch's own gradients), layouts and
dtypes stay torch's, inputs are named, and what AOT cannot trace is a
clear error."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: capture is not tested")
pytest.importorskip("functorch", reason="torch without functorch: capture is not tested")

import normgrad  # noqa: E402
from normgrad.capture import CaptureError, capture  # noqa: E402


class Block(torch.nn.Module):
    """Conv, BN, ReLU, conv, BN (not affine), residual Add, LeakyReLU."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c, affine=False)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.nn.functional.leaky_relu(self.bn2(self.conv2(y)) + x, 0.1)


def skip_unless_torch_runs(model, x, autocast):
    """torch's own step on this host (bf16 convolutions need oneDNN's AVX-512
    kernels: on an AVX2 host torch 1.13 cannot run them)."""
    import copy
    m = copy.deepcopy(model)
    try:
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            m(x.clone()).float().sum().backward()
    except RuntimeError as e:
        pytest.skip("torch itself cannot run this step on this host: %s" % e)


def kinds(c):
    out = {}
    for op in json.loads(c.json)["graph"]:
        out[op["kind"]] = out.get(op["kind"], 0) + 1
    return out


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_block_maps_every_batch_norm(channels_last, autocast):
    torch.manual_seed(0)
    m, x = Block(), torch.randn(2, 8, 5, 5)
    if channels_last:
        m, x = m.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    skip_unless_torch_runs(m, x, autocast)
    c = capture(m, x, autocast=autocast)
    k = kinds(c)
    assert k["BatchNormForwardTraining"] == 2 and k["BatchNormTrainingBackward"] == 2, k
    assert k["Convolution"] == 2 and k["ReLU"] == 1 and k["ReLUBackward"] == 1, k
    assert k.get("LeakyReLU") == 1, k
    ops = json.loads(c.json)["graph"]
    adds = [op for op in ops if op["kind"] == "Wildcard" and "add.Tensor" in op["attrs"]["aten"]["value"]]
    if autocast is None:
        assert k.get("Add", 0) >= 1, k
    else:  # bf16 + the f32 input: mixed dtypes, no oneDNN Add; kept as a Wildcard
        assert adds, k
    c.graph.finalize()  # every op passes its schema, shapes agree
    bn = [op for op in ops if op["kind"] == "BatchNormForwardTraining"]
    assert len(bn[0]["inputs"]) == 5 and len(bn[1]["inputs"]) == 3  # bn2 is not affine
    assert abs(bn[0]["attrs"]["momentum"]["value"] - 0.9) < 1e-6  # oneDNN's 1 - torch's
    src = bn[0]["inputs"][0]
    assert src["shape"] == [2, 8, 5, 5]
    assert src["stride"] == ([200, 1, 40, 8] if channels_last else [200, 25, 5, 1])
    assert src["dtype"] == ("bf16" if autocast else "f32")
    names = set(c.names.values())
    assert {"conv1.weight", "bn1.weight", "bn1.running_mean", "input0", "grad:conv1.weight",
            "grad:bn1.weight", "grad:bn1.bias"} <= names


def test_batch_norm_step_gives_torchs_gradients():
    """The captured graph of a BatchNorm2d step, run on normgrad, against
    torch's own autograd (an independent computation)."""
    torch.manual_seed(1)
    m = torch.nn.BatchNorm2d(6)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    x = torch.randn(4, 6, 3, 5, requires_grad=True)
    c = capture(m, x.detach().requires_grad_())
    ops = json.loads(c.json)["graph"]
    assert [op["kind"] for op in ops] == ["BatchNormForwardTraining", "BatchNormTrainingBackward"]
    by_name = {v: k for k, v in c.names.items()}
    inputs = {by_name["weight"]: m.weight.detach().numpy(),
              by_name["bias"]: m.bias.detach().numpy(),
              by_name["running_mean"]: m.running_mean.numpy().copy(),
              by_name["running_var"]: m.running_var.numpy().copy(),
              by_name["input0"]: x.detach().numpy(),
              by_name["grad:output0"]: np.ones((4, 6, 3, 5), np.float32)}
    out = normgrad.compile(c.graph).execute(inputs)
    m.zero_grad()  # capture ran one step through AOT autograd
    y = m(x)
    y.sum().backward()
    np.testing.assert_allclose(out[by_name["output0"]], y.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[by_name["grad:weight"]], m.weight.grad.numpy(), atol=1e-4)
    np.testing.assert_allclose(out[by_name["grad:bias"]], m.bias.grad.numpy(), atol=1e-4)
    # d(sum y)/dx is zero in exact arithmetic: judged against the terms' size.
    np.testing.assert_allclose(out[by_name["grad:input0"]], x.grad.numpy(), atol=1e-5)


def test_eval_step_gives_torchs_gradients():
    """Eval: BatchNormInference, and a frozen-statistics backward."""
    torch.manual_seed(2)
    m = torch.nn.BatchNorm2d(5).eval()
    with torch.no_grad():
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
        m.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 4, 4, requires_grad=True)
    c = capture(m, x.detach().requires_grad_())
    k = kinds(c)
    assert k == {"BatchNormInference": 1, "BatchNormTrainingBackward": 1}, k
    by_name = {v: k for k, v in c.names.items()}
    inputs = {by_name[n]: getattr(m, n).detach().numpy()
              for n in ("weight", "bias", "running_mean", "running_var")}
    inputs[by_name["input0"]] = x.detach().numpy()
    inputs[by_name["grad:output0"]] = np.ones((3, 5, 4, 4), np.float32)
    out = normgrad.compile(c.graph).execute(inputs)
    m.zero_grad()
    m(x).sum().backward()
    np.testing.assert_allclose(out[by_name["grad:input0"]], x.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(out[by_name["grad:weight"]], m.weight.grad.numpy(), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(out[by_name["grad:bias"]], m.bias.grad.numpy(), rtol=1e-5)


def test_untraceable_model_is_a_clear_error():
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm2d(3)

        def forward(self, x):
            y = self.bn(x)
            if y.sum() > 0:  # data-dependent control flow
                return y * 2
            return y

    with pytest.raises(CaptureError, match="Branchy"):
        capture(Branchy(), torch.randn(2, 3, 4, 4))


def test_command_line_writes_a_graph(tmp_path):
    pytest.importorskip("torchvision", reason="python3-torchvision is not installed")
    from normgrad.capture import main
    out = tmp_path / "r18.json"
    assert main(["resnet18", "--batch", "2", "--size", "32", "--channels-last", "-o", str(out)]) == 0
    g = normgrad.load_graph(str(out))
    g.finalize()
    doc = json.loads(out.read_text())
    k = {}
    for op in doc["graph"]:
        k[op["kind"]] = k.get(op["kind"], 0) + 1
    assert k["BatchNormForwardTraining"] == 20 and k["BatchNormTrainingBackward"] == 20, k
    with pytest.raises(SystemExit):
        main(["no_such_model", "-o", str(out)])


def test_leaky_relu_network_writes_each_activation_input_as_a_side_output(tmp_path):
    """--leaky-relu: every nn.ReLU a LeakyReLU, whose backward reads its
    input, so each forward batch norm's dst (or the residual sum after it)
    is read twice. Every forward batch norm still runs fused: with its
    LeakyReLU, writing that input as a side output, or (a downsampling
    block's two) as siblings; and the captured step passes --check."""
    pytest.importorskip("torchvision", reason="python3-torchvision is not installed")
    from normgrad.capture import main
    out = tmp_path / "r18-leaky.json"
    assert main(["resnet18", "--batch", "2", "--size", "32", "--leaky-relu", "0.01",
                 "-o", str(out)]) == 0
    g = normgrad.load_graph(str(out))
    parts = normgrad.partition(g)
    fwd = [p for p in parts if "BatchNormForwardTraining" in p.ops]
    assert sum(p.ops.count("BatchNormForwardTraining") for p in fwd) == 20
    patterns = {}
    for p in fwd:
        assert p.supported and len(p.ops) > 1, (p.ops, p.pattern)
        patterns[p.pattern] = patterns.get(p.pattern, 0) + 1
        if p.pattern == "jit.bn_fwd_side_output":
            assert p.ops[-1] == "LeakyReLU", p.ops
    # The stem's, each block's first and each plain block's second (with
    # the Add): 1 + 8 + 5; the three downsampling blocks' pairs as siblings.
    assert patterns == {"jit.bn_fwd_side_output": 14, "jit.bn_fwd_siblings": 3}, patterns
