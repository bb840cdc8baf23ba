"""Multi-process tests under a wall-clock bound, through normgrad.ranks (the
package's one runner: gloo on loopback meeting through a file, each rank
leaving with os._exit once its function returns). A test fails in seconds
when a rank hangs, instead of holding the pytest run until ctest's limit.
Ranks report what they saw as JSON the test reads."""
import pytest

import normgrad.ranks as _ranks

error_report = _ranks.error_report
report = _ranks.report


def run_ranks(fn, world, out_dir, args=(), bound=90.0, timeout=60.0):
    """Runs fn(rank, out_dir, *args) on `world` processes in one process group
    (collectives give up after `timeout` s); returns the ranks' reports (None
    for a rank that wrote none). Fails the test when a rank raised, or is
    still running after `bound` seconds (they are killed first)."""
    try:
        return _ranks.run_ranks(fn, world, args, workdir=out_dir, timeout=timeout, bound=bound)
    except _ranks.RanksError as e:
        pytest.fail(str(e))
