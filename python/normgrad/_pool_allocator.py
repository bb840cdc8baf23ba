"""torch's CPU allocations from normgrad's caching pool:
``normgrad.torch.set_pool_allocator()``.

Through glibc, a training step's activations and gradients fault their
pages in again on every step (blocks above the mmap threshold are fresh
mappings), and the heap that serves the rest keeps its holes: the step's
peak holds both. With the pool allocator on, torch's CPU tensors of 256 KiB
or more come from normgrad's caching pool, which reuses blocks from step to
step, keeps free blocks only within the most it has had in use at once
(``set_cache_policy("peak")``), and maps new blocks of 2 MiB and more as
transparent huge pages. Smaller tensors keep malloc.

It is process-wide, like torch's own allocator, and off unless called.
Tensors made before a switch keep the allocator that made them, so it can be
turned on and off at any time. It needs the extension _torch_allocator,
built where c10's headers (Debian's libtorch-dev) were found, for the torch
it was built against.
"""
import torch as _torch

_module = None
_why_not = None


def _extension():
    global _module, _why_not
    if _module is None and _why_not is None:
        try:
            from . import _torch_allocator as mod
        except ImportError as e:
            _why_not = ("normgrad.torch.set_pool_allocator: this build of normgrad has no "
                        "_torch_allocator extension (CMake found no c10 headers: install "
                        "libtorch-dev and build again): %s" % e)
        else:
            running = ".".join(_torch.__version__.split(".")[:2])
            if running != mod.TORCH_VERSION:
                _why_not = ("normgrad.torch.set_pool_allocator: built against torch %s's "
                            "headers, running torch %s; rebuild normgrad against this torch"
                            % (mod.TORCH_VERSION, _torch.__version__))
            else:
                _module = mod
    if _module is None:
        raise RuntimeError(_why_not)
    return _module


def set_pool_allocator(on=True):
    """torch's CPU tensors of 256 KiB or more from normgrad's caching pool
    (``on=True``), or from torch's default allocator again (``on=False``).
    RuntimeError, with the reason, where this build cannot."""
    if not isinstance(on, bool):
        raise TypeError("normgrad.torch.set_pool_allocator(on): on is a bool, not %s"
                        % type(on).__name__)
    _extension().set_installed(on)


def pool_allocator():
    """Whether set_pool_allocator(True) is in force (False where this build
    has no pool allocator)."""
    try:
        return _extension().installed()
    except RuntimeError:
        return False


def pool_allocator_available():
    """(True, "") where set_pool_allocator works, else (False, why)."""
    try:
        _extension()
    except RuntimeError as e:
        return False, str(e)
    return True, ""
