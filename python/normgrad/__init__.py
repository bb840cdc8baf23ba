"""normgrad: a batch-norm-backward graph compiler, from Python.

Build graphs (``Graph``, ``Op``, ``LogicalTensor``) or load oneDNN-format JSON
(``load_graph``), ``compile`` them and ``execute`` on NumPy arrays or PyTorch
CPU tensors, borrowed without copies. ``normgrad.torch`` has drop-in
BatchNorm modules that run here. Outputs normgrad.torch allocates come from a
caching pool: ``memory_stats()`` reports it and ``empty_cache()`` releases it.
"""
from ._normgrad import (  # noqa: F401
    CompiledGraph,
    Error,
    Graph,
    LogicalTensor,
    Op,
    Partition,
    __version__,
    backends,
    _pooled_empty,
    compile,
    empty_cache,
    graph_from_json,
    has_openmp_runtime,
    load_graph,
    memory_stats,
    num_threads,
    set_cache_limit,
    set_num_threads,
    set_thread_runtime,
    thread_runtime,
)

__all__ = [
    "CompiledGraph", "Error", "Graph", "LogicalTensor", "Op", "Partition", "__version__",
    "backends", "compile", "empty_cache", "graph_from_json", "has_openmp_runtime", "load_graph",
    "memory_stats", "num_threads", "set_cache_limit", "set_num_threads", "set_thread_runtime",
    "thread_runtime",
]
