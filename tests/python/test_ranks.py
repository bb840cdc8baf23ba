"""normgrad.ranks, the multi-process runner: results come back per rank, a
rank that raises or hangs is an error naming it, and bad arguments are refused."""
import os
import time

import pytest

if os.environ.get("NORMGRAD_JIT"):
    pytest.skip("the runner does not depend on the JIT's ISA: it runs once, on the host's own "
                "path (NORMGRAD_JIT unset)", allow_module_level=True)
torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import normgrad.ranks as ranks  # noqa: E402


def summing(rank, workdir, base):
    t = torch.tensor([float(base + rank)], dtype=torch.float64)
    dist.all_reduce(t)
    dist.barrier()
    return {"rank": rank, "sum": t.item(), "files": sorted(os.listdir(workdir))}


def failing(rank, workdir):
    if rank == 1:
        raise ValueError("rank one's own error")
    return {"rank": rank}


def hanging(rank, workdir):
    if rank == 0:
        time.sleep(600)
    return {"rank": rank}


def test_results_come_back_per_rank():
    out = ranks.run_ranks(summing, 3, args=(10,), bound=120)
    assert [r["rank"] for r in out] == [0, 1, 2]
    assert all(r["sum"] == 10 + 11 + 12 for r in out)  # closed form: the all_reduce ran
    assert all("rendezvous" in r["files"] for r in out)


def test_a_rank_that_raises_is_named_with_its_traceback(tmp_path):
    with pytest.raises(ranks.RanksError, match="rank 1 raised") as e:
        ranks.run_ranks(failing, 2, workdir=tmp_path, bound=120)
    assert "rank one's own error" in str(e.value)


def test_a_rank_past_the_bound_is_killed_and_named():
    t0 = time.monotonic()
    with pytest.raises(ranks.RanksError, match=r"ranks \[0\] still running after 20 s"):
        ranks.run_ranks(hanging, 2, bound=20)
    assert time.monotonic() - t0 < 60


def test_world_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        ranks.run_ranks(summing, 0)
