"""normgrad.torch.SyncBatchNorm over two processes (gloo on loopback): each
process holds half the batch (an uneven split); its slice of the input
gradient equals the single-process full-batch gradient, and the processes'
parameter gradients sum to the full-batch ones (torch.nn.SyncBatchNorm's
convention: local parameter gradients, reduced by data parallelism)."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: SyncBatchNorm is not tested")
import torch.distributed as dist  # noqa: E402

import ranks  # noqa: E402

SPLIT = (3, 4)  # the batch of 7, unevenly


def finish():
    """Both processes past their last collective before either leaves: gloo
    aborts a process (std::terminate on a joinable thread) when one side tears
    its pairs down while the other still has a receive pending."""
    dist.barrier()


def full_problem(channels_last):
    torch.manual_seed(11)
    x = torch.randn(sum(SPLIT), 6, 5, 5)
    g = torch.randn(sum(SPLIT), 6, 5, 5)
    if channels_last:
        x, g = (t.contiguous(memory_format=torch.channels_last) for t in (x, g))
    w = torch.rand(6) + 0.5
    b = torch.rand(6) - 0.5
    return x, g, w, b


def worker(rank, out_dir, channels_last):
    import normgrad.torch as ngt
    try:
        x, g, w, b = full_problem(channels_last)
        lo = sum(SPLIT[:rank])
        xs = x[lo:lo + SPLIT[rank]].clone().requires_grad_()
        model = ngt.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm2d(6)))
        with torch.no_grad():
            model[0].weight.copy_(w)
            model[0].bias.copy_(b)
        y = model(xs)
        y.backward(g[lo:lo + SPLIT[rank]])
        torch.save({"y": y.detach(), "dx": xs.grad, "dw": model[0].weight.grad,
                    "db": model[0].bias.grad, "rm": model[0].running_mean,
                    "rv": model[0].running_var},
                   os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        finish()


def rel(a, b):
    b = b.double()
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("channels_last", [False, True])
def test_two_processes_equal_the_full_batch(channels_last):
    with tempfile.TemporaryDirectory() as d:
        ranks.run_ranks(worker, 2, d, (channels_last,))
        r = [torch.load(os.path.join(d, "rank%d.pt" % k)) for k in range(2)]
    x, g, w, b = full_problem(channels_last)
    ref = torch.nn.BatchNorm2d(6).double()
    with torch.no_grad():
        ref.weight.copy_(w.double())
        ref.bias.copy_(b.double())
    xr = x.double().contiguous().requires_grad_()
    y = ref(xr)
    y.backward(g.double())
    assert rel(torch.cat([r[0]["y"], r[1]["y"]]), y) < 2e-6
    assert rel(torch.cat([r[0]["dx"], r[1]["dx"]]), xr.grad) < 2e-6
    assert rel(r[0]["dw"] + r[1]["dw"], ref.weight.grad) < 1e-5
    assert rel(r[0]["db"] + r[1]["db"], ref.bias.grad) < 1e-5
    for k in range(2):  # statistics are the full batch's on both processes
        assert rel(r[k]["rm"], ref.running_mean) < 1e-5
        assert rel(r[k]["rv"], ref.running_var) < 1e-5


def abn_worker(rank, out_dir, channels_last):
    import normgrad.torch as ngt
    try:
        x, g, w, b = full_problem(channels_last)
        lo = sum(SPLIT[:rank])
        leaf = x[lo:lo + SPLIT[rank]].clone().requires_grad_()
        m = ngt.InPlaceABNSync(6, activation_param=0.1)
        with torch.no_grad():
            m.weight.copy_(w - 1.0)  # some negative: the scale is |w| + eps
            m.bias.copy_(b)
        xs = leaf * 1
        y = m(xs)
        assert y.data_ptr() == xs.data_ptr()
        y.backward(g[lo:lo + SPLIT[rank]])
        torch.save({"y": y.detach(), "dx": leaf.grad, "dw": m.weight.grad, "db": m.bias.grad,
                    "rm": m.running_mean, "rv": m.running_var},
                   os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        finish()


@pytest.mark.parametrize("channels_last", [False, True])
def test_inplace_abn_sync_two_processes_equal_the_full_batch(channels_last):
    import torch.nn.functional as F
    with tempfile.TemporaryDirectory() as d:
        ranks.run_ranks(abn_worker, 2, d, (channels_last,))
        r = [torch.load(os.path.join(d, "rank%d.pt" % k)) for k in range(2)]
    x, g, w, b = full_problem(channels_last)
    w64 = (w - 1.0).double().requires_grad_()
    b64 = b.double().requires_grad_()
    xr = x.double().contiguous().requires_grad_()
    y = F.leaky_relu(F.batch_norm(xr, None, None, w64.abs() + 1e-5, b64, True, 0.0, 1e-5), 0.1)
    y.backward(g.double())
    assert rel(torch.cat([r[0]["y"], r[1]["y"]]), y) < 2e-6
    assert rel(torch.cat([r[0]["dx"], r[1]["dx"]]), xr.grad) < 1e-5
    assert rel(r[0]["dw"] + r[1]["dw"], w64.grad) < 1e-5
    assert rel(r[0]["db"] + r[1]["db"], b64.grad) < 1e-5
    # Both processes keep the same running statistics, torch's (momentum 0.1, unbiased).
    t = torch.nn.BatchNorm2d(6).double()
    t(x.double())
    assert torch.allclose(r[0]["rm"].double(), t.running_mean, atol=1e-6)
    assert torch.allclose(r[1]["rv"].double(), t.running_var, rtol=1e-5)


# --- statistics merged exactly: data far from zero, any split ---------------------


def offset_problem(total, channels_last=False):
    torch.manual_seed(12)
    x = 2 * torch.randn(total, 5, 4, 3) + 1e4  # 1e4 sigma-scale offsets cancel in E[x^2] - E[x]^2
    g = torch.randn(total, 5, 4, 3)
    if channels_last:
        x, g = (t.contiguous(memory_format=torch.channels_last) for t in (x, g))
    return x, g, torch.rand(5) + 0.5, torch.rand(5) - 0.5


def offset_worker(rank, out_dir, split, channels_last):
    import normgrad.torch as ngt
    try:
        x, g, w, b = offset_problem(sum(split), channels_last)
        lo = sum(split[:rank])
        out = {}
        for run in range(2):  # the same bits on every run
            xs = x[lo:lo + split[rank]].clone().requires_grad_()
            m = ngt.SyncBatchNorm(5)
            with torch.no_grad():
                m.weight.copy_(w)
                m.bias.copy_(b)
            y = m(xs)
            y.backward(g[lo:lo + split[rank]])
            out[run] = {"y": y.detach(), "dx": xs.grad, "dw": m.weight.grad, "db": m.bias.grad,
                        "rm": m.running_mean.clone(), "rv": m.running_var.clone()}
        torch.save(out, os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        finish()


@pytest.mark.parametrize("split,channels_last", [((4, 4), False), ((7, 2), False),
                                                 ((6, 0), False), ((5, 3), False),
                                                 ((3, 6), True)])
def test_offset_data_any_split_equals_the_full_batch(split, channels_last):
    with tempfile.TemporaryDirectory() as d:
        ranks.run_ranks(offset_worker, 2, d, (split, channels_last,))
        r = [torch.load(os.path.join(d, "rank%d.pt" % k)) for k in range(2)]
    x, g, w, b = offset_problem(sum(split), channels_last)
    ref = torch.nn.BatchNorm2d(5).double()
    with torch.no_grad():
        ref.weight.copy_(w.double())
        ref.bias.copy_(b.double())
    xr = x.double().contiguous().requires_grad_()
    y = ref(xr)
    y.backward(g.double())
    runs = [[r[k][run] for k in range(2)] for run in range(2)]
    for a, b2 in zip(*runs):  # the same bits on every run
        for key in a:
            if a[key] is not None:
                assert torch.equal(a[key], b2[key]), key
    p = runs[0]
    assert rel(torch.cat([p[0]["y"], p[1]["y"]]), y) < 1e-5
    assert rel(torch.cat([p[0]["dx"], p[1]["dx"]]), xr.grad) < 1e-5
    assert rel(p[0]["dw"] + p[1]["dw"], ref.weight.grad) < 1e-5
    assert rel(p[0]["db"] + p[1]["db"], ref.bias.grad) < 1e-5
    for k in range(2):  # the group's statistics, the same bits on both processes
        assert torch.equal(p[k]["rm"], p[0]["rm"]) and torch.equal(p[k]["rv"], p[0]["rv"])
        assert rel(p[k]["rm"], ref.running_mean) < 1e-6
        assert rel(p[k]["rv"], ref.running_var) < 1e-6  # unbiased over the whole batch


def empty_worker(rank, out_dir):
    import normgrad
    import normgrad.torch as ngt
    try:
        m = ngt.SyncBatchNorm(3)
        try:
            m(torch.randn(0, 3, 2, 2))
            msg = "no error"
        except normgrad.Error as e:
            msg = str(e)
        torch.save(msg, os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        finish()


def test_every_rank_empty_is_a_clear_error_on_every_rank():
    with tempfile.TemporaryDirectory() as d:
        ranks.run_ranks(empty_worker, 2, d)
        msgs = [torch.load(os.path.join(d, "rank%d.pt" % k)) for k in range(2)]
    for msg in msgs:
        assert "every process's batch is empty" in msg, msg


def abn_offset_worker(rank, out_dir):
    import normgrad.torch as ngt
    try:
        x, g, w, b = offset_problem(8)
        split = (5, 3)
        lo = sum(split[:rank])
        leaf = x[lo:lo + split[rank]].clone().requires_grad_()
        m = ngt.InPlaceABNSync(5, activation_param=0.1)
        with torch.no_grad():
            m.weight.copy_(w)
            m.bias.copy_(b)
        y = m(leaf * 1)
        y.backward(g[lo:lo + split[rank]])
        torch.save({"y": y.detach(), "dx": leaf.grad, "rm": m.running_mean, "rv": m.running_var},
                   os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        finish()


def test_inplace_abn_sync_offset_data_equals_the_full_batch():
    import torch.nn.functional as F
    with tempfile.TemporaryDirectory() as d:
        ranks.run_ranks(abn_offset_worker, 2, d)
        r = [torch.load(os.path.join(d, "rank%d.pt" % k)) for k in range(2)]
    x, g, w, b = offset_problem(8)
    xr = x.double().requires_grad_()
    y = F.leaky_relu(F.batch_norm(xr, None, None, w.double().abs() + 1e-5, b.double(), True,
                                  0.0, 1e-5), 0.1)
    y.backward(g.double())
    assert rel(torch.cat([r[0]["y"], r[1]["y"]]), y) < 1e-5
    assert rel(torch.cat([r[0]["dx"], r[1]["dx"]]), xr.grad) < 1e-5
    t = torch.nn.BatchNorm2d(5).double()
    t(x.double())
    assert rel(r[0]["rm"], t.running_mean) < 1e-6 and rel(r[1]["rv"], t.running_var) < 1e-6


def test_sync_bench_runs_every_configuration(tmp_path):
    """bench_torch --sync on a small ResNet-18 at 2 processes: the
    SyncBatchNorm and BatchNorm steps run and are reported with the
    collectives counted (times are not judged here: the host is shared).
    ResNet-18 has 20 batch norms: 3 collectives in each forward (the
    agreement and two sums) and 2 in each backward."""
    pytest.importorskip("torchvision")
    import json
    import subprocess
    import sys
    out = tmp_path / "sync.json"
    subprocess.run([sys.executable, "-m", "normgrad.bench_torch", "--sync", "--model", "resnet18",
                    "--batch", "4", "--size", "32", "--steps", "1", "--layouts", "channels_last",
                    "--procs", "2", "--json", str(out)], check=True, capture_output=True,
                   timeout=600)
    rows = json.loads(out.read_text())["sync"]
    assert len(rows) == 1 and rows[0]["layout"] == "channels_last" and rows[0]["processes"] == 2
    for key in ("sync_ms", "bn_ms", "alpha_us", "model_ms"):
        assert rows[0][key] > 0
    assert rows[0]["collectives_per_step"] == 20 * 5
    # Per layer of C channels: agreement 19 doubles twice, C + 2 and C + 1
    # in the forward's sums, 2C + 2 in the backward's.
    widths = [64] * 5 + [128] * 5 + [256] * 5 + [512] * 5
    assert rows[0]["bytes_per_step"] == 8 * sum(2 * 19 + 4 * c + 5 for c in widths)


def subgroup_worker(rank, out_dir):
    """4 processes in 2 groups of 2 ({0, 1} and {2, 3}); each group's data
    differs, and each normalises over its own group only."""
    import normgrad.torch as ngt
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes both
    mine = groups[rank // 2]
    x, g, w, b = full_problem(False)
    x = x + 3.0 * (rank // 2)  # the second group's data is shifted
    lo = sum(SPLIT[:rank % 2])
    xs = x[lo:lo + SPLIT[rank % 2]].clone().requires_grad_()
    model = ngt.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm2d(6)),
                                       process_group=mine)
    abn = ngt.InPlaceABNSync(6, activation="identity", group=mine)
    with torch.no_grad():
        model[0].weight.copy_(w)
        model[0].bias.copy_(b)
    y = model(xs)
    y.backward(g[lo:lo + SPLIT[rank % 2]])
    y2 = abn(xs.detach().clone())
    torch.save({"y": y.detach(), "dx": xs.grad, "rm": model[0].running_mean, "y_abn": y2.detach()},
               os.path.join(out_dir, "rank%d.pt" % rank))
    dist.barrier()


def test_subgroups_each_normalise_over_their_own_group(tmp_path):
    ranks.run_ranks(subgroup_worker, 4, str(tmp_path), bound=120)
    r = [torch.load(os.path.join(tmp_path, "rank%d.pt" % k)) for k in range(4)]
    x, g, w, b = full_problem(False)
    for grp in range(2):
        xr = (x + 3.0 * grp).double().requires_grad_()
        ref = torch.nn.BatchNorm2d(6).double()
        with torch.no_grad():
            ref.weight.copy_(w)
            ref.bias.copy_(b)
        y = ref(xr)
        y.backward(g.double())
        mine = r[2 * grp:2 * grp + 2]
        assert rel(torch.cat([mine[0]["y"], mine[1]["y"]]), y) < 1e-5
        assert rel(torch.cat([mine[0]["dx"], mine[1]["dx"]]), xr.grad) < 1e-5
        assert rel(mine[0]["rm"], ref.running_mean) < 1e-6
        plain = torch.nn.functional.batch_norm(x.double() + 3.0 * grp, None, None, training=True)
        # InPlaceABN scales by |weight| + eps = 1 + 1e-5.
        assert rel(torch.cat([mine[0]["y_abn"], mine[1]["y_abn"]]), plain * (1 + 1e-5)) < 1e-6
    # The groups' statistics differ (the shift), so neither saw the other's data.
    assert not torch.allclose(r[0]["rm"], r[2]["rm"])
