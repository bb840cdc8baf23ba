"""How synchronized batch norms fail over 2 and 3 gloo processes: one rank
with a bad input, a rank that exits, one that raises in its own code, one
that skips a backward. Every case must end on every live rank within its
bound, with an error that names the layer, the failing rank and the rule
(or the collective); none may hang."""
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: SyncBatchNorm is not tested")
import torch.distributed as dist  # noqa: E402

import ranks  # noqa: E402

if os.environ.get("NORMGRAD_JIT"):
    pytest.skip("how ranks fail does not depend on the JIT's instruction set: these run once, "
                "on the host's own path (NORMGRAD_JIT unset)", allow_module_level=True)

C = 8


def make_layer(kind, eps=1e-5):
    import normgrad.torch as ngt
    if kind == "sync":
        model = torch.nn.Sequential(torch.nn.Conv2d(3, C, 1), torch.nn.BatchNorm2d(C, eps=eps))
        return ngt.convert_sync_batchnorm(model)
    return ngt.name_layers(torch.nn.Sequential(torch.nn.Conv2d(3, C, 1),
                                               ngt.InPlaceABNSync(C, eps=eps)))


def step(model, x):
    model(x).sum().backward()


def bad_inputs_worker(rank, out_dir, world, kind):
    """The bad rank (the last) runs, in turn: 16 channels into the layer, a
    bf16 input, a layer built with another eps, and a step whose backward it
    skips (it logs its own error and goes on to the next step). After each
    case every rank is still in step, so the next runs on the same group;
    a last good step shows the group is still usable."""
    import normgrad.torch as ngt
    bad = rank == world - 1
    torch.manual_seed(rank)
    out = {}
    model = make_layer(kind)
    cases = ["channels", "dtype", "eps", "skipped_backward", "good"]
    for case in cases:
        t0 = time.monotonic()
        try:
            if case == "channels":
                if bad:
                    m = model[1]  # 16 channels reach the layer built for 8
                    m(torch.randn(4, 2 * C, 5, 5))
                else:
                    step(model, torch.randn(4, 3, 5, 5))
            elif case == "dtype":
                x = torch.randn(4, 3, 5, 5)
                if bad:
                    model[1](model[0](x).detach().bfloat16())
                else:
                    model[1](model[0](x).detach())
            elif case == "eps":
                m = make_layer(kind, eps=1e-3 if bad else 1e-5)
                step(m, torch.randn(4, 3, 5, 5))
            elif case == "skipped_backward":
                y = model(torch.randn(4, 3, 5, 5))
                if bad:  # its own code fails after the forward: it logs and goes on
                    try:
                        raise ValueError("a user's loss function failed")
                    except ValueError:
                        pass
                    step(model, torch.randn(4, 3, 5, 5))  # the next step's forward
                else:
                    y.sum().backward()
            else:
                step(model, torch.randn(4, 3, 5, 5))
            out[case] = {"class": None, "seconds": time.monotonic() - t0}
        except Exception as e:
            out[case] = ranks.error_report(e, t0)
    ranks.report(out_dir, rank, out)


@pytest.mark.parametrize("kind", ["sync", "abn"])
@pytest.mark.parametrize("world", [2, 3])
def test_a_bad_input_on_one_rank_is_an_error_on_every_rank(tmp_path, world, kind):
    reps = ranks.run_ranks(bad_inputs_worker, world, str(tmp_path), (world, kind), bound=120)
    name = "SyncBatchNorm" if kind == "sync" else "InPlaceABNSync"
    bad = world - 1
    for r, rep in enumerate(reps):
        assert rep is not None, "rank %d wrote no report" % r
        for case in ("channels", "dtype", "eps", "skipped_backward"):
            e = rep[case]
            assert e["class"] is not None, "rank %d, %s: no error" % (r, case)
            assert "Error" in e["mro"], (r, case, e)  # a normgrad.Error
            assert e["seconds"] < 30, (r, case, e)
            assert "'1'" in e["msg"] and name in e["msg"], (r, case, e["msg"])  # the layer
            assert "rank %d of %d" % (r, world) in e["msg"], (r, case, e["msg"])
        if r != bad:
            assert rep["channels"]["class"] == "SyncError"
            assert "rank %d failed its checks" % bad in rep["channels"]["msg"]
            assert "input.shape[1] == num_features" in rep["channels"]["msg"]
        else:
            assert "has 16 channels" in rep["channels"]["msg"]
        assert "disagree on dtype" in rep["dtype"]["msg"], rep["dtype"]["msg"]
        assert "torch.bfloat16" in rep["dtype"]["msg"]
        assert "disagree on eps" in rep["eps"]["msg"] and "0.001" in rep["eps"]["msg"]
        assert "different layers or phases" in rep["skipped_backward"]["msg"]
        assert "backward" in rep["skipped_backward"]["msg"]
        assert rep["good"]["class"] is None, rep["good"]


def exit_worker(rank, out_dir, world, when, kind):
    """The last rank leaves (os._exit) before the forward or between the
    forward and the backward; the others run the step."""
    model = make_layer(kind)
    bad = rank == world - 1
    if bad and when == "before_forward":
        os._exit(0)
    t0 = time.monotonic()
    try:
        y = model(torch.randn(4, 3, 5, 5))
        if bad:
            os._exit(0)
        y.sum().backward()
        ranks.report(out_dir, rank, {"class": None})
    except Exception as e:
        ranks.report(out_dir, rank, ranks.error_report(e, t0))


@pytest.mark.parametrize("when", ["before_forward", "between_forward_and_backward"])
@pytest.mark.parametrize("world,kind", [(2, "sync"), (3, "sync"), (2, "abn")])
def test_a_rank_that_exits_is_an_error_on_the_others(tmp_path, world, kind, when):
    reps = ranks.run_ranks(exit_worker, world, str(tmp_path), (world, when, kind), bound=90)
    phase = "forward" if when == "before_forward" else "backward"
    name = "SyncBatchNorm" if kind == "sync" else "InPlaceABNSync"
    for r, rep in enumerate(reps[:-1]):
        assert rep is not None and rep["class"] == "SyncError", (r, rep)
        assert "Error" in rep["mro"]
        assert "%s '1' (%s, rank %d of %d)" % (name, phase, r, world) in rep["msg"], rep
        assert "did not complete" in rep["msg"], rep
        assert rep["seconds"] < 30, rep  # gloo sees the connection close
    assert reps[-1] is None


def raise_worker(rank, out_dir, world, kind, stay=10):
    """The last rank's own code raises after the forward; it catches the
    error and stays alive without taking part (a loop that logs and waits)."""
    model = make_layer(kind)
    t0 = time.monotonic()
    try:
        y = model(torch.randn(4, 3, 5, 5))
        if rank == world - 1:
            try:
                raise RuntimeError("the user's code failed")
            except RuntimeError:
                time.sleep(stay)
                return
        t0 = time.monotonic()
        y.sum().backward()
        ranks.report(out_dir, rank, {"class": None})
    except Exception as e:
        ranks.report(out_dir, rank, ranks.error_report(e, t0))


@pytest.mark.parametrize("world,kind", [(2, "sync"), (3, "sync"), (2, "abn")])
def test_a_rank_that_raises_in_its_own_code_ends_the_others_within_the_group_timeout(
        tmp_path, world, kind):
    reps = ranks.run_ranks(raise_worker, world, str(tmp_path), (world, kind), bound=60,
                           timeout=6)
    for r, rep in enumerate(reps[:-1]):
        assert rep is not None and rep["class"] == "SyncError", (r, rep)
        assert "(backward, rank %d of %d)" % (r, world) in rep["msg"], rep
        assert "the all_reduce of" in rep["msg"] and "the process group's timeout" in rep["msg"]
        assert rep["seconds"] < 6 + 15, rep


def test_normgrad_s_own_timeout_bounds_a_collective(tmp_path, monkeypatch):
    """NORMGRAD_COLLECTIVE_TIMEOUT shorter than the group's (60 s) ends the wait."""
    monkeypatch.setenv("NORMGRAD_COLLECTIVE_TIMEOUT", "2")
    reps = ranks.run_ranks(raise_worker, 2, str(tmp_path), (2, "sync"), bound=120, timeout=60)
    rep = reps[0]
    assert rep is not None and rep["class"] == "SyncError", rep
    assert "NORMGRAD_COLLECTIVE_TIMEOUT=2s" in rep["msg"], rep
    assert rep["seconds"] < 15, rep


def test_collective_timeout_setting():
    import normgrad.torch as ngt
    assert ngt.collective_timeout() is None or "NORMGRAD_COLLECTIVE_TIMEOUT" in os.environ
    ngt.set_collective_timeout(5)
    try:
        assert ngt.collective_timeout() == 5.0
    finally:
        ngt.set_collective_timeout(None)
    for bad in (0, -1, "5", float("nan")):
        with pytest.raises(ValueError, match="seconds > 0"):
            ngt.set_collective_timeout(bad)
