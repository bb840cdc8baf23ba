"""normgrad: a batch-norm-backward graph compiler, from Python.

Build graphs (``Graph``, ``Op``, ``LogicalTensor``) or load oneDNN-format JSON
(``load_graph``), ``compile`` them and ``execute`` on NumPy arrays or PyTorch
CPU tensors, borrowed without copies. ``normgrad.torch`` has drop-in
BatchNorm modules whose backward runs here.
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
    compile,
    graph_from_json,
    load_graph,
    num_threads,
    set_num_threads,
)

__all__ = [
    "CompiledGraph", "Error", "Graph", "LogicalTensor", "Op", "Partition", "__version__",
    "backends", "compile", "graph_from_json", "load_graph", "num_threads", "set_num_threads",
]
