"""Converting a torch model's batch norms to normgrad's: ``convert`` and
``convert_sync_batchnorm``.

One contract for every mode, as torch's converters keep it:
  - plain ``convert(model)`` and ``convert_sync_batchnorm`` change the model
    in place and return it. Each batch norm module becomes normgrad's by
    changing its class, so it stays the same object: parents, shared uses,
    hooks, Parameters and buffers are untouched, and an optimizer built
    before the conversion keeps training it.
  - ``fuse=True`` and ``inplace_abn=True`` return a new torch.fx
    GraphModule and leave the model passed in as it was, still computing
    what it computed. The GraphModule's batch norms are new modules that
    hold the input's own Parameter and buffer objects (a module shared by
    two parents stays one module), so the two models train the same
    weights.
Batch norms of a kind normgrad has no module for (a subclass, a lazy
module) are left as they are and named in a warning.
"""
import copy
import warnings

import torch.nn as _nn

from . import _batch_norm as _bn
from . import _checkpoint as _ckpt
from . import _inplace_abn as _abn
from . import _sync
from . import _torch_fx as _tfx

_BatchNormBase = _nn.modules.batchnorm._BatchNorm

# torch's modules and the normgrad class each becomes; exact types only (a
# subclass may change the forward, so it is left and named).
_TO_NORMGRAD = {_nn.BatchNorm1d: _bn.BatchNorm1d, _nn.BatchNorm2d: _bn.BatchNorm2d,
                _nn.BatchNorm3d: _bn.BatchNorm3d, _nn.SyncBatchNorm: _bn.SyncBatchNorm}
_NORMGRAD = (_bn._NormgradBatchNorm, _bn.SyncBatchNorm, _abn.InPlaceABN)


def _target_class(m, to_sync):
    """The normgrad class module `m` becomes, `type(m)` when it is one already,
    or None when it cannot be converted."""
    if to_sync:
        if isinstance(m, _bn.SyncBatchNorm):
            return type(m)
        if type(m) in _TO_NORMGRAD or type(m) in (_bn.BatchNorm1d, _bn.BatchNorm2d,
                                                  _bn.BatchNorm3d):
            return None if getattr(m, "fuse_relu", False) else _bn.SyncBatchNorm
        return None
    if isinstance(m, _NORMGRAD):
        return type(m)
    return _TO_NORMGRAD.get(type(m))


def _retype(m, cls, process_group=None, to_sync=False):
    """Module `m` made an instance of normgrad's `cls`, in place."""
    if type(m) is not cls:
        m.__class__ = cls
    if issubclass(cls, _bn._NormgradBatchNorm) and not hasattr(m, "fuse_relu"):
        m.fuse_relu = False
    if cls is _bn.SyncBatchNorm:
        if to_sync or not hasattr(m, "process_group"):
            m.process_group = process_group
        if hasattr(m, "fuse_relu"):
            del m.fuse_relu
    return m


def _sibling(m, cls):
    """A new module of class `cls` with m's attributes: the same Parameter,
    buffer and hook objects, in containers of its own (so changing one
    module's flags or registrations leaves the other alone)."""
    new = cls.__new__(cls)
    new.__dict__.update({k: copy.copy(v) if isinstance(v, (dict, set)) else v
                         for k, v in m.__dict__.items() if k != "_ng_step"})
    return _retype(new, cls)


def _warn_left(left, what):
    if left:
        names = ", ".join("%s (%s)" % (n or "<model>", why) for n, why in sorted(left.items()))
        warnings.warn("normgrad.torch.%s: %d batch norm(s) left as they are: %s"
                      % (what, len(left), names), stacklevel=3)


def _unconvertible_reason(m):
    return ("%s: normgrad has modules for torch's BatchNorm1d/2d/3d and SyncBatchNorm only, "
            "not their subclasses" % type(m).__name__)


def _convert_in_place(model, to_sync=False, process_group=None):
    """Changes the class of every convertible batch norm in `model`; returns
    {qualified name: why} for the batch norms left."""
    left = {}
    for name, m in model.named_modules():
        if not isinstance(m, (_BatchNormBase, _abn.InPlaceABN)):
            continue
        cls = _target_class(m, to_sync)
        if cls is None:
            if to_sync and getattr(m, "fuse_relu", False):
                left[name] = "it fuses a ReLU, which SyncBatchNorm does not"
            elif not (to_sync and isinstance(m, _abn.InPlaceABN)):
                left[name] = _unconvertible_reason(m)
            continue
        _retype(m, cls, process_group, to_sync)
    return left


def _fuse_following_relus(module):
    """In every nn.Sequential, a normgrad BatchNorm directly followed by an
    nn.ReLU takes the ReLU in (fuse_relu) and the ReLU becomes an Identity."""
    for child in module.modules():
        if not isinstance(child, _nn.Sequential):
            continue
        names = list(child._modules.keys())
        for a, b in zip(names, names[1:]):
            bn, relu = child._modules[a], child._modules[b]
            if isinstance(bn, _bn._NormgradBatchNorm) and type(relu) is _nn.ReLU:
                bn.fuse_relu = True
                child._modules[b] = _nn.Identity()


def _abn_sharing(bn, activation, slope):
    """An InPlaceABN that holds bn's own Parameter and buffer objects, in bn's mode."""
    abn = _abn.InPlaceABN(bn.num_features, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                          activation=activation, activation_param=slope)
    if bn.affine and bool((bn.weight < 0).any()):
        warnings.warn("normgrad.torch.convert(inplace_abn=True): a batch norm has negative "
                      "weights; InPlaceABN scales by |weight| + eps", stacklevel=5)
    abn.weight, abn.bias = bn.weight, bn.bias
    abn.running_mean, abn.running_var = bn.running_mean, bn.running_var
    if bn.num_batches_tracked is not None:
        abn.num_batches_tracked = bn.num_batches_tracked
    return abn.train(bn.training)


def _copy_sharing_tensors(model, what):
    """A structural copy of `model` whose Parameters and buffers are model's own."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    try:
        return copy.deepcopy(model, memo)
    except Exception as e:
        raise TypeError("normgrad.torch.convert(%s): %s can be neither traced by torch.fx nor "
                        "copied (%s: %s); convert(model) converts it in place instead"
                        % (what, type(model).__name__, type(e).__name__, e)) from None


def _convert_traced(model, fuse, inplace_abn):
    what = "fuse=True" if fuse else "inplace_abn=True"
    if isinstance(model, (_BatchNormBase, _abn.InPlaceABN)):  # a bare batch norm: nothing to fuse
        cls = _target_class(model, False)
        if cls is None:
            _warn_left({"": _unconvertible_reason(model)}, "convert(%s)" % what)
            return model
        return _sibling(model, cls)
    try:
        gm = _tfx.trace(model, (_BatchNormBase, _abn.InPlaceABN))
    except Exception as e:  # fx raises many kinds (TraceError, TypeError, ...)
        warnings.warn("normgrad.torch.convert(%s): torch.fx cannot trace %s (%s: %s); the batch "
                      "norms of a copy are converted (sharing the model's Parameters and "
                      "buffers), without fusion across modules"
                      % (what, type(model).__name__, type(e).__name__, e), stacklevel=3)
        out = _copy_sharing_tensors(model, what)
        _warn_left(_convert_in_place(out), "convert(%s)" % what)
        _fuse_following_relus(out)
        return out
    input_modules = {id(m) for m in model.modules()}
    modules = dict(gm.named_modules())
    targets = {n.target for n in gm.graph.nodes if n.op == "call_module"
               and isinstance(modules.get(n.target), (_BatchNormBase, _abn.InPlaceABN))}
    left = {}
    if inplace_abn:
        plain = (_bn.BatchNorm1d, _bn.BatchNorm2d, _bn.BatchNorm3d)
        gm.normgrad_inplace_abn, kept = _tfx.swap_inplace_abn(
            gm, lambda m: _target_class(m, False) in plain, _abn_sharing)
        if kept:
            names = ", ".join("%s (%s)" % kv for kv in sorted(kept.items()))
            warnings.warn("normgrad.torch.convert(inplace_abn=True): %d batch norm(s) kept as "
                          "BatchNorm: %s" % (len(kept), names), stacklevel=3)
        modules = dict(gm.named_modules())
    for target in sorted(targets):
        m = modules[target]
        parent = target.rpartition(".")[0]
        if parent and id(gm.get_submodule(parent)) in input_modules:
            left[target] = "it sits inside a module the traced model shares with the input"
            continue
        cls = _target_class(m, False)
        if cls is None:
            left[target] = _unconvertible_reason(m)
            continue
        if id(m) in input_modules:  # the input's own module: a new one sharing its tensors
            _tfx.set_module(gm, target, _sibling(m, cls))
    _warn_left(left, "convert(%s)" % what)
    if fuse:
        gm.normgrad_fused = _tfx.fuse(gm, (_bn._NormgradBatchNorm,))
    return gm


def _convert_checkpointed(model, fuse, inplace_abn):
    """checkpoint="blocks" with fuse=True or inplace_abn=True: a structural copy
    of `model` sharing its tensors, each block traced and converted on its
    own (fusion within blocks, where torchvision's are) and run under
    checkpointing; the rest converted in place in the copy."""
    out = _copy_sharing_tensors(model, "checkpoint='blocks'")
    _ckpt.checkpoint_blocks(out, lambda block: _convert_traced(block, fuse, inplace_abn))
    _warn_left(_convert_in_place(out), "convert(checkpoint='blocks')")
    return _sync.name_layers(out)


def convert(model, fuse_relu=False, fuse=False, inplace_abn=False, checkpoint=None):
    """Swaps every torch BatchNorm1d/2d/3d in `model` for normgrad's, and
    torch.nn.SyncBatchNorm for normgrad's SyncBatchNorm.

    Plain convert(model) converts in place and returns `model` itself: each
    batch norm module stays the same object (its class changes), with its
    Parameters, buffers, hooks and mode. fuse_relu=True also fuses an
    nn.ReLU that follows a BatchNorm in an nn.Sequential (the ReLU becomes
    an nn.Identity).

    fuse=True and inplace_abn=True leave `model` unchanged and return a
    torch.fx.GraphModule whose batch norms are normgrad modules holding
    `model`'s own Parameter and buffer objects (an optimizer built on
    `model` trains both). fuse=True fuses BN -> ReLU and BN -> Add -> ReLU
    (torchvision's BasicBlock and Bottleneck) into one forward and one
    backward partition each (attribute ``normgrad_fused``: how many).
    inplace_abn=True swaps BN -> LeakyReLU for InPlaceABN(leaky_relu),
    BN -> Add -> LeakyReLU for InPlaceABN with the residual, and other batch
    norms for InPlaceABN(identity), wherever the BN's input is a fresh tensor
    nothing else reads or keeps and its output is not overwritten
    (``normgrad_inplace_abn``: how many); a warning names every batch norm
    kept and why. A model fx cannot trace gives, with a warning, a converted
    copy that shares the Parameters and buffers.

    checkpoint="blocks" runs every block of the model's stages (the children
    of each nn.Sequential child: torchvision's ResNet layer1..layer4) under
    torch.utils.checkpoint, so the backward recomputes a block's forward
    instead of keeping its activations; normgrad's batch norms count the
    batch once even so. In place with plain convert (the module tree and
    state_dict keys unchanged); with fuse or inplace_abn, on a copy sharing
    the Parameters and buffers, each block traced and fused on its own.

    Batch norms normgrad cannot convert (subclasses, lazy modules) are named
    in a warning."""
    if checkpoint not in (None, "blocks"):
        raise ValueError("normgrad.torch.convert: checkpoint=%r is not supported (expected None "
                         "or 'blocks')" % (checkpoint,))
    if checkpoint == "blocks" and (fuse or inplace_abn):
        return _convert_checkpointed(model, fuse, inplace_abn)
    if fuse or inplace_abn:
        return _convert_traced(model, fuse, inplace_abn)
    _warn_left(_convert_in_place(model), "convert")
    if fuse_relu:
        _fuse_following_relus(model)
    if checkpoint == "blocks":
        _ckpt.checkpoint_blocks(model)
    return _sync.name_layers(model)


def convert_sync_batchnorm(model, process_group=None):
    """Makes every torch BatchNorm1d/2d/3d, torch.nn.SyncBatchNorm and
    normgrad BatchNorm in `model` normgrad's SyncBatchNorm over
    `process_group`, in place (each module stays the same object, with its
    Parameters, buffers and mode); returns `model`. Each is named after its
    place in `model` (``layer_name``), as synchronization errors call it. A
    BatchNorm that fuses a ReLU, and kinds normgrad has no module for, are
    left and named in a warning."""
    _warn_left(_convert_in_place(model, True, process_group), "convert_sync_batchnorm")
    return _sync.name_layers(model)
