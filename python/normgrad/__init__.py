"""normgrad: a batch-norm-backward graph compiler, from Python.

Build graphs (``Graph``, ``Op``, ``LogicalTensor``) or load oneDNN-format JSON
(``load_graph``), ``compile`` them and ``execute`` on NumPy arrays or PyTorch
CPU tensors, borrowed without copies; or ``partition`` a graph normgrad runs
only in part and compile and execute its supported partitions one by one.
``normgrad.torch`` has drop-in BatchNorm modules that run here. Outputs
normgrad.torch allocates come from a caching pool (``memory_stats()`` reports
it, ``empty_cache()`` releases it, ``set_cache_policy()`` says what it keeps), or, with ``set_heap_retention()``, up to
32 MiB from torch's allocator over a heap glibc keeps.
"""
import ctypes as _ctypes
import glob as _glob
import os as _os

# A pip-installed package carries the C++ library beside the extension
# (setup.py): load it first, so the extension finds it by its soname without
# LD_LIBRARY_PATH. A CMake build or install finds it through its RPATH.
for _lib in _glob.glob(_os.path.join(_os.path.dirname(__file__), "libnormgrad.so.*")):
    _ctypes.CDLL(_lib, mode=_ctypes.RTLD_GLOBAL)

from ._normgrad import (  # noqa: E402  # noqa: F401
    CompiledGraph,
    CompiledPartition,
    Error,
    Graph,
    GraphPartition,
    LogicalTensor,
    Op,
    Partition,
    __version__,
    backends,
    _pooled_empty,
    cache_policy,
    compile,
    empty_cache,
    graph_from_json,
    has_openmp_runtime,
    heap_retention,
    load_graph,
    memory_stats,
    num_threads,
    partition,
    reset_peak_memory_stats,
    set_cache_limit,
    set_cache_policy,
    set_num_threads,
    set_thread_runtime,
    thread_runtime,
)
from ._normgrad import set_heap_retention as _set_heap_retention  # noqa: E402

__all__ = [
    "CompiledGraph", "CompiledPartition", "Error", "Graph", "GraphPartition", "LogicalTensor", "Op",
    "Partition", "__version__", "backends", "cache_policy", "compile", "empty_cache",
    "graph_from_json", "has_openmp_runtime", "heap_retention", "load_graph", "memory_stats",
    "num_threads", "partition", "reset_peak_memory_stats", "set_cache_limit",
    "set_cache_policy", "set_heap_retention", "set_num_threads", "set_thread_runtime",
    "thread_runtime",
]


def set_heap_retention(on=True):
    """Keep memory freed to glibc in its heap (blocks up to 32 MiB) for the
    process's next allocations, torch's and normgrad's alike, or put glibc's
    default thresholds back (``on=False``).

    glibc otherwise unmaps freed blocks above its mmap threshold and trims
    its heap's top, so a training step faults its activations' and
    gradients' pages in again on every step, torch's as well as normgrad's.
    With retention on, normgrad.torch takes its outputs of up to 32 MiB from
    torch's allocator (so torch reuses their memory), and only larger ones
    from its caching pool. The heap then keeps its high-water mark, which
    can be above the pool's (docs/python.md, "glibc's heap"). Raises where
    the C library is not glibc."""
    _set_heap_retention(bool(on))
