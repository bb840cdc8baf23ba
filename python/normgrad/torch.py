"""Drop-in PyTorch batch norm whose backward runs on normgrad.

``BatchNorm1d``, ``BatchNorm2d`` and ``BatchNorm3d`` subclass torch's own
modules, so constructor arguments, parameters, buffers and state_dict are
torch's. The forward computes the statistics in f32 (so f16, which torch's
CPU batch norm lacks, works) and updates the running buffers exactly as torch
does; the backward is normgrad's BatchNormTrainingBackward (frozen form when
the batch statistics are not used), with ReLUBackward fused in when the
module was built with ``fuse_relu=True`` (it then returns relu(bn(x))).
``SyncBatchNorm`` sums its statistics across a ``torch.distributed`` process
group and runs the backward as normgrad's BatchNormBackwardReduce and
BatchNormBackwardApply, with the group's ``all_reduce`` between them.
``convert(model)`` and ``convert_sync_batchnorm(model)`` swap modules in place.

NCHW (NCX) and channels_last (NXC) tensors are passed to normgrad without
copies; f32, bf16 and f16 data, with f32 statistics.
"""
import torch as _torch
import torch.distributed as _dist
import torch.nn as _nn

import normgrad as _ng

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "convert",
           "convert_sync_batchnorm"]

_DTYPES = {_torch.float32: "f32", _torch.bfloat16: "bf16", _torch.float16: "f16"}
_CACHE = {}  # graph key -> compiled graph


def _layout(x):
    """('NXC', the tensor viewed as N, spatial..., C) for channels_last, else ('NCX', x)."""
    if x.dim() == 4 and x.is_contiguous(memory_format=_torch.channels_last) and not x.is_contiguous():
        return "NXC", x.permute(0, 2, 3, 1)
    if x.dim() == 5 and x.is_contiguous(memory_format=_torch.channels_last_3d) and not x.is_contiguous():
        return "NXC", x.permute(0, 2, 3, 4, 1)
    return "NCX", x.contiguous()


def _like(grad, x):
    """grad in x's memory format (a copy only when they differ)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=_torch.channels_last):
        return grad.contiguous(memory_format=_torch.channels_last)
    if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=_torch.channels_last_3d):
        return grad.contiguous(memory_format=_torch.channels_last_3d)
    return grad.contiguous()


def _dtype(x):
    if x.dtype not in _DTYPES:
        raise _ng.Error("normgrad.torch: %s data is not supported (f32, bf16, f16)" % x.dtype)
    return _DTYPES[x.dtype]


def _compiled(key, build):
    cg = _CACHE.get(key)
    if cg is None:
        g = _ng.Graph()
        build(g)
        g.finalize()
        cg = _CACHE[key] = _ng.compile(g)
    return cg


def _T(i, dt, shape):
    return _ng.LogicalTensor(i, dt, list(shape))


# Tensor ids of the backward graphs.
_X, _DY, _MEAN, _VAR, _GAMMA, _DX, _DGAMMA, _DBETA, _Y, _G = 0, 1, 2, 3, 4, 5, 6, 7, 10, 11
_SUM_DY, _SUM_DYXM, _COUNT = 20, 21, 22


def _backward_graph(shape, fmt, dt, c, affine, training, fuse_relu):
    def build(g):
        dy_id = _DY
        if fuse_relu:  # mask by the module's output (use_dst): it is > 0 where relu passed
            g.add_op("ReLUBackward", [_T(_Y, dt, shape), _T(_G, dt, shape)], [_T(_DY, dt, shape)],
                     {"use_dst": True}, id=1, name="relu_bwd")
        ins = [_T(_X, dt, shape), _T(dy_id, dt, shape), _T(_MEAN, "f32", [c]),
               _T(_VAR, "f32", [c])]
        outs = [_T(_DX, dt, shape)]
        if affine:
            ins.append(_T(_GAMMA, "f32", [c]))
            outs += [_T(_DGAMMA, "f32", [c]), _T(_DBETA, "f32", [c])]
        g.add_op("BatchNormTrainingBackward", ins, outs,
                 {"epsilon": 0.0, "data_format": fmt, "is_training": bool(training),
                  "variance_is_inv_std": True}, id=0, name="bn_bwd")
    return _compiled(("bwd", tuple(shape), fmt, dt, affine, training, fuse_relu), build)


def _stats(x, mean, invstd):
    """Per-channel vectors shaped to broadcast over x (N, C, ...)."""
    shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
    return mean.view(shape), invstd.view(shape)


def _forward(ctx, x, weight, bias, mean, invstd, fuse_relu):
    m, s = _stats(x, mean, invstd)
    y = (x.float() - m) * s
    if weight is not None:
        shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
        y = y * weight.float().view(shape) + bias.float().view(shape)
    if fuse_relu:
        y = _torch.relu(y)
    y = y.to(x.dtype)
    if x.dim() >= 4 and not x.is_contiguous():
        y = _like(y, x)
    return y


def _local_stats(x, eps):
    dims = [0] + list(range(2, x.dim()))
    xf = x.float()
    var, mean = _torch.var_mean(xf, dim=dims, unbiased=False)
    return mean, _torch.rsqrt(var + eps), var


class _BatchNormFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, use_batch_stats, factor, eps,
                fuse_relu):
        if x.dim() < 2 or x.shape[1] == 0:
            raise _ng.Error("normgrad.torch: expected input of shape (N, C, ...), got %s"
                            % (tuple(x.shape),))
        if use_batch_stats:
            mean, invstd, var = _local_stats(x, eps)
            if running_mean is not None:
                n = x.numel() // x.shape[1]
                with _torch.no_grad():
                    running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
                    unbiased = var * (n / max(n - 1, 1))
                    running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        else:
            mean = running_mean.float()
            invstd = _torch.rsqrt(running_var.float() + eps)
        y = _forward(ctx, x, weight, bias, mean, invstd, fuse_relu)
        ctx.use_batch_stats, ctx.fuse_relu = use_batch_stats, fuse_relu
        ctx.save_for_backward(x, weight, mean, invstd, y if fuse_relu else None)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, invstd, y = ctx.saved_tensors
        x, grad = x.detach(), grad.detach()  # DLPack exports no autograd-tracked tensors
        y = y.detach() if y is not None else None
        fmt, xv = _layout(x)
        dt = _dtype(x)
        c = x.shape[1]
        affine = weight is not None
        cg = _backward_graph(tuple(xv.shape), fmt, dt, c, affine, ctx.use_batch_stats,
                             ctx.fuse_relu)
        g = _like(grad.to(x.dtype), x)
        gv = g.permute(*([0] + list(range(2, g.dim())) + [1])) if fmt == "NXC" else g
        dx = _torch.empty_like(x) if fmt == "NXC" else _torch.empty(x.shape, dtype=x.dtype)
        dxv = dx.permute(*([0] + list(range(2, dx.dim())) + [1])) if fmt == "NXC" else dx
        inputs = {_X: xv, _MEAN: mean.contiguous(), _VAR: invstd.contiguous()}
        if ctx.fuse_relu:
            yv = _layout(y)[1] if fmt == "NXC" else y.contiguous()
            inputs[_Y] = yv
            inputs[_G] = gv
        else:
            inputs[_DY] = gv
        outputs = {_DX: dxv}
        if affine:
            inputs[_GAMMA] = weight.detach().float().contiguous()
            dgamma = _torch.empty(c, dtype=_torch.float32)
            dbeta = _torch.empty(c, dtype=_torch.float32)
            outputs[_DGAMMA], outputs[_DBETA] = dgamma, dbeta
        cg.execute(inputs, outputs)
        if not affine:
            return dx, None, None, None, None, None, None, None, None
        return (dx, dgamma.to(weight.dtype), dbeta.to(weight.dtype), None, None, None, None, None,
                None)


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

    def forward(self, x):
        factor, use_batch_stats, rm, rv = _forward_state(self, x)
        return _BatchNormFunction.apply(x, self.weight, self.bias, rm, rv, use_batch_stats,
                                        factor, self.eps, self.fuse_relu)


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


def convert(model, fuse_relu=False):
    """Swaps every torch BatchNorm1d/2d/3d in `model` for normgrad's, in place,
    keeping weights, buffers and mode; returns `model`. A BatchNorm at the top
    is returned converted. With fuse_relu=True, a BatchNorm followed by an
    nn.ReLU in an nn.Sequential fuses it (the ReLU backward then runs inside
    normgrad's batch-norm backward) and the ReLU is replaced by an Identity."""
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

    top = make(model)
    model = top if top is not None else _swap(model, make)
    if fuse_relu:
        _fuse_following_relus(model)
    return model


# --- SyncBatchNorm -------------------------------------------------------------


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


class SyncBatchNorm(_nn.SyncBatchNorm):
    """torch.nn.SyncBatchNorm with normgrad's split backward (Reduce, the
    process group's all_reduce, Apply). Without an initialized process group,
    or in eval mode, it is normgrad's BatchNorm."""

    def forward(self, x):
        factor, use_batch_stats, rm, rv = _forward_state(self, x)
        group = self.process_group or (_dist.group.WORLD if _dist.is_initialized() else None)
        if use_batch_stats and group is not None and _dist.get_world_size(group) > 1:
            return _SyncBatchNormFunction.apply(x, self.weight, self.bias, rm, rv, factor,
                                                self.eps, group)
        return _BatchNormFunction.apply(x, self.weight, self.bias, rm, rv, use_batch_stats,
                                        factor, self.eps, False)


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
