"""Drop-in PyTorch batch norm that runs on normgrad, forward and backward.

The modules (``BatchNorm1d``, ``BatchNorm2d``, ``BatchNorm3d``,
``SyncBatchNorm``) are in _batch_norm.py, InPlace-ABN (``InPlaceABN``,
``InPlaceABNSync``) in _inplace_abn.py, and the model converters
(``convert``, ``convert_sync_batchnorm``) in _torch_convert.py, and
``capture`` (a model's training step as one graph) in capture.py; this module
is their public face. docs/python.md describes them, with a table of the
torch features each supports.

NCHW (NCX) and channels_last (NXC) tensors are passed to normgrad without
copies; f32, bf16 and f16 data, with f32 statistics. Every input is
checked (device, dtype, rank, channels, and the parameters' and buffers'
shapes) before a kernel runs.
"""
from ._batch_norm import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm
from ._inplace_abn import InPlaceABN, InPlaceABNSync
from ._torch_convert import convert, convert_sync_batchnorm
from ._torch_graphs import RankError, recording
from .capture import Capture, CaptureError, capture

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Capture", "CaptureError", "SyncBatchNorm",
           "InPlaceABN", "InPlaceABNSync", "RankError", "capture", "convert",
           "convert_sync_batchnorm", "recording"]
