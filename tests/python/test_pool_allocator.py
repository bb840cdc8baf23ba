"""torch's CPU allocations from normgrad's caching pool
(normgrad.torch.set_pool_allocator): which tensors the pool serves, that
switching is safe with tensors of either allocator alive, that a training
step computes the same values (against float64 torch), and the refusals."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import normgrad  # noqa: E402
import normgrad.torch as ngt  # noqa: E402

AVAILABLE, WHY = ngt.pool_allocator_available()
needs_allocator = pytest.mark.skipif(not AVAILABLE, reason=WHY)


@pytest.fixture
def pool_allocator():
    normgrad.empty_cache()
    ngt.set_pool_allocator(True)
    try:
        yield
    finally:
        ngt.set_pool_allocator(False)
        normgrad.empty_cache()


@needs_allocator
def test_large_tensors_come_from_the_pool_and_go_back(pool_allocator):
    assert ngt.pool_allocator()
    before = normgrad.memory_stats()["allocated_bytes"]
    big = torch.empty(1 << 20)  # 4 MiB
    small = torch.ones(1000)  # 4 KB: malloc's
    grown = normgrad.memory_stats()["allocated_bytes"] - before
    assert grown == 4 << 20, grown
    big.fill_(2.0)
    assert float(big.sum()) == 2.0 * (1 << 20) and float(small.sum()) == 1000.0
    ngt.set_pool_allocator(False)
    other = torch.empty(1 << 20)  # torch's default allocator again
    assert normgrad.memory_stats()["allocated_bytes"] - before == 4 << 20
    del big  # made by the pool, freed after the switch: back to the pool
    assert normgrad.memory_stats()["allocated_bytes"] == before
    del other, small


@needs_allocator
def test_a_miss_moves_the_pages_freed_blocks_would_give_back(pool_allocator):
    """A training step's backward in small: two 3.25 MiB tensors freed, then a
    6.5 MiB one asked for beyond the peak's slack. The new tensor is their
    pages, moved (it reads what was written to them; fresh pages read zero),
    nothing is given back, and memory_stats() counts the recycled miss."""
    quarter = (3 << 20) + (1 << 18)  # bytes, a size class of its own
    normgrad.reset_peak_memory_stats()
    held = normgrad.memory_stats()["allocated_bytes"]
    if held > (64 << 20):
        pytest.skip("other tests hold %d bytes of the pool: the peak's slack would keep both" % held)
    a = torch.full((quarter // 4,), 1.0)
    b = torch.full((quarter // 4,), 2.0)
    del a, b
    before = normgrad.memory_stats()
    c = torch.empty(quarter // 2)  # 6.5 MiB of float32
    after = normgrad.memory_stats()
    assert after["recycled"] == before["recycled"] + 1, (before, after)
    assert after["released"] == before["released"], (before, after)
    assert {float(c[0]), float(c[-1])} == {1.0, 2.0}
    del c


@needs_allocator
def test_a_training_step_matches_float64(pool_allocator):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32),
                                torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1),
                                torch.nn.BatchNorm2d(32))
    ref = copy.deepcopy(model).double()
    fused = ngt.convert(model, fuse=True)
    x = torch.randn(8, 3, 48, 48)
    g = torch.randn(8, 32, 48, 48)
    grads = {}
    for on in (False, True):
        ngt.set_pool_allocator(on)
        m = copy.deepcopy(fused)
        stats = normgrad.memory_stats()
        before = stats["hits"] + stats["misses"]
        for _ in range(2):
            m.zero_grad()
            m(x).backward(g)
        stats = normgrad.memory_stats()
        # with it on, the convolutions' outputs and gradients (2.25 MiB each)
        # come from the pool too, not only normgrad's own outputs
        calls = stats["hits"] + stats["misses"] - before
        grads[on] = ([p.grad for p in m.parameters()], list(m.buffers()), calls)
    assert grads[True][2] >= grads[False][2] + 8, (grads[True][2], grads[False][2])
    for a, b in zip(grads[True][0] + grads[True][1], grads[False][0] + grads[False][1]):
        assert torch.equal(a, b)  # where the memory came from changes no bit
    for _ in range(2):
        ref.zero_grad()
        ref(x.double()).backward(g.double())
    # The convolutions' biases have a gradient of 0 (a batch norm follows):
    # f32 error there is measured against the model's gradient scale.
    scale = max(float(q.grad.abs().max()) for q in ref.parameters())
    for p, (name, q) in zip(grads[True][0], ref.named_parameters()):
        torch.testing.assert_close(p.double(), q.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
    for b, (name, r) in zip(grads[True][1], ref.named_buffers()):
        torch.testing.assert_close(b.double(), r.double(), rtol=1e-5, atol=1e-6, msg=name)


@needs_allocator
def test_a_forked_child_allocates_from_its_copy_of_the_pool(pool_allocator):
    # A DataLoader's fork workers: the child's tensors come from its copy of
    # the pool (the pool's fork handlers leave it unlocked there).
    import os
    import time
    keep = torch.ones(1 << 20)  # a pooled block alive across the fork
    float((keep * 2).sum())  # torch's OpenMP threads started in the parent
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            # One thread, as DataLoader workers run: libgomp's pool does not
            # survive fork (torch's own parallel ops would hang in the child).
            torch.set_num_threads(1)
            child = torch.full((1 << 20,), 3.0) + keep
            ok = float(child.sum()) == 4.0 * (1 << 20) and ngt.pool_allocator()
        finally:
            os._exit(0 if ok else 1)
    for _ in range(1000):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child did not finish in 10 s")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    del keep


@needs_allocator
def test_a_torch_other_than_the_headers_is_refused(monkeypatch):
    from normgrad import _pool_allocator as pa
    monkeypatch.setattr(pa, "_module", None)
    monkeypatch.setattr(pa, "_why_not", None)
    monkeypatch.setattr(pa._torch, "__version__", "9.1.0")
    with pytest.raises(RuntimeError, match="built against torch .*'s headers, running torch 9.1"):
        ngt.set_pool_allocator(True)
    assert ngt.pool_allocator_available()[0] is False and not ngt.pool_allocator()


def test_refusals():
    with pytest.raises(TypeError, match="on is a bool"):
        ngt.set_pool_allocator("yes")
    if not AVAILABLE:
        with pytest.raises(RuntimeError, match="set_pool_allocator"):
            ngt.set_pool_allocator(True)
        assert not ngt.pool_allocator()


@needs_allocator
def test_bench_torch_alloc_and_limit_configurations(bench_memory, tmp_path):
    """bench_torch --memory's -alloc suffix serves torch's tensors from the
    pool in that child (far more pool calls than normgrad's outputs alone
    make, here under the -limit policy); --model --pool-allocator times torch
    and each normgrad mode with it; bad configurations are refused."""
    import json
    import subprocess
    import sys
    rows = {k: r["pool"] for k, r in bench_memory(["torch", "torch-alloc", "normgrad-limit",
                                                   "normgrad-alloc"]).items()}
    calls = {k: p["hits"] + p["misses"] for k, p in rows.items()}
    assert calls["torch"] == 0 and calls["torch-alloc"] > 0, calls
    assert calls["normgrad-alloc"] > 2 * calls["normgrad-limit"], calls
    p = rows["normgrad-alloc"]  # the default policy: within the peak and a sixteenth
    assert p["cached_bytes"] <= p["peak_allocated_bytes"] * 17 // 16, p
    out = tmp_path / "step.json"
    subprocess.run([sys.executable, "-m", "normgrad.bench_torch", "--model", "resnet18", "--batch",
                    "4", "--size", "64", "--steps", "1", "--layouts", "NCHW",
                    "--pool-allocator", "--json", str(out)], check=True, capture_output=True)
    row = json.loads(out.read_text())["model"][0]
    assert row["torch_alloc_ms"] > 0 and row["normgrad_alloc_ms"] > 0, row
    for bad in (["--memory", "--configs", "torch,torch-nopool"],
                ["--memory", "--configs", "torch,normgrad-alloc-limit"],
                ["--memory", "--repeats", "0"]):
        r = subprocess.run([sys.executable, "-m", "normgrad.bench_torch"] + bad,
                           capture_output=True, text=True)
        assert r.returncode == 2 and "error" in r.stderr, r.stderr
