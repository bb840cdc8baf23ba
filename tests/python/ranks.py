"""Multi-process tests under a wall-clock bound: each runs its ranks as
spawned processes (gloo on loopback, meeting through a file) and fails in
seconds when one hangs, instead of holding the pytest run until ctest's
limit. Ranks report what they saw as JSON files the test reads."""
import datetime
import json
import os
import time
import traceback

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp


def init(rank, world, out_dir, timeout_s=60):
    """gloo over `world` processes, meeting through a file in out_dir (no TCP
    port to pick and lose); collectives give up after timeout_s."""
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out_dir, "rendezvous"),
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def report(out_dir, rank, result):
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)


def error_report(e, t0):
    """What a rank saw raised: its class and bases, message and when."""
    return {"class": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "msg": str(e), "seconds": time.monotonic() - t0}


def _entry(rank, fn, out_dir, args):
    try:
        fn(rank, out_dir, *args)
    except BaseException:
        report(out_dir, rank, {"unexpected": traceback.format_exc()})
    finally:
        # Leave at once: a process whose group has a pending operation would
        # otherwise wait in its exit for the group's timeout.
        os._exit(0)


def run_ranks(fn, world, out_dir, args=(), bound=90.0):
    """Runs fn(rank, out_dir, *args) on `world` processes; returns the ranks'
    reports (None for a rank that wrote none). Fails the test when a process
    is still running after `bound` seconds (they are killed first)."""
    ctx = mp.start_processes(_entry, args=(fn, out_dir, args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + bound
    for p in ctx.processes:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
    for r in alive:
        ctx.processes[r].kill()
        ctx.processes[r].join()
    reports = []
    for r in range(world):
        path = os.path.join(out_dir, "rank%d.json" % r)
        reports.append(json.load(open(path)) if os.path.exists(path) else None)
    if alive:
        pytest.fail("ranks %s still running after %.0f s (killed); reports: %s"
                    % (alive, bound, reports))
    for r, rep in enumerate(reports):
        if isinstance(rep, dict) and "unexpected" in rep:
            pytest.fail("rank %d raised:\n%s" % (r, rep["unexpected"]))
    return reports
