"""Runs a function on several local processes joined in one gloo process
group: normgrad's multi-process runner, which its tests, `bench_torch --sync`
and examples/python/sync_batch_norm.py all use.

    import normgrad.ranks

    def work(rank, workdir, steps):
        ...                         # torch.distributed is initialized here
        dist.barrier()              # if the peers still need this rank
        return {"loss": loss}       # JSON-able, or None

    results = normgrad.ranks.run_ranks(work, 2, args=(10,))  # one per rank

Rendezvous: gloo over loopback, meeting through a file in the run's working
directory (no TCP port to pick, or to lose to another process); collectives
give up after `timeout` seconds (the process group's timeout).

Teardown: a rank leaves as soon as its function returns or raises, with
os._exit, after writing what it returned. It never touches the group again,
so it neither waits at exit for an operation a failed peer left pending nor
runs the interpreter's teardown, where torch 1.13's DistributedDataParallel
Reducer can deadlock freeing tensors while gloo's threads run. A function
whose peers still need it (their collectives read its data) ends with
dist.barrier().

The parent waits at most `bound` seconds, kills the ranks still running and
raises RanksError; it also raises RanksError when a rank raised, with that
rank's traceback.
"""
import datetime
import json
import os
import tempfile
import time
import traceback

__all__ = ["RanksError", "error_report", "init", "report", "run_ranks"]


class RanksError(RuntimeError):
    """A rank raised, or was still running past the bound."""


def init(rank, world, workdir, timeout=60.0):
    """The rendezvous: gloo over `world` processes, through a file in workdir."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + os.path.join(workdir, "rendezvous"),
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))


def report(workdir, rank, result):
    """Writes rank `rank`'s result (JSON-able) where run_ranks reads it."""
    path = os.path.join(workdir, "rank%d.json" % rank)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)  # whole or absent, whenever the parent looks


def error_report(e, t0):
    """What a rank saw raised: its class and bases, message, and the seconds
    since t0 (time.monotonic())."""
    return {"class": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "msg": str(e), "seconds": time.monotonic() - t0}


def _entry(rank, fn, world, workdir, timeout, args):
    try:
        init(rank, world, workdir, timeout)
        result = fn(rank, workdir, *args)
        if result is not None:
            report(workdir, rank, result)
    except BaseException:
        report(workdir, rank, {"unexpected": traceback.format_exc()})
    finally:
        os._exit(0)


def _run(fn, world, args, workdir, timeout, bound):
    import torch.multiprocessing as mp
    ctx = mp.start_processes(_entry, args=(fn, world, workdir, timeout, args), nprocs=world,
                             join=False, start_method="spawn")
    deadline = None if bound is None else time.monotonic() + bound
    for p in ctx.processes:
        p.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
    for r in alive:
        ctx.processes[r].kill()
        ctx.processes[r].join()
    results = []
    for r in range(world):
        path = os.path.join(workdir, "rank%d.json" % r)
        results.append(json.load(open(path)) if os.path.exists(path) else None)
    if alive:
        raise RanksError("ranks %s still running after %.0f s (killed); results: %s"
                         % (alive, bound, results))
    for r, res in enumerate(results):
        if isinstance(res, dict) and "unexpected" in res:
            raise RanksError("rank %d raised:\n%s" % (r, res["unexpected"]))
    return results


def run_ranks(fn, world, args=(), workdir=None, timeout=60.0, bound=None):
    """Runs fn(rank, workdir, *args) on `world` spawned processes, each in the
    process group; returns what each returned (None for a rank that returned
    None or wrote nothing). fn must be importable (a module-level function).
    workdir (default: a fresh temporary directory, removed afterwards) holds
    the rendezvous file and the results; fn may write its own files there."""
    if world < 1:
        raise ValueError("run_ranks: world must be at least 1, got %r" % (world,))
    if workdir is not None:
        return _run(fn, world, tuple(args), str(workdir), timeout, bound)
    with tempfile.TemporaryDirectory() as d:
        return _run(fn, world, tuple(args), d, timeout, bound)
