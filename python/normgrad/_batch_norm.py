"""normgrad.torch's batch norm modules: BatchNorm1d/2d/3d and SyncBatchNorm.

``BatchNorm1d``, ``BatchNorm2d`` and ``BatchNorm3d`` subclass torch's own
modules, so constructor arguments, parameters, buffers and state_dict are
torch's. In training the forward is one compiled BatchNormForwardTraining
partition (JIT: statistics that do not cancel, normalisation, and the fused
Add/ReLU), and the running buffers are updated exactly as torch does
(momentum, ``momentum=None`` as a cumulative average, unbiased running_var);
with frozen statistics it is BatchNormInference. The backward is normgrad's
BatchNormTrainingBackward (frozen form when the batch statistics are not
used), with ReLUBackward fused in when the module was built with
``fuse_relu=True``. A backward asked to build its own graph
(``create_graph=True``, a gradient penalty) runs torch's differentiable ops
instead, so double backward works as with torch's modules.

``SyncBatchNorm`` sums its statistics across a ``torch.distributed`` process
group and runs the backward as normgrad's BatchNormBackwardReduce and
BatchNormBackwardApply, with the group's ``all_reduce`` between them.

Every module forward goes through one function registered with
``torch.fx.wrap``: ``torch.fx.symbolic_trace`` records it as one call (the
module passed by reference) instead of tracing into control flow, and it
checks every input before a kernel runs, since the compiled graphs read
memory by pointer.
"""
import torch as _torch
import torch.distributed as _dist
import torch.fx as _fx
import torch.nn as _nn
import torch.nn.functional as _F

import normgrad as _ng

from . import _checkpoint as _ckpt
from . import _sync
from . import _torch_graphs as _g
from ._group_stats import (_local_moments, _local_stats, group_moments,  # noqa: F401
                           group_sums_backward, normalize_group, split_mean)


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


def _differentiable_backward(x, weight, bias, mean, var, y, grad, use_batch_stats, eps, relu,
                             has_residual):
    """The backward in torch's differentiable ops, for create_graph=True: the
    gradients are functions of x, weight, bias and grad, so they can be
    differentiated again. The statistics are recomputed from x when the
    batch's were used, as torch's own double backward does."""
    g = grad * (y > 0).to(grad.dtype) if relu else grad
    wanted = [t for t in (x, weight, bias) if t is not None and t.requires_grad]
    grads = {}
    if wanted:
        xf = x.float()
        w = weight.float() if weight is not None else None
        b = bias.float() if bias is not None else None
        if use_batch_stats:
            z = _F.batch_norm(xf, None, None, w, b, True, 0.0, eps)
        else:
            z = _F.batch_norm(xf, mean, var, w, b, False, 0.0, eps)
        got = _torch.autograd.grad(z, wanted, g.float(), create_graph=True)
        grads = {id(t): d for t, d in zip(wanted, got)}
    dx = grads.get(id(x))
    dw = grads.get(id(weight)) if weight is not None else None
    db = grads.get(id(bias)) if bias is not None else None
    return (None if dx is None else dx.to(x.dtype),
            None if dw is None else dw.to(weight.dtype),
            None if db is None else db.to(bias.dtype),
            g if has_residual else None)


class _BatchNormFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, use_batch_stats, factor, eps,
                fuse_relu, residual, step=None):
        xd = x.detach()  # DLPack exports no autograd-tracked tensors
        fmt, xv = _g.layout(xd)
        dt = _g.DTYPES[x.dtype]
        c = x.shape[1]
        shape = tuple(xv.shape)
        affine = weight is not None
        y = _g.pooled_like(x, fmt)
        yv = _g.view_as_fmt(y, fmt)
        gamma = _g.f32_vector(weight) if affine else _g.constant(c, 1.0)
        beta = _g.f32_vector(bias) if affine else _g.constant(c, 0.0)
        if residual is not None:
            # Dense in src's order (a copy only when the residual's format differs).
            rv_view = _g.view_as_fmt(_g.like(residual.detach(), x), fmt)
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
            if step is None:
                _g.update_running(running_mean, running_var, mean, var, factor, x.numel() // c)
            else:  # training: the batch counts once per step, also under checkpointing
                state, count, grad_enabled = step
                key = _ckpt.input_key(xd)
                if not state.is_recompute(key, (mean, var), grad_enabled):
                    _g.update_running(running_mean, running_var, mean, var, count(),
                                      x.numel() // c)
                state.remember(key, (mean, var))
                ctx.step_state = state
            ctx.mean_lo = _mean_lo(xd, mean, var, eps)
        else:
            mean = _g.f32_vector(running_mean)
            var = _g.f32_vector(running_var)
            # The residual's Add and the ReLU in the same pass (the JIT's epilogue).
            cg = _g.inference_graph(shape, fmt, dt, c, eps, fuse_relu, residual is not None)
            inputs = {_g.X: xv, _g.GAMMA: gamma, _g.BETA: beta, _g.MEAN: mean, _g.VAR: var}
            if residual is not None:
                inputs[_g.RES] = rv_view
            _g.run(cg, inputs, {_g.forward_output_id(residual is not None, fuse_relu): yv})
        if not use_batch_stats:
            ctx.mean_lo = None
        ctx.use_batch_stats, ctx.fuse_relu, ctx.eps = use_batch_stats, fuse_relu, eps
        ctx.has_residual = residual is not None
        ctx.save_for_backward(x, weight, bias, mean, var, y if fuse_relu else None)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias, mean, var, y = ctx.saved_tensors  # first: may run checkpoint's recompute
        if getattr(ctx, "step_state", None) is not None:
            ctx.step_state.done()
        if _torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated
            dx, dw, db, dres = _differentiable_backward(
                x, weight, bias, mean, var, y, grad, ctx.use_batch_stats, ctx.eps, ctx.fuse_relu,
                ctx.has_residual)
            return dx, dw, db, None, None, None, None, None, None, dres, None
        x, grad = x.detach(), grad.detach()  # DLPack exports no autograd-tracked tensors
        if grad.dtype != x.dtype:
            grad = grad.to(x.dtype)
        fmt, xv = _g.layout(x)
        dt = _g.DTYPES[x.dtype]
        c = x.shape[1]
        affine = weight is not None
        # The saved parameters are read by pointer: they must still be C long.
        _g.check_vectors("BatchNorm backward", c, weight=weight, mean=mean, variance=var)
        d_residual = None
        fuse = ctx.fuse_relu
        if ctx.mean_lo is not None:  # data far from zero: the mean at full precision
            return _exact_mean_backward(ctx, x, weight, mean, var, y, grad)
        strided = _grad_view(grad, x, fmt)[1] is not None
        # The residual needs the masked gradient itself: the fused kernel writes
        # it as a side output (docs/passes.md) when the gradient is dense; a
        # strided one is masked first, in one pass, as torch's ReLU does (a
        # fused ReLUBackward takes dense operands).
        side = fuse and ctx.has_residual and not strided
        if fuse and strided:
            grad = _torch.ops.aten.threshold_backward(grad, y.detach(), 0)
            fuse = False
        if ctx.has_residual and not side:
            d_residual = grad
        gv, dy_strides = _grad_view(grad, x, fmt)
        cg = _g.backward_graph(tuple(xv.shape), fmt, dt, c, affine, ctx.use_batch_stats, fuse,
                               ctx.eps, dy_strides, side)
        dx = _g.pooled_like(x, fmt)
        inputs = {_g.X: xv, _g.MEAN: mean, _g.VAR: var}
        if fuse:
            inputs[_g.Y] = _g.view_as_fmt(y.detach(), fmt)
            inputs[_g.G] = gv
        else:
            inputs[_g.DY] = gv
        outputs = {_g.DX: _g.view_as_fmt(dx, fmt)}
        if side:
            d_residual = _g.pooled_like(x, fmt)
            outputs[_g.DY] = _g.view_as_fmt(d_residual, fmt)
        if affine:
            inputs[_g.GAMMA] = _g.f32_vector(weight)
            dgamma = _torch.empty(c, dtype=_torch.float32)
            dbeta = _torch.empty(c, dtype=_torch.float32)
            outputs[_g.DGAMMA], outputs[_g.DBETA] = dgamma, dbeta
        _g.run(cg, inputs, outputs)
        if not affine:
            return (dx, None, None, None, None, None, None, None, None, d_residual, None)
        return (dx, dgamma.to(weight.dtype), dbeta.to(bias.dtype), None, None, None, None, None,
                None, d_residual, None)


# Above this many standard deviations of offset (|mean| / std on some
# channel), the batch mean's f32 rounding (half an ulp of |mean|, 3e-8 |mean|)
# moves x - mean by more than 5e-7 std: the backward then takes the mean at
# full precision.
_OFFSET_SIGMAS = 16.0


def _mean_lo(x, mean, var, eps):
    """The batch mean's low part (mean - f32 mean) per channel when the data
    is far from zero, else None. One more pass over x, only then."""
    if x.numel() == 0 or not _ng._normgrad._far_from_zero(mean.data_ptr(), var.data_ptr(),
                                                          mean.numel(), eps, _OFFSET_SIGMAS):
        return None
    _, mean64, _ = _local_moments(x)
    return (mean64 - mean.double()).float()


def _exact_mean_backward(ctx, x, weight, mean, var, y, grad):
    """The backward with the mean at full precision (hi + lo): Reduce and Apply
    on this process's sums, the low part folded in as the synchronized
    backward folds it (group_sums_backward)."""
    if ctx.fuse_relu:  # ReLUBackward first, as torch's ReLU does
        grad = _torch.ops.aten.threshold_backward(grad, y.detach(), 0)
    invstd = _torch.rsqrt(var.double() + ctx.eps).float()
    gamma = None if weight is None else weight.detach().float()
    dx, sums = group_sums_backward(x, grad, mean, invstd, gamma, None, mean_lo=ctx.mean_lo)
    c = x.shape[1]
    d_residual = grad if ctx.has_residual else None
    if weight is None:
        return (dx, None, None, None, None, None, None, None, None, d_residual, None)
    dgamma = (invstd.double() * sums[c:]).to(weight.dtype)
    dbeta = sums[:c].to(weight.dtype)
    return (dx, dgamma, dbeta, None, None, None, None, None, None, d_residual, None)


def count_batch(m):
    """torch's per-batch bookkeeping in training: num_batches_tracked + 1, and
    the momentum factor of this batch."""
    factor = 0.0 if m.momentum is None else m.momentum
    if m.track_running_stats and m.num_batches_tracked is not None:
        m.num_batches_tracked.add_(1)
        factor = 1.0 / float(m.num_batches_tracked) if m.momentum is None else m.momentum
    return factor


def batch_state(m, training):
    """(whether batch statistics are used, the running buffers to update or
    read, or None), as torch's _BatchNorm.forward decides them."""
    use_batch_stats = training or (m.running_mean is None and m.running_var is None)
    keep = not training or m.track_running_stats
    return use_batch_stats, m.running_mean if keep else None, m.running_var if keep else None


def forward_state(m, training):
    """torch's _BatchNorm.forward bookkeeping for module `m`: counts the batch,
    and returns (momentum factor, whether batch statistics are used, the
    running buffers to update or read, or None)."""
    factor = count_batch(m) if training else (0.0 if m.momentum is None else m.momentum)
    return (factor,) + batch_state(m, training)


def check_module(m, name, x, local_batch=True, empty_ok=False):
    """Every rule the module's input and its own tensors must meet."""
    _g.check_input(name, x, m.num_features, m.training, m._check_input_dim, local_batch,
                   empty_ok)
    weight, bias, rm, rv = m.weight, m.bias, m.running_mean, m.running_var
    _g.check_vectors(name, m.num_features, weight=weight, bias=bias, running_mean=rm,
                     running_var=rv)
    if (weight is None) != (bias is None):
        raise _ng.Error("normgrad.torch.%s: weight and bias must both be set or both be None "
                        "(rule: affine)" % name)
    if (rm is None) != (rv is None):
        raise _ng.Error("normgrad.torch.%s: running_mean and running_var must both be set or "
                        "both be None (rule: track_running_stats)" % name)


def batch_norm_module_forward(m, x, residual=None):
    """The forward of normgrad's BatchNorm1d/2d/3d (torch.fx records it as one call)."""
    name = type(m).__name__
    check_module(m, name, x, empty_ok=True)
    relu = m.fuse_relu
    if x.numel() == 0:  # as torch: an empty output, the batch counted, statistics kept
        forward_state(m, m.training)
        y = _EmptyBatchNormFunction.apply(x, m.weight, m.bias)
        if residual is not None:
            _g.check_residual(name, residual)
            y = y + residual
        return _torch.relu(y) if relu else y
    if residual is not None:
        _g.check_residual(name, residual)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            # A broadcasting or mixed-dtype add (fx saw no shapes): unfused.
            y = _bn_apply(m, x, None, False) + residual
            return _torch.relu(y) if relu else y
    return _bn_apply(m, x, residual, relu)


_fx.wrap("batch_norm_module_forward")


class _EmptyBatchNormFunction(_torch.autograd.Function):
    """Batch norm of an empty input, as torch's: an empty output, and zero
    parameter gradients."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.has_weight = weight is not None
        ctx.save_for_backward(weight)
        return _torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        if not ctx.has_weight:
            return _torch.empty_like(grad), None, None
        return _torch.empty_like(grad), _torch.zeros_like(weight), _torch.zeros_like(weight)


class _NoGradContext:
    """What _BatchNormFunction.forward is given for a ctx when no graph is
    recorded: it keeps the attributes the forward sets and saves nothing."""

    def save_for_backward(self, *tensors):
        pass


def _apply_function(grad_enabled, *args):
    """_BatchNormFunction's forward: through autograd when gradients are
    recorded, else called directly (the same computation, outputs without a
    grad_fn as Function.apply gives them under no_grad), which spares an
    inference call autograd's per-call machinery."""
    if grad_enabled:
        return _BatchNormFunction.apply(*args)
    return _BatchNormFunction.forward(_NoGradContext(), *args)


def _bn_apply(m, x, residual, relu):
    grad_enabled = _torch.is_grad_enabled()
    if not m.training:
        factor, use_batch_stats, rm, rv = forward_state(m, False)
        return _apply_function(grad_enabled, x, m.weight, m.bias, rm, rv, use_batch_stats,
                               factor, m.eps, relu, residual)
    # Training: the Function counts the batch, once per step under checkpointing.
    _, rm, rv = batch_state(m, True)
    step = (_ckpt.state_of(m), lambda: count_batch(m), grad_enabled)
    return _apply_function(grad_enabled, x, m.weight, m.bias, rm, rv, True, 0.0, m.eps, relu,
                           residual, step)


class _NormgradBatchNorm:
    """The forward of torch's _BatchNorm, with normgrad's kernels; mixed in
    front of torch's BatchNorm1d/2d/3d, whose constructor it extends with
    `fuse_relu`."""

    def __init__(self, *args, fuse_relu=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fuse_relu = fuse_relu

    def forward(self, x, residual=None):
        """bn(x), or relu(bn(x) + residual) / bn(x) + residual when convert(fuse=True)
        found BN -> Add [-> ReLU] (fuse_relu says which)."""
        return batch_norm_module_forward(self, x, residual)

    def __prepare_scriptable__(self):
        raise _ng.Error(
            "normgrad.torch.%s cannot be compiled by TorchScript: it calls normgrad's kernels "
            "through torch.autograd.Function, which TorchScript does not support. Run it in "
            "eager mode, trace the model with torch.fx.symbolic_trace, or script the torch model "
            "it was converted from (convert(model, fuse=True) leaves that model unchanged)"
            % type(self).__name__)

    def extra_repr(self):
        rep = super().extra_repr()
        return rep + ", fuse_relu=True" if self.fuse_relu else rep


class BatchNorm1d(_NormgradBatchNorm, _nn.BatchNorm1d):
    pass


class BatchNorm2d(_NormgradBatchNorm, _nn.BatchNorm2d):
    pass


class BatchNorm3d(_NormgradBatchNorm, _nn.BatchNorm3d):
    pass


# --- SyncBatchNorm -------------------------------------------------------------


def no_double_backward(name):
    if _torch.is_grad_enabled():
        raise _ng.Error("normgrad.torch.%s: double backward (create_graph=True) is not supported; "
                        "use normgrad.torch.BatchNorm2d (or torch's batch norm) where the "
                        "gradient must be differentiated again" % name)


class _SyncBatchNormFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, layer, state, total, mean64, var64):
        """Normalises with the group's statistics (computed by the caller)."""
        invstd64 = 1.0 / _torch.sqrt(var64 + eps)
        hi, lo = split_mean(mean64)
        y = normalize_group(x, total, mean64, var64, weight, bias, eps)
        ctx.layer, ctx.state = layer, state
        ctx.save_for_backward(x, weight, hi, lo, invstd64.float())
        return y

    @staticmethod
    def backward(ctx, grad):
        no_double_backward("SyncBatchNorm")
        x, weight, hi, lo, invstd = ctx.saved_tensors
        if ctx.state is not None:
            ctx.state.done()
        gamma = None if weight is None else weight.detach().float()
        dx, sums = group_sums_backward(x.detach(), grad.detach(), hi, invstd, gamma, ctx.layer,
                                       mean_lo=lo)
        if weight is None:
            return dx, None, None, None, None, None, None, None, None
        # Parameter gradients from this process's sums, as torch.nn.SyncBatchNorm
        # gives them: data parallelism (DDP) then reduces them like every other.
        c = x.shape[1]
        dgamma = (invstd.double() * sums[c:]).to(weight.dtype)
        dbeta = sums[:c].to(weight.dtype)
        return dx, dgamma, dbeta, None, None, None, None, None, None


def sync_group(group):
    """The process group to synchronize over (the world by default), or None
    when there is no initialized group of more than one process."""
    group = group or (_dist.group.WORLD if _dist.is_initialized() else None)
    return group if group is not None and _dist.get_world_size(group) > 1 else None


def sync_batch_norm_module_forward(m, x):
    """The forward of normgrad's SyncBatchNorm (torch.fx records it as one call).
    Synchronized, its input checks run before the group's agreement, and a
    failed one is every rank's error (_sync.Layer.agree)."""
    group = sync_group(m.process_group)
    synced = group is not None and (m.training or m.running_mean is None)
    if not synced:
        check_module(m, "SyncBatchNorm", x)
        return _bn_apply(m, x, None, False)  # as BatchNorm, checkpoint-aware too
    layer = _sync.Layer(m, "SyncBatchNorm", group, x, m.eps, m.momentum, m.weight is not None)
    error = local = None
    try:
        check_module(m, "SyncBatchNorm", x, local_batch=False)
        local = _local_moments(x)  # first: a recompute needs no collective
    except Exception as e:  # every rule: this rank still joins the agreement
        error = e
    state = _ckpt.state_of(m) if m.training else None
    if state is not None and error is None:
        key, stats = _ckpt.input_key(x), _local_stats(local)
        if state.is_recompute(key, stats, _torch.is_grad_enabled()):  # checkpoint's recompute
            return _SyncBatchNormFunction.apply(x, m.weight, m.bias, m.eps, layer, state,
                                                *state.extra)
    layer.agree("forward", error)
    total, mean64, var64 = group_moments(x, layer, local)
    if state is not None:
        _, rm, rv = batch_state(m, True)
        _g.update_running(rm, rv, mean64.float(), var64.float(), count_batch(m), total)
        state.remember(key, stats, extra=(total, mean64, var64))
    return _SyncBatchNormFunction.apply(x, m.weight, m.bias, m.eps, layer, state, total, mean64,
                                        var64)


_fx.wrap("sync_batch_norm_module_forward")


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
        return sync_batch_norm_module_forward(self, x)

    __prepare_scriptable__ = _NormgradBatchNorm.__prepare_scriptable__


# Public under normgrad.torch (pickles and reprs name it).
for _cls in (BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm):
    _cls.__module__ = "normgrad.torch"
