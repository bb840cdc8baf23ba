"""normgrad.torch keeps torch's contracts: every wrong input is refused before a
kernel runs (in a subprocess, so a crash fails the test instead of ending the
run), convert keeps Parameter and module identity in every mode and never
leaves the input half converted, shared modules stay shared, InPlaceABN is
swapped in only where it is safe, and torch.fx, TorchScript and double
backward behave as documented. Numbers are compared with torch in float64."""
import copy
import json
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: normgrad.torch is not tested")
import torch.nn as nn  # noqa: E402

import normgrad  # noqa: E402
import normgrad.torch as ngt  # noqa: E402

from limits import close, rel_l2  # noqa: E402

# --- misuse, in a subprocess -----------------------------------------------------

MISUSE = r'''
import json, sys
import torch
import normgrad.torch as ngt

kind, = sys.argv[1:]
ranks = {"BatchNorm1d": (2, 3), "BatchNorm2d": (4,), "BatchNorm3d": (5,), "SyncBatchNorm": (4,),
         "InPlaceABN": (4,), "InPlaceABNSync": (4,)}[kind]
C = 8


def make():
    return getattr(ngt, kind)(C)


def shaped(c, rank):
    return torch.randn(*([3, c] + [4] * (rank - 2)))


cases = []
rank = ranks[-1]
for c in (2, 64):  # fewer and more channels than num_features
    cases.append(("%d channels" % c, None, lambda c=c: shaped(c, rank)))
for bad_rank in (1, 6 if rank != 6 else 3):
    if kind.startswith("InPlaceABN") or kind == "SyncBatchNorm":
        if bad_rank > 1:
            continue  # these take any rank >= 2
    cases.append(("rank %d" % bad_rank, None, lambda r=bad_rank: shaped(C, r) if r > 1 else torch.randn(C)))
for role, n in (("weight", 3), ("bias", 64), ("running_mean", 3), ("running_var", 64)):
    def tamper(m, role=role, n=n):
        t = getattr(m, role)
        new = torch.ones(n)
        if isinstance(t, torch.nn.Parameter):
            setattr(m, role, torch.nn.Parameter(new))
        else:
            setattr(m, role, new)
    cases.append(("%s of %d" % (role, n), tamper, lambda: shaped(C, rank)))
cases.append(("float64 data", None, lambda: shaped(C, rank).double()))
cases.append(("int data", None, lambda: shaped(C, rank).long()))
cases.append(("not a tensor", None, lambda: [1.0] * C))
if kind.startswith("BatchNorm"):
    def fused(m):
        m.fuse_relu = True
    cases.append(("residual not a tensor", fused, lambda: (shaped(C, rank), "r")))

out = []
for train in (True, False):
    for name, tamper, make_x in cases:
        m = make().train(train)
        if tamper is not None:
            tamper(m)
        x = make_x()
        try:
            if isinstance(x, tuple):
                m(*x)
            else:
                m(x.clone() if isinstance(x, torch.Tensor) else x)
            out.append([train, name, None, ""])
        except Exception as e:
            out.append([train, name, [c.__name__ for c in type(e).__mro__], str(e)])
print(json.dumps(out))
'''

KINDS = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "InPlaceABN",
         "InPlaceABNSync"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_wrong_input_is_refused_before_a_kernel_runs(kind):
    run = subprocess.run([sys.executable, "-c", MISUSE, kind], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert run.returncode == 0, "the process died (%d): %s" % (run.returncode, run.stderr[-2000:])
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(results) >= 16
    for train, case, mro, message in results:
        where = "%s %s (%s)" % (kind, case, "train" if train else "eval")
        assert mro is not None, where + ": no error"
        if case.startswith("rank"):
            assert "ValueError" in mro, (where, mro, message)
        elif case == "not a tensor" or case.startswith("residual"):
            assert "TypeError" in mro, (where, mro, message)
        else:
            assert "RuntimeError" in mro and "Error" in mro, (where, mro, message)
        assert "normgrad.torch." + kind in message, (where, message)
        if "RuntimeError" in mro or "ValueError" in mro:
            assert "rule" in message, (where, message)


# --- convert: one contract for every mode -----------------------------------------


def torch_types(model):
    return [type(m) for m in model.modules()]


def resnet(name, leaky):
    torchvision = pytest.importorskip("torchvision", reason="python3-torchvision is not installed")
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)()
    if leaky:
        for parent in list(model.modules()):
            for child_name, child in parent.named_children():
                if isinstance(child, nn.ReLU):
                    setattr(parent, child_name, nn.LeakyReLU(0.01, inplace=True))
    return model


def no_worse_than_torch(ours, t32, t64, what, floor):
    """Ours must be no further from float64 than 4x torch's f32, or than
    `floor`. A randomly initialised ResNet-50 is ill conditioned in f32:
    torch's own f32 gradients are up to 7e-2 off float64 at batch 2, and how
    far depends on which kernels run (ATEN_CPU_CAPABILITY), so its floor is
    1e-2 (a gradient scaled by 1.03 still fails it); ResNet-18's is 1e-5."""
    err, err_t = rel_l2(ours, t64), rel_l2(t32, t64)
    assert err <= max(4 * err_t, floor), "%s: %.3g off float64, torch f32 %.3g" % (what, err, err_t)


# Every mode on both models; the LeakyReLU variant gives InPlaceABN its
# BN -> LeakyReLU and BN -> Add -> LeakyReLU forms.
CONVERT_CASES = [(name, mode, mode == "inplace_abn") for name in ("resnet18", "resnet50")
                 for mode in ("plain", "fuse", "inplace_abn")]


@pytest.mark.parametrize("name,mode,leaky", CONVERT_CASES)
def test_convert_keeps_parameters_and_the_input_model(name, mode, leaky):
    model = resnet(name, leaky)
    t32, t64 = copy.deepcopy(model), copy.deepcopy(model).double()  # torch's, alongside
    if mode == "inplace_abn":  # InPlaceABN scales by |weight| + eps (the weights are 1 here)
        with torch.no_grad():
            for m in list(t32.modules()) + list(t64.modules()):
                if isinstance(m, nn.BatchNorm2d):
                    m.weight.add_(m.eps)
    params_before = [id(p) for p in model.parameters()]
    types_before = torch_types(model)
    lr = 0.1
    opt = torch.optim.SGD(model.parameters(), lr=lr)  # built before convert
    kwargs = {"plain": {}, "fuse": {"fuse": True}, "inplace_abn": {"inplace_abn": True}}[mode]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # InPlaceABN's list of kept batch norms
        out = ngt.convert(model, **kwargs)
    if mode == "plain":
        assert out is model
        assert nn.BatchNorm2d not in torch_types(model)
    else:
        assert isinstance(out, torch.fx.GraphModule)
        assert torch_types(model) == types_before, "the input model was changed"
    if mode == "inplace_abn":
        assert out.normgrad_inplace_abn > 0
    assert [id(p) for p in model.parameters()] == params_before
    assert {id(p) for p in out.parameters()} == set(params_before), \
        "the converted model holds other Parameter objects"
    torch.manual_seed(1)
    x = torch.randn(2, 3, 64, 64)
    if mode != "plain":
        # The input model still computes what torch's does (eval: the running
        # statistics are shared with the converted model).
        model.eval()
        t32.eval()
        with torch.no_grad():
            y_in, y_t = model(x), t32(x)
        if mode == "fuse":
            assert torch.equal(y_in, y_t), "the input model computes something else"
        model.train()
        t32.train()
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    ys = []
    for net, xin in ((out, x.clone()), (t32, x.clone()), (t64, x.double())):
        net.train()
        y = net(xin)
        y.square().mean().backward()
        ys.append(y.detach())
    opt.step()  # the optimizer made before convert trains the converted model
    floor = 1e-2 if name == "resnet50" else 1e-5
    no_worse_than_torch(ys[0], ys[1], ys[2], "output", floor)
    got, g32 = dict(out.named_parameters()), dict(t32.named_parameters())
    for k, p in t64.named_parameters():
        no_worse_than_torch(got[k].grad, g32[k].grad, p.grad, "gradient of " + k, floor)
    for k, p in model.named_parameters():
        assert torch.equal(p.detach(), before[k].add(p.grad, alpha=-lr)), "%s was not updated" % k
    bufs, b64 = dict(model.named_buffers()), dict(t64.named_buffers())
    for k, b in dict(t32.named_buffers()).items():
        if k.endswith("num_batches_tracked"):
            assert int(bufs[k]) == int(b) == 1, k
        else:
            no_worse_than_torch(bufs[k], b, b64[k], k, floor)


def test_plain_convert_returns_the_same_object_even_for_a_bare_batch_norm():
    bn = nn.BatchNorm2d(4)
    w = bn.weight
    hook_calls = []
    bn.register_forward_hook(lambda m, i, o: hook_calls.append(1))
    assert ngt.convert(bn) is bn and isinstance(bn, ngt.BatchNorm2d) and bn.weight is w
    bn(torch.randn(2, 4, 3, 3))
    assert hook_calls == [1], "the module's hooks survive"


def test_shared_modules_stay_shared():
    torch.manual_seed(2)
    bn = nn.BatchNorm2d(4)
    seq = nn.Sequential(bn, nn.ReLU(), bn)
    ngt.convert(seq)
    assert seq[0] is seq[2] and isinstance(seq[0], ngt.BatchNorm2d)

    class TwoParents(nn.Module):
        def __init__(self):
            super().__init__()
            shared = nn.BatchNorm2d(4)
            self.a = nn.Sequential(nn.Conv2d(4, 4, 1), shared)
            self.b = nn.Sequential(nn.Conv2d(4, 4, 1), shared)

        def forward(self, x):
            return self.a(x) + self.b(x)

    for kwargs in ({}, {"fuse": True}, {"inplace_abn": True}):
        m = TwoParents()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = ngt.convert(m, **kwargs)
        bns = {id(mod) for mod in out.modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)}
        assert len(bns) == 1, (kwargs, bns)
        x = torch.randn(2, 4, 5, 5)
        ref = TwoParents()
        ref.load_state_dict(m.state_dict())
        close(out(x), ref(x), torch.float32, str(kwargs))


def test_torch_sync_batch_norm_is_converted_and_subclasses_are_named():
    class MyBN(nn.BatchNorm2d):
        pass

    model = nn.Sequential(nn.SyncBatchNorm(4), MyBN(4))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ngt.convert(model)
    assert isinstance(model[0], ngt.SyncBatchNorm)
    assert type(model[1]) is MyBN
    text = " ".join(str(x.message) for x in w)
    assert "1 batch norm(s) left" in text and "MyBN" in text and "1 (" in text, text
    y = model[0](torch.randn(3, 4, 2, 2))  # runs on the CPU without a process group
    assert y.shape == (3, 4, 2, 2)


# --- InPlaceABN conversion --------------------------------------------------------


class ConvBnLeakyBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.act = nn.LeakyReLU(0.1)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn2(self.act(self.bn1(self.conv(x))))


def test_inplace_abn_never_breaks_the_backward():
    torch.manual_seed(3)
    model = ConvBnLeakyBn()
    ref = copy.deepcopy(model).double()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = ngt.convert(model, inplace_abn=True)
    assert isinstance(out.bn1, ngt.InPlaceABN)
    assert isinstance(out.bn2, ngt.BatchNorm2d)  # its input is kept by bn1's InPlaceABN
    assert any("bn2" in str(x.message) and "keep it for its own backward" in str(x.message)
               for x in w), [str(x.message) for x in w]
    x = torch.randn(4, 3, 6, 6)
    xo, xr = x.clone().requires_grad_(), x.double().requires_grad_()
    g = torch.randn(4, 8, 6, 6)
    out(xo).backward(g)
    ref(xr).backward(g.double())
    assert rel_l2(xo.grad, xr.grad) < 1e-4  # |weight| + eps scaling
    close(out.bn2.weight.grad, ref.bn2.weight.grad, torch.float32)


def test_inplace_abn_does_not_overwrite_the_callers_input():
    torch.manual_seed(4)
    model = nn.Sequential(nn.BatchNorm2d(3), nn.LeakyReLU(0.1), nn.Conv2d(3, 4, 1),
                          nn.BatchNorm2d(4), nn.LeakyReLU(0.1))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = ngt.convert(model, inplace_abn=True)
    assert any("model's input" in str(x.message) for x in w)
    assert out.normgrad_inplace_abn == 1  # the second, after the convolution
    x = torch.randn(2, 3, 5, 5)
    keep = x.clone()
    y1 = out(x)
    assert torch.equal(x, keep), "the caller's tensor was overwritten"
    y2 = out(x)
    close(y2, y1, torch.float32)


def test_inplace_abn_loads_torch_and_mapillary_checkpoints():
    bn = nn.BatchNorm2d(6)
    bn(torch.randn(4, 6, 3, 3))
    abn = ngt.InPlaceABN(6)
    abn.load_state_dict(bn.state_dict())  # num_batches_tracked included
    assert int(abn.num_batches_tracked) == 1
    state = {k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"}
    abn2 = ngt.InPlaceABN(6)
    abn2.load_state_dict(state)  # mapillary's keys
    assert torch.equal(abn2.running_mean, bn.running_mean)
    model = nn.Sequential(nn.Conv2d(3, 6, 1), nn.BatchNorm2d(6), nn.LeakyReLU())
    sd = copy.deepcopy(model.state_dict())
    out = ngt.convert(model, inplace_abn=True)
    out.load_state_dict(sd)


def test_inplace_abn_momentum_none_is_a_cumulative_average():
    torch.manual_seed(5)
    abn, bn = ngt.InPlaceABN(4, momentum=None, activation="identity"), nn.BatchNorm2d(4, momentum=None)
    for k in range(3):
        x = torch.randn(5, 4, 3, 3) * (k + 1) + k
        abn(x.clone())
        bn(x)
    close(abn.running_mean, bn.running_mean, torch.float32)
    close(abn.running_var, bn.running_var, torch.float32)


# --- torch features ----------------------------------------------------------------


def test_fx_symbolic_trace_of_a_converted_model():
    torchvision = pytest.importorskip("torchvision", reason="python3-torchvision is not installed")
    torch.manual_seed(6)
    model = ngt.convert(torchvision.models.resnet18())
    traced = torch.fx.symbolic_trace(model)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    traced.eval()
    with torch.no_grad():
        assert torch.equal(traced(x), model(x))
    abn = torch.fx.symbolic_trace(nn.Sequential(nn.Conv2d(3, 4, 1), ngt.InPlaceABN(4)))
    abn(x)


@pytest.mark.parametrize("module", [ngt.BatchNorm2d(4), ngt.SyncBatchNorm(4), ngt.InPlaceABN(4)],
                         ids=lambda m: type(m).__name__)
def test_torchscript_names_the_alternative(module):
    with pytest.raises(normgrad.Error, match="TorchScript.*symbolic_trace"):
        torch.jit.script(module)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_double_backward_matches_torch(train, relu):
    torch.manual_seed(7)
    x = torch.randn(4, 5, 3, 3)
    ours = ngt.BatchNorm2d(5, fuse_relu=relu)
    ref = nn.BatchNorm2d(5).double()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.running_var.uniform_(0.5, 2)
    ref.load_state_dict({k: v.double() if v.is_floating_point() else v
                         for k, v in ours.state_dict().items()})
    ours.train(train)
    ref.train(train)
    # A loss whose input gradient is well conditioned (sum(y^2) alone cancels to
    # O(eps) in training) and depends on x in eval too.
    r = torch.randn(4, 5, 3, 3)
    results = []
    for m, xin in ((ours, x.clone()), (ref, x.double())):
        xin.requires_grad_()
        y = m(xin)
        if m is ref and relu:
            y = torch.relu(y)
        loss = (y ** 3 * r.to(y.dtype)).sum()
        (gx,) = torch.autograd.grad(loss, xin, create_graph=True)
        gx.square().sum().backward()  # a gradient penalty
        results.append((xin.grad, m.weight.grad))
    close(results[0][0], results[1][0], torch.float32, "d/dx of the penalty")
    close(results[0][1], results[1][1], torch.float32, "d/dweight of the penalty")


def test_double_backward_of_inplace_abn_is_a_clear_error():
    m = ngt.InPlaceABN(4)
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    y = m(x * 1)
    with pytest.raises(normgrad.Error, match="double backward"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


def test_inplace_abn_module_imports_alone():
    run = subprocess.run([sys.executable, "-c", "import normgrad._inplace_abn as m; "
                          "print(m.InPlaceABN(4))"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
