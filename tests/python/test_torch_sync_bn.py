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
import torch.multiprocessing as mp  # noqa: E402

SPLIT = (3, 4)  # the batch of 7, unevenly


def init(rank, out_dir):
    """gloo over two processes, meeting through a file (no TCP port to pick and lose)."""
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out_dir, "rendezvous"),
                            rank=rank, world_size=2)


def finish():
    """Both processes past their last collective before the group goes: gloo
    aborts a process (std::terminate on a joinable thread) when one side tears
    its pairs down while the other still has a receive pending."""
    dist.barrier()
    dist.destroy_process_group()


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
    init(rank, out_dir)
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
        mp.spawn(worker, args=(d, channels_last), nprocs=2, join=True)
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
    init(rank, out_dir)
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
        mp.spawn(abn_worker, args=(d, channels_last), nprocs=2, join=True)
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
    init(rank, out_dir)
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
        mp.spawn(offset_worker, args=(d, split, channels_last), nprocs=2, join=True)
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
    init(rank, out_dir)
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
        mp.spawn(empty_worker, args=(d,), nprocs=2, join=True)
        msgs = [torch.load(os.path.join(d, "rank%d.pt" % k)) for k in range(2)]
    for msg in msgs:
        assert "every process's batch is empty" in msg, msg


def abn_offset_worker(rank, out_dir):
    import normgrad.torch as ngt
    init(rank, out_dir)
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
        mp.spawn(abn_offset_worker, args=(d,), nprocs=2, join=True)
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
    """bench_torch --sync on a small ResNet-18: the 2-process SyncBatchNorm
    step, the 1-process one and torch's all run and are reported (times are
    not judged here: the host is shared)."""
    pytest.importorskip("torchvision")
    import json
    import subprocess
    import sys
    out = tmp_path / "sync.json"
    subprocess.run([sys.executable, "-m", "normgrad.bench_torch", "--sync", "--model", "resnet18",
                    "--batch", "4", "--size", "32", "--steps", "1", "--layouts", "channels_last",
                    "--json", str(out)], check=True, capture_output=True, timeout=600)
    rows = json.loads(out.read_text())["sync"]
    assert len(rows) == 1 and rows[0]["layout"] == "channels_last"
    for key in ("sync_2proc_ms", "sync_1proc_ms", "torch_1proc_ms"):
        assert rows[0][key] > 0
