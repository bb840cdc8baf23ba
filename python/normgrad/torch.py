"""Drop-in PyTorch batch norm that runs on normgrad, forward and backward.

The modules (``BatchNorm1d``, ``BatchNorm2d``, ``BatchNorm3d``,
``SyncBatchNorm``) are in _batch_norm.py, InPlace-ABN (``InPlaceABN``,
``InPlaceABNSync``) in _inplace_abn.py, and the model converters
(``convert``, ``convert_sync_batchnorm``) in _torch_convert.py, and
``capture`` (a model's training step as one graph) in capture.py,
``compile`` (a training backend on AOT autograd) in _compile.py; the
synchronized layers' collectives (agreement before data, bounded waits,
``SyncError``) in _sync.py and their statistics in _group_stats.py;
checkpointing (the recompute recognised, ``convert(checkpoint="blocks")``)
in _checkpoint.py; torch's allocations from normgrad's pool
(``set_pool_allocator``) in _pool_allocator.py. This module is their public face. docs/python.md
describes them, with a table of the torch features each supports.

NCHW (NCX) and channels_last (NXC) tensors are passed to normgrad without
copies; f32, bf16 and f16 data, with f32 statistics. Every input is
checked (device, dtype, rank, channels, and the parameters' and buffers'
shapes) before a kernel runs.
"""
import re as _re
import warnings as _warnings

import torch as _torch


def _check_torch_version(version):
    """torch 1.13 is what normgrad.torch is built and tested against (Debian
    12's python3-torch); older ones lack what it uses (functorch's AOT
    autograd for capture, torch.fx.wrap, DLPack bf16): refused with the reason.
    2.x is not tested: it imports, with a warning."""
    m = _re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ImportError("normgrad.torch: cannot read torch's version %r" % version)
    major, minor = int(m.group(1)), int(m.group(2))
    if (major, minor) < (1, 13):
        raise ImportError("normgrad.torch needs torch 1.13 or newer (tested: 1.13); this is torch "
                          "%s. Install Debian 12's python3-torch, or torch>=1.13 in your venv"
                          % version)
    if major >= 2:
        _warnings.warn("normgrad.torch is tested with torch 1.13; torch %s is not tested here"
                       % version, stacklevel=3)


_check_torch_version(_torch.__version__)

from ._batch_norm import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm
from ._inplace_abn import InPlaceABN, InPlaceABNSync
from ._torch_convert import convert, convert_sync_batchnorm
from ._sync import (SyncError, collective_timeout, name_layers, set_collective_timeout,
                    sync_stats)
from ._torch_graphs import BatchError, InputTypeError, RankError, recording
from .capture import Capture, CaptureError, capture
from ._compile import CompiledModule, compile, dynamo_backend  # noqa: A004 - torch.compile's name
from ._pool_allocator import pool_allocator, pool_allocator_available, set_pool_allocator

__all__ = ["BatchError", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Capture", "CaptureError",
           "CompiledModule", "InputTypeError", "SyncBatchNorm", "SyncError", "InPlaceABN",
           "InPlaceABNSync", "RankError", "capture", "collective_timeout", "compile", "convert",
           "convert_sync_batchnorm", "dynamo_backend", "name_layers", "pool_allocator",
           "pool_allocator_available", "recording", "set_collective_timeout",
           "set_pool_allocator", "sync_stats"]
