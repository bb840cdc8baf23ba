"""Drop-in PyTorch batch norm that runs on normgrad, forward and backward.

``BatchNorm1d``, ``BatchNorm2d`` and ``BatchNorm3d`` subclass torch's own
modules, so constructor arguments, parameters, buffers and state_dict are
torch's. In training the forward is one compiled BatchNormForwardTraining
partition (JIT: statistics that do not cancel, normalisation, and the fused
Add/ReLU), and the running buffers are updated exactly as torch does
(momentum, ``momentum=None`` as a cumulative average, unbiased running_var);
with frozen statistics it is BatchNormInference. The backward is normgrad's
BatchNormTrainingBackward (frozen form when the batch statistics are not
used), with ReLUBackward fused in when the module was built with
``fuse_relu=True`` (it then returns relu(bn(x))). Outputs come from
normgrad's caching pool (``memory_stats``, ``empty_cache``).
``SyncBatchNorm`` sums its statistics across a ``torch.distributed`` process
group and runs the backward as normgrad's BatchNormBackwardReduce and
BatchNormBackwardApply, with the group's ``all_reduce`` between them.
``convert(model)`` and ``convert_sync_batchnorm(model)`` swap modules in place;
``convert(model, fuse=True)`` traces the model with torch.fx and fuses
BN -> ReLU and BN -> Add -> ReLU (torchvision's BasicBlock and Bottleneck).

NCHW (NCX) and channels_last (NXC) tensors are passed to normgrad without
copies; f32, bf16 and f16 data, with f32 statistics.
"""
import warnings

import torch as _torch
import torch.distributed as _dist
import torch.nn as _nn

import normgrad as _ng

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "InPlaceABN",
           "InPlaceABNSync", "convert", "convert_sync_batchnorm"]

from . import _torch_graphs as _g

_DTYPES = _g.DTYPES
_CACHE = _g.CACHE  # graph key -> compiled graph (shared with the graph builders)


def _like(grad, x):
    """grad in x's memory format (a copy only when they differ)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=_torch.channels_last):
        return grad.contiguous(memory_format=_torch.channels_last)
    if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=_torch.channels_last_3d):
        return grad.contiguous(memory_format=_torch.channels_last_3d)
    return grad.contiguous()


def _layout(x):
    return _g.layout(x)


def _dtype(x):
    if x.dtype not in _DTYPES:
        raise _ng.Error("normgrad.torch: %s data is not supported (f32, bf16, f16)" % x.dtype)
    return _DTYPES[x.dtype]


def _check(name, x, training):
    """The rules a batch norm's input must meet, as normgrad.Error naming the module."""
    if x.device.type != "cpu":
        raise _ng.Error("normgrad.torch.%s: input is on %s; normgrad runs on the CPU (rule: "
                        "device == cpu)" % (name, x.device))
    if x.dtype not in _DTYPES:
        raise _ng.Error("normgrad.torch.%s: %s data is not supported (rule: dtype in float32, "
                        "bfloat16, float16)" % (name, x.dtype))
    if x.dim() < 2 or x.shape[1] == 0:
        raise _ng.Error("normgrad.torch.%s: expected input of shape (N, C, ...) with C > 0, got %s"
                        % (name, tuple(x.shape)))
    if x.shape[0] == 0 or x.numel() == 0:
        raise _ng.Error("normgrad.torch.%s: input %s is empty; batch statistics need at least one "
                        "element per channel (rule: N * spatial > 0)" % (name, tuple(x.shape)))
    if training and x.numel() // x.shape[1] == 1:
        raise _ng.Error("normgrad.torch.%s: expected more than 1 value per channel when training, "
                        "got input %s (rule: N * spatial > 1)" % (name, tuple(x.shape)))


def _grad_view(grad, x, fmt):
    """The gradient viewed in src's logical order, and its strides when its memory
    format differs from src's (the JIT walks or stages it; None when dense)."""
    gv = _g.view_as_fmt(grad, fmt)
    if gv.is_contiguous():
        return gv, None
    if any(s == 0 for s in gv.stride()) or any(s < 0 for s in gv.stride()):
        gv = gv.contiguous()  # broadcast (expanded) gradients: one dense copy
        return gv, None
    return gv, list(gv.stride())


class _BatchNormFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, use_batch_stats, factor, eps,
                fuse_relu, name="BatchNorm", residual=None):
        _check(name, x, use_batch_stats)
        xd = x.detach()  # DLPack exports no autograd-tracked tensors
        fmt, xv = _layout(xd)
        dt = _DTYPES[x.dtype]
        c = x.shape[1]
        shape = tuple(xv.shape)
        affine = weight is not None
        y = _g.pooled_like(x, fmt)
        yv = _g.view_as_fmt(y, fmt)
        gamma = weight.detach().float().contiguous() if affine else _g.constant(c, 1.0)
        beta = bias.detach().float().contiguous() if affine else _g.constant(c, 0.0)
        if residual is not None:
            if residual.shape != x.shape or residual.dtype != x.dtype:
                raise _ng.Error("normgrad.torch.%s: the residual is %s %s, expected %s %s like the "
                                "input" % (name, tuple(residual.shape), residual.dtype,
                                           tuple(x.shape), x.dtype))
            # Dense in src's order (a copy only when the residual's format differs).
            rv_view = _g.view_as_fmt(_like(residual.detach(), x), fmt)
        if use_batch_stats:
            mean = _torch.empty(c, dtype=_torch.float32)
            var = _torch.empty(c, dtype=_torch.float32)
            cg = _g.forward_graph(shape, fmt, dt, c, affine, eps, residual is not None, fuse_relu)
            inputs = {_g.X: xv, _g.RM: _g.constant(c, 0.0), _g.RV: _g.constant(c, 1.0)}
            if affine:
                inputs[_g.GAMMA], inputs[_g.BETA] = gamma, beta
            if residual is not None:
                inputs[_g.RES] = rv_view
            scratch = _torch.empty(2 * c, dtype=_torch.float32)  # oneDNN's running outputs, unused
            _g.run(cg, inputs, {_g.forward_output_id(residual is not None, fuse_relu): yv,
                                _g.ORM: scratch[:c], _g.ORV: scratch[c:], _g.BM: mean, _g.BV: var})
            _g.update_running(running_mean, running_var, mean, var, factor, x.numel() // c)
        else:
            mean = running_mean.detach().float().contiguous()
            var = running_var.detach().float().contiguous()
            cg = _g.inference_graph(shape, fmt, dt, c, eps, fuse_relu and residual is None)
            out_id = _g.RELU_OUT if fuse_relu and residual is None else _g.Y0
            _g.run(cg, {_g.X: xv, _g.GAMMA: gamma, _g.BETA: beta, _g.MEAN: mean, _g.VAR: var},
                   {out_id: yv})
            if residual is not None:
                y.add_(residual)
                if fuse_relu:
                    y.relu_()
        ctx.use_batch_stats, ctx.fuse_relu, ctx.eps = use_batch_stats, fuse_relu, eps
        ctx.has_residual = residual is not None
        ctx.save_for_backward(x, weight, mean, var, y if fuse_relu else None)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, var, y = ctx.saved_tensors
        x, grad = x.detach(), grad.detach()  # DLPack exports no autograd-tracked tensors
        if grad.dtype != x.dtype:
            grad = grad.to(x.dtype)
        fmt, xv = _layout(x)
        dt = _DTYPES[x.dtype]
        c = x.shape[1]
        affine = weight is not None
        d_residual = None
        fuse = ctx.fuse_relu
        if fuse and (ctx.has_residual or _grad_view(grad, x, fmt)[1] is not None):
            # The residual needs the masked gradient itself (and a fused
            # ReLUBackward takes dense operands): one pass, as torch's ReLU does.
            grad = _torch.ops.aten.threshold_backward(grad, y.detach(), 0)
            fuse = False
        if ctx.has_residual:
            d_residual = grad
        gv, dy_strides = _grad_view(grad, x, fmt)
        cg = _g.backward_graph(tuple(xv.shape), fmt, dt, c, affine, ctx.use_batch_stats, fuse,
                               ctx.eps, dy_strides)
        dx = _g.pooled_like(x, fmt)
        inputs = {_g.X: xv, _g.MEAN: mean, _g.VAR: var}
        if fuse:
            inputs[_g.Y] = _g.view_as_fmt(y.detach(), fmt)
            inputs[_g.G] = gv
        else:
            inputs[_g.DY] = gv
        outputs = {_g.DX: _g.view_as_fmt(dx, fmt)}
        if affine:
            inputs[_g.GAMMA] = weight.detach().float().contiguous()
            dgamma = _torch.empty(c, dtype=_torch.float32)
            dbeta = _torch.empty(c, dtype=_torch.float32)
            outputs[_g.DGAMMA], outputs[_g.DBETA] = dgamma, dbeta
        _g.run(cg, inputs, outputs)
        if not affine:
            return (dx, None, None, None, None, None, None, None, None, None, d_residual)
        return (dx, dgamma.to(weight.dtype), dbeta.to(weight.dtype), None, None, None, None, None,
                None, None, d_residual)


# --- SyncBatchNorm's elementwise forward (statistics from all processes) --------


def _forward(ctx, x, weight, bias, mean, invstd, fuse_relu):
    shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
    y = (x.float() - mean.view(shape)) * invstd.view(shape)
    if weight is not None:
        y = y * weight.float().view(shape) + bias.float().view(shape)
    if fuse_relu:
        y = _torch.relu(y)
    y = y.to(x.dtype)
    if x.dim() >= 4 and not x.is_contiguous():
        y = _like(y, x)
    return y


def _forward_state(m, x):
    """torch's _BatchNorm.forward bookkeeping for module `m`: counts the batch,
    and returns (momentum factor, whether batch statistics are used, the
    running buffers to update or read, or None)."""
    m._check_input_dim(x)
    factor = 0.0 if m.momentum is None else m.momentum
    if m.training and m.track_running_stats and m.num_batches_tracked is not None:
        m.num_batches_tracked.add_(1)
        factor = 1.0 / float(m.num_batches_tracked) if m.momentum is None else m.momentum
    use_batch_stats = m.training or (m.running_mean is None and m.running_var is None)
    keep = not m.training or m.track_running_stats
    return (factor, use_batch_stats, m.running_mean if keep else None,
            m.running_var if keep else None)


class _NormgradBatchNorm:
    """The forward of torch's _BatchNorm, with normgrad's backward; mixed in
    front of torch's BatchNorm1d/2d/3d, whose constructor it extends with
    `fuse_relu`."""

    def __init__(self, *args, fuse_relu=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fuse_relu = fuse_relu

    def forward(self, x, residual=None):
        """bn(x), or relu(bn(x) + residual) / bn(x) + residual when convert(fuse=True)
        found BN -> Add [-> ReLU] (fuse_relu says which)."""
        name = type(self).__name__
        if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
            # A broadcasting or mixed-dtype add (fx saw no shapes): unfused.
            saved, self.fuse_relu = self.fuse_relu, False
            try:
                y = self.forward(x) + residual
            finally:
                self.fuse_relu = saved
            return _torch.relu(y) if saved else y
        try:
            factor, use_batch_stats, rm, rv = _forward_state(self, x)
        except ValueError as e:
            raise _ng.Error("normgrad.torch.%s: %s" % (name, e)) from None
        return _BatchNormFunction.apply(x, self.weight, self.bias, rm, rv, use_batch_stats,
                                        factor, self.eps, self.fuse_relu, name, residual)


class BatchNorm1d(_NormgradBatchNorm, _nn.BatchNorm1d):
    pass


class BatchNorm2d(_NormgradBatchNorm, _nn.BatchNorm2d):
    pass


class BatchNorm3d(_NormgradBatchNorm, _nn.BatchNorm3d):
    pass


def _swap(module, make):
    for name, child in list(module.named_children()):
        new = make(child)
        if new is not None:
            setattr(module, name, new)
        else:
            _swap(child, make)
    return module


def _copy_into(new, old):
    new.load_state_dict(old.state_dict())
    new.train(old.training)
    if old.weight is not None:
        new.weight.requires_grad_(old.weight.requires_grad)
        new.bias.requires_grad_(old.bias.requires_grad)
    return new


def _fuse_following_relus(module):
    """In every nn.Sequential, a normgrad BatchNorm directly followed by an
    nn.ReLU takes the ReLU in (fuse_relu) and the ReLU becomes an Identity."""
    for child in module.modules():
        if not isinstance(child, _nn.Sequential):
            continue
        names = list(child._modules.keys())
        for a, b in zip(names, names[1:]):
            bn, relu = child._modules[a], child._modules[b]
            if isinstance(bn, _NormgradBatchNorm) and type(relu) is _nn.ReLU:
                bn.fuse_relu = True
                child._modules[b] = _nn.Identity()


def convert(model, fuse_relu=False, fuse=False, inplace_abn=False):
    """Swaps every torch BatchNorm1d/2d/3d in `model` for normgrad's, in place,
    keeping weights, buffers and mode; returns `model`. A BatchNorm at the top
    is returned converted.

    fuse=True then traces the model with torch.fx and fuses BN -> ReLU and
    BN -> Add -> ReLU wherever the graph has them (torchvision's BasicBlock and
    Bottleneck included): each runs as one fused forward and one backward
    partition. It returns the traced torch.fx.GraphModule (attribute
    ``normgrad_fused``: how many were fused). A model that fx cannot trace is
    returned with its modules swapped and Sequential BN/ReLU pairs fused, with
    a warning that says so.

    fuse_relu=True (without fx): a BatchNorm followed by an nn.ReLU in an
    nn.Sequential fuses it and the ReLU is replaced by an Identity.

    inplace_abn=True first traces the model with torch.fx and swaps each
    BN -> LeakyReLU for InPlaceABN(leaky_relu) and each other BN for
    InPlaceABN(identity), where the BN's input may be overwritten; BN -> ReLU
    stays a batch norm (ReLU has no inverse), and a warning names every kind
    of BN left and why. It returns the traced GraphModule (attribute
    ``normgrad_inplace_abn``: how many were swapped); the rest are converted
    as above."""
    kinds = {_nn.BatchNorm1d: BatchNorm1d, _nn.BatchNorm2d: BatchNorm2d,
             _nn.BatchNorm3d: BatchNorm3d}

    def make(m):
        if isinstance(m, _NormgradBatchNorm) or type(m) not in kinds:
            return None
        new = kinds[type(m)](m.num_features, eps=m.eps, momentum=m.momentum, affine=m.affine,
                             track_running_stats=m.track_running_stats)
        if m.weight is not None:
            new = new.to(m.weight.dtype)
        elif m.running_mean is not None:
            new = new.to(m.running_mean.dtype)
        return _copy_into(new, m)

    if inplace_abn:
        from ._inplace_abn import convert_inplace_abn
        done = convert_inplace_abn(model, tuple(kinds) + (_NormgradBatchNorm,))
        if done is not None:
            model, swapped, left = done
            model.normgrad_inplace_abn = swapped
            for why, n in left.items():
                warnings.warn("normgrad.torch.convert(inplace_abn=True): %d batch norm(s) left as "
                              "BatchNorm: %s" % (n, why), stacklevel=2)
    top = make(model)
    model = top if top is not None else _swap(model, make)
    if fuse:
        from . import _torch_fx
        gm = _torch_fx.fuse(model, (_NormgradBatchNorm,))
        if gm is not None:
            return gm
        fuse_relu = True
    if fuse_relu:
        _fuse_following_relus(model)
    return model


# --- SyncBatchNorm -------------------------------------------------------------

_T, _compiled = _g._t, _g._compiled
_X, _DY, _MEAN, _VAR, _GAMMA, _DX = _g.X, _g.DY, _g.MEAN, _g.VAR, _g.GAMMA, _g.DX
_SUM_DY, _SUM_DYXM, _COUNT = 20, 21, 22


def _reduce_graph(shape, fmt, dt, c):
    def build(g):
        g.add_op("BatchNormBackwardReduce",
                 [_T(_X, dt, shape), _T(_DY, dt, shape), _T(_MEAN, "f32", [c])],
                 [_T(_SUM_DY, "f32", [c]), _T(_SUM_DYXM, "f32", [c]), _T(_COUNT, "s64", [1])],
                 {"data_format": fmt}, id=0, name="reduce")
    return _compiled(("reduce", tuple(shape), fmt, dt), build)


def _apply_graph(shape, fmt, dt, c, affine):
    def build(g):
        ins = [_T(_X, dt, shape), _T(_DY, dt, shape), _T(_MEAN, "f32", [c]), _T(_VAR, "f32", [c]),
               _T(_SUM_DY + 10, "f32", [c]), _T(_SUM_DYXM + 10, "f32", [c]),
               _T(_COUNT + 10, "s64", [1])]
        if affine:
            ins.append(_T(_GAMMA, "f32", [c]))
        g.add_op("BatchNormBackwardApply", ins, [_T(_DX, dt, shape)],
                 {"epsilon": 0.0, "data_format": fmt, "variance_is_inv_std": True}, id=0,
                 name="apply")
    return _compiled(("apply", tuple(shape), fmt, dt, affine), build)


class _SyncBatchNormFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, factor, eps, group):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        xf = x.float()
        count = x.numel() // c
        # One all_reduce of the per-channel sums, squares and count (f64).
        stats = _torch.cat([xf.sum(dims).double(), (xf.double() ** 2).sum(dims),
                            _torch.tensor([float(count)], dtype=_torch.float64)])
        _dist.all_reduce(stats, group=group)
        n = stats[-1].item()
        mean64 = stats[:c] / max(n, 1.0)
        var64 = (stats[c:2 * c] / max(n, 1.0) - mean64 * mean64).clamp_min(0)
        mean, var = mean64.float(), var64.float()
        invstd = _torch.rsqrt(var + eps)
        if running_mean is not None:
            with _torch.no_grad():
                running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
                unbiased = var * (n / max(n - 1, 1))
                running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        ctx.group = group
        ctx.save_for_backward(x, weight, mean, invstd)
        return _forward(ctx, x, weight, bias, mean, invstd, False)

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, invstd = ctx.saved_tensors
        x, grad = x.detach(), grad.detach()
        fmt, xv = _layout(x)
        dt = _dtype(x)
        c = x.shape[1]
        shape = tuple(xv.shape)
        g = _like(grad.to(x.dtype), x)
        gv = g.permute(*([0] + list(range(2, g.dim())) + [1])) if fmt == "NXC" else g
        sums = _torch.empty(2 * c, dtype=_torch.float32)
        count = _torch.empty(1, dtype=_torch.int64)
        mean = mean.contiguous()
        _reduce_graph(shape, fmt, dt, c).execute(
            {_X: xv, _DY: gv, _MEAN: mean},
            {_SUM_DY: sums[:c], _SUM_DYXM: sums[c:], _COUNT: count})
        # The two sums and the count in one collective, in f64.
        packed = _torch.cat([sums.double(), count.double()])
        _dist.all_reduce(packed, group=ctx.group)
        g_sums = packed[:2 * c].float()
        g_count = packed[2 * c:].round().to(_torch.int64)
        dx = _torch.empty_like(x) if fmt == "NXC" else _torch.empty(x.shape, dtype=x.dtype)
        dxv = dx.permute(*([0] + list(range(2, dx.dim())) + [1])) if fmt == "NXC" else dx
        inputs = {_X: xv, _DY: gv, _MEAN: mean, _VAR: invstd.contiguous(),
                  _SUM_DY + 10: g_sums[:c].contiguous(), _SUM_DYXM + 10: g_sums[c:].contiguous(),
                  _COUNT + 10: g_count}
        if weight is not None:
            inputs[_GAMMA] = weight.detach().float().contiguous()
        _apply_graph(shape, fmt, dt, c, weight is not None).execute(inputs, {_DX: dxv})
        if weight is None:
            return dx, None, None, None, None, None, None, None
        # Parameter gradients from this process's sums, as torch.nn.SyncBatchNorm
        # gives them: data parallelism (DDP) then reduces them like every other.
        dgamma = (invstd * sums[c:]).to(weight.dtype)
        dbeta = sums[:c].to(weight.dtype)
        return dx, dgamma, dbeta, None, None, None, None, None


class SyncBatchNorm(_nn.modules.batchnorm._BatchNorm):
    """torch.nn.SyncBatchNorm's constructor and behaviour, with normgrad's split
    backward (Reduce, the process group's all_reduce, Apply). Without an
    initialized process group, or in eval mode, it is normgrad's BatchNorm.

    It derives from torch's _BatchNorm as torch.nn.SyncBatchNorm does, not from
    torch.nn.SyncBatchNorm itself: DistributedDataParallel refuses any
    torch.nn.SyncBatchNorm on the CPU ("SyncBatchNorm layers only work with
    GPU modules"), and this one runs on the CPU."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device,
                         dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(x.dim()))

    def forward(self, x):
        factor, use_batch_stats, rm, rv = _forward_state(self, x)
        group = self.process_group or (_dist.group.WORLD if _dist.is_initialized() else None)
        if use_batch_stats and group is not None and _dist.get_world_size(group) > 1:
            return _SyncBatchNormFunction.apply(x, self.weight, self.bias, rm, rv, factor,
                                                self.eps, group)
        return _BatchNormFunction.apply(x, self.weight, self.bias, rm, rv, use_batch_stats,
                                        factor, self.eps, False, "SyncBatchNorm", None)


def convert_sync_batchnorm(model, process_group=None):
    """Swaps every torch BatchNorm (and normgrad's) for normgrad's SyncBatchNorm,
    in place, keeping weights, buffers and mode; returns `model`."""
    bn = (_nn.modules.batchnorm._BatchNorm,)

    def make(m):
        if isinstance(m, SyncBatchNorm) or not isinstance(m, bn):
            return None
        new = SyncBatchNorm(m.num_features, eps=m.eps, momentum=m.momentum, affine=m.affine,
                            track_running_stats=m.track_running_stats,
                            process_group=process_group)
        if m.weight is not None:
            new = new.to(m.weight.dtype)
        return _copy_into(new, m)

    top = make(model)
    return top if top is not None else _swap(model, make)


from ._inplace_abn import InPlaceABN, InPlaceABNSync  # noqa: E402 (uses the helpers above)
