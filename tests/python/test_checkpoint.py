"""normgrad's batch norms (BatchNorm1d/2d/3d, SyncBatchNorm, InPlaceABN and
InPlaceABNSync) under activation checkpointing
(torch.utils.checkpoint, reentrant and not, and checkpoint_sequential):
running statistics move once per step, and outputs, gradients and
statistics are the same bits as the same step without checkpointing;
SyncBatchNorm does not synchronize again in the recompute. torch's own
BatchNorm counts the batch twice (pytorch#96136), so the reference is the
unchecked step, and float64 for the values."""
import copy
import os

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
from torch.utils.checkpoint import checkpoint, checkpoint_sequential  # noqa: E402

import normgrad.torch as ngt  # noqa: E402
import ranks  # noqa: E402


def make_abn_model(sync=False):
    torch.manual_seed(3)
    abn = ngt.InPlaceABNSync if sync else ngt.InPlaceABN
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), abn(8, activation_param=0.1),
                               torch.nn.Conv2d(8, 8, 3, padding=1), abn(8, momentum=None))


def make_model(dim):
    torch.manual_seed(3)
    conv = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[dim]
    bn = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}[dim]
    model = torch.nn.Sequential(conv(3, 8, 3, padding=1), bn(8), torch.nn.ReLU(),
                                conv(8, 8, 3, padding=1), bn(8, momentum=None))
    return model


def step(model, x, g, how):
    x = x.clone().requires_grad_()
    if how == "plain":
        y = model(x)
    elif how == "sequential":
        y = checkpoint_sequential(model, 2, x)
    else:
        y = checkpoint(model, x, use_reentrant=(how == "reentrant"))
    y.backward(g)
    return y.detach(), x.grad


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("how", ["reentrant", "non_reentrant", "sequential"])
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_a_checkpointed_step_is_the_unchecked_step_bit_for_bit(dim, how):
    base = ngt.convert(make_model(dim))
    plain, ckpt = copy.deepcopy(base), copy.deepcopy(base)
    shape = {1: (4, 3, 9), 2: (4, 3, 6, 5), 3: (2, 3, 4, 3, 5)}[dim]
    for k in range(2):  # two steps: num_batches_tracked 1 then 2
        torch.manual_seed(10 + k)
        x = torch.randn(*shape) * 3 + 1
        g = torch.randn(shape[0], 8, *shape[2:])
        y0, dx0 = step(plain, x, g, "plain")
        y1, dx1 = step(ckpt, x, g, how)
        assert torch.equal(y0, y1) and torch.equal(dx0, dx1)
        for (n0, p0), (n1, p1) in zip(plain.named_parameters(), ckpt.named_parameters()):
            assert torch.equal(p0.grad, p1.grad), n0
        s0, s1 = state(plain), state(ckpt)
        for key in s0:
            assert torch.equal(s0[key], s1[key]), key
        assert int(s1["1.num_batches_tracked"]) == k + 1
        assert int(s1["4.num_batches_tracked"]) == k + 1


@pytest.mark.parametrize("how", ["reentrant", "non_reentrant", "sequential"])
def test_inplace_abn_checkpointed_is_the_unchecked_step_bit_for_bit(how):
    base = make_abn_model()
    plain, ckpt = copy.deepcopy(base), copy.deepcopy(base)
    for k in range(2):
        torch.manual_seed(30 + k)
        x = torch.randn(4, 3, 6, 5) * 2 - 1
        g = torch.randn(4, 8, 6, 5)
        y0, dx0 = step(plain, x, g, "plain")
        y1, dx1 = step(ckpt, x, g, how)
        assert torch.equal(y0, y1) and torch.equal(dx0, dx1)
        for p0, p1 in zip(plain.parameters(), ckpt.parameters()):
            assert torch.equal(p0.grad, p1.grad)
        s0, s1 = state(plain), state(ckpt)
        for key in s0:
            assert torch.equal(s0[key], s1[key]), key
        assert int(s1["1.num_batches_tracked"]) == k + 1


def test_values_against_float64_and_torch_counting_twice():
    """The checkpointed step's running statistics against float64 torch
    without checkpointing (one update); torch's own BatchNorm, checkpointed,
    updates twice (what this guards against)."""
    model = make_model(2)
    ours = ngt.convert(copy.deepcopy(model))
    ref = copy.deepcopy(model).double()
    x = torch.randn(4, 3, 6, 5)
    g = torch.randn(4, 8, 6, 5)
    y, dx = step(ours, x, g, "non_reentrant")
    xr = x.double().requires_grad_()
    yr = ref(xr)
    yr.backward(g.double())
    assert ((y.double() - yr).norm() / yr.norm()).item() < 1e-5
    assert ((dx.double() - xr.grad).norm() / xr.grad.norm()).item() < 1e-4
    assert ((ours[1].running_var.double() - ref[1].running_var).norm()
            / ref[1].running_var.norm()).item() < 1e-5
    twice = copy.deepcopy(model)
    step(twice, x, g, "reentrant")
    assert int(twice[1].num_batches_tracked) == 2  # torch's module, for contrast


def test_two_different_batches_before_a_backward_both_count():
    """A module applied to two different batches before one backward is not
    a recompute: each batch counts, as with torch's module."""
    m = ngt.BatchNorm2d(4)
    a, b = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3) + 1
    (m(a.requires_grad_()).sum() + m(b.requires_grad_()).sum()).backward()
    t = torch.nn.BatchNorm2d(4)
    (t(a).sum() + t(b).sum()).backward()
    assert int(m.num_batches_tracked) == 2
    assert torch.allclose(m.running_mean, t.running_mean, atol=1e-6)


def sync_worker(rank, out_dir, how, kind="sync"):
    model = (ngt.convert_sync_batchnorm(make_model(2)) if kind == "sync"
             else ngt.name_layers(make_abn_model(sync=True)))
    torch.manual_seed(20 + rank)
    x = torch.randn(3, 3, 6, 5) * 2 + 1
    g = torch.randn(3, 8, 6, 5)
    ngt.sync_stats(reset=True)
    y, dx = step(model, x, g, how)
    counts = ngt.sync_stats()
    torch.save({"y": y, "dx": dx, "state": state(model), "collectives": counts["collectives"],
                "dw": [p.grad for p in model.parameters()]},
               os.path.join(out_dir, "%s%d.pt" % (how, rank)))


@pytest.mark.parametrize("how,kind", [("reentrant", "sync"), ("non_reentrant", "sync"),
                                      ("non_reentrant", "abn")])
def test_sync_batch_norm_does_not_synchronize_again_in_the_recompute(tmp_path, how, kind):
    if os.environ.get("NORMGRAD_JIT"):
        pytest.skip("the recompute's detection does not depend on the JIT's instruction set")
    plain, ckpt = tmp_path / "plain", tmp_path / "ckpt"
    plain.mkdir()
    ckpt.mkdir()
    ranks.run_ranks(sync_worker, 2, str(plain), ("plain", kind), bound=90)
    ranks.run_ranks(sync_worker, 2, str(ckpt), (how, kind), bound=90)
    for r in range(2):
        a = torch.load(os.path.join(plain, "plain%d.pt" % r))
        b = torch.load(os.path.join(ckpt, "%s%d.pt" % (how, r)))
        assert torch.equal(a["y"], b["y"]) and torch.equal(a["dx"], b["dx"])
        for p0, p1 in zip(a["dw"], b["dw"]):
            assert torch.equal(p0, p1)
        for key in a["state"]:
            assert torch.equal(a["state"][key], b["state"][key]), key
        # 2 layers: forward 3 collectives each (agreement, two sums), backward 2.
        assert a["collectives"] == b["collectives"] == 10


def saved_bytes(model, x):
    """Bytes autograd keeps for the backward of model(x) (outside checkpointed blocks)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = model(x)
    return y, total[0]


@pytest.mark.parametrize("mode", ["plain", "fuse", "inplace_abn"])
def test_convert_checkpoint_blocks(mode):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(5)
    model = torchvision.models.resnet18(num_classes=10)
    kw = {"plain": {}, "fuse": {"fuse": True}, "inplace_abn": {"inplace_abn": True}}[mode]
    reference = ngt.convert(copy.deepcopy(model), **kw)
    source = copy.deepcopy(model)
    params = {id(p) for p in source.parameters()}
    keys = list(source.state_dict())
    ckpt = ngt.convert(source, checkpoint="blocks", **kw)
    assert {id(p) for p in ckpt.parameters()} == params  # the same Parameters
    if mode == "plain":
        assert ckpt is source and list(ckpt.state_dict()) == keys
    else:  # the input is left as it was
        assert ckpt is not source and type(source.layer1[0].bn1) is torch.nn.BatchNorm2d
        assert "forward" not in source.layer1[0].__dict__
    x = torch.randn(4, 3, 32, 32)
    g = torch.randn(4, 10)
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, kept_ref = saved_bytes(reference, xr)
    yc, kept = saved_bytes(ckpt, xc)
    assert kept < kept_ref / 2, (kept, kept_ref)  # the blocks' activations are not kept
    yr.backward(g)
    yc.backward(g)
    tol = 0 if mode == "plain" else 1e-5  # fused modes: the stem is fused only in the reference
    assert (yc - yr).abs().max().item() <= tol * yr.abs().max().item()
    assert (xc.grad - xr.grad).abs().max().item() <= tol * 10 * xr.grad.abs().max().item()
    for (n, a), b in zip(reference.state_dict().items(), ckpt.state_dict().values()):
        if "num_batches_tracked" in n:
            assert int(b) == 1, n  # counted once, though each block ran twice
        elif mode == "plain":
            assert torch.equal(a, b), n


def test_convert_checkpoint_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="expected None or 'blocks'"):
        ngt.convert(torch.nn.Sequential(torch.nn.BatchNorm2d(3)), checkpoint="layers")
    with pytest.raises(ValueError, match="no nn.Sequential stage"):
        ngt.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3)),
                    checkpoint="blocks")


def test_sync_batch_norm_without_a_group_counts_once_too():
    """Without a process group SyncBatchNorm is BatchNorm, checkpoint-aware as it."""
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), ngt.SyncBatchNorm(8))
    x = torch.randn(4, 3, 5, 5)
    for k in range(2):
        step(model, x + k, torch.randn(4, 8, 5, 5), "non_reentrant")
    assert int(model[1].num_batches_tracked) == 2
