"""In-place activated batch norm (InPlace-ABN) on normgrad: the module, its
synchronized twin.

``InPlaceABN`` follows mapillary/inplace_abn's signature and semantics. The
forward writes act(bn(x)) over x (one JIT partition: BatchNormForwardTraining
-> LeakyReLU, declared in place) and saves only that output; the backward is
BatchNormTrainingBackwardFromDst, which recovers x̂ from it. So a BN +
activation keeps one tensor alive for the backward where torch keeps two or
three. As in InPlace-ABN, the scale is |weight| + eps (it must not reach 0:
x̂ = (y - beta) / scale), and weight's gradient is the scale's times
sign(weight).

``InPlaceABNSync`` sums the statistics over a torch.distributed group; its
backward runs BatchNormBackwardReduce / all_reduce / BatchNormBackwardApply
on y and the gradient recovered through the activation (two elementwise
torch passes that InPlaceABN itself does not need).

Both keep torch's BatchNorm buffers, ``num_batches_tracked`` included (and
``momentum=None`` as a cumulative average), so a torch BatchNorm checkpoint
loads; a checkpoint without ``num_batches_tracked`` (mapillary's) loads too.
The swap from a model's batch norms is convert's (_torch_fx.py).
"""
import torch as _torch
import torch.fx as _fx
import torch.nn as _nn
import torch.nn.functional as _F

import normgrad as _ng

from . import _batch_norm as _bn
from . import _checkpoint as _ckpt
from . import _sync
from . import _torch_graphs as _g

_ACTIVATIONS = ("leaky_relu", "identity")


def _check_activation(name, activation, slope):
    """The activation and its slope; returns the slope (leaky_relu's default 0.01)."""
    if activation == "relu":
        raise _ng.Error("normgrad.torch.%s: activation 'relu' has no inverse (every negative value "
                        "becomes 0, so the backward cannot recover its input from the output); "
                        "use 'leaky_relu' or 'identity'" % name)
    if activation not in _ACTIVATIONS:
        raise _ng.Error("normgrad.torch.%s: activation %r is not supported (leaky_relu, identity)"
                        % (name, activation))
    if activation == "identity":
        if slope is not None:
            raise _ng.Error("normgrad.torch.%s: activation_param %r is only read with leaky_relu; "
                            "identity takes none" % (name, slope))
        return None
    slope = 0.01 if slope is None else slope
    if not (slope > 0 and slope == slope and slope != float("inf")):
        raise _ng.Error("normgrad.torch.%s: activation_param %r must be finite and > 0 (leaky_relu "
                        "is inverted by dividing by it)" % (name, slope))
    return slope


def _check_in_place(name, x):
    """The rules for writing the output over x, as errors (never a silent copy)."""
    if not (x.is_contiguous() or _g.channels_last(x)):
        raise _ng.Error("normgrad.torch.%s: the input (shape %s, strides %s) is neither contiguous "
                        "nor channels_last; the output is written over it, so it must be one of "
                        "the two (rule: dense input, no hidden copy)"
                        % (name, tuple(x.shape), tuple(x.stride())))
    if _torch.is_grad_enabled() and x.requires_grad and x.is_leaf:
        raise _ng.Error("normgrad.torch.%s: the input is a leaf tensor that requires grad, which "
                        "autograd lets no operation overwrite; the output is written over the "
                        "input (pass a tensor computed from it, or use BatchNorm2d)" % name)


def _scale_shift(weight, bias, eps, c):
    if weight is None:
        return _g.constant(c, 1.0), _g.constant(c, 0.0)
    return (weight.detach().float().abs() + eps).contiguous(), bias.detach().float().contiguous()


def _param_grads(weight, dgamma, dbeta):
    if weight is None:
        return None, None
    sign = _torch.where(weight.detach() < 0, -1.0, 1.0).float()
    return (dgamma * sign).to(weight.dtype), dbeta.to(weight.dtype)


class _InPlaceABNFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, step, eps, slope,
                residual=None):
        """`step`: (the module's _checkpoint.StepState, the call that counts the
        batch and gives its momentum factor, the caller's grad mode)."""
        key = _ckpt.input_key(x)
        fmt, xv = _g.layout(x.detach())  # a view: x is dense in one of the two orders
        dt = _g.DTYPES[x.dtype]
        c = x.shape[1]
        gamma, beta = _scale_shift(weight, bias, eps, c)
        mean = _torch.empty(c, dtype=_torch.float32)
        var = _torch.empty(c, dtype=_torch.float32)
        leaky = slope is not None
        has_res = residual is not None
        cg = _g.forward_graph(tuple(xv.shape), fmt, dt, c, True, eps, has_res, leaky, slope)
        inputs = {_g.X: xv, _g.RM: _g.constant(c, 0.0), _g.RV: _g.constant(c, 1.0),
                  _g.GAMMA: gamma, _g.BETA: beta}
        if has_res:
            residual = _g.like(residual.detach(), x)  # in x's memory format (a copy if not)
            inputs[_g.RES] = _g.view_as_fmt(residual, fmt)
        scratch = _torch.empty(2 * c, dtype=_torch.float32)
        _g.run(cg, inputs, {_g.forward_output_id(has_res, leaky): xv, _g.ORM: scratch[:c],
                            _g.ORV: scratch[c:], _g.BM: mean, _g.BV: var})
        state, count, grad_enabled = step
        if not state.is_recompute(key, (mean, var), grad_enabled):  # once per step
            _g.update_running(running_mean, running_var, mean, var, count(), x.numel() // c)
        state.remember(key, (mean, var))
        ctx.eps, ctx.slope, ctx.has_res, ctx.state = eps, slope, has_res, state
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, var, weight, bias, residual)
        return x

    @staticmethod
    def backward(ctx, grad):
        _bn.no_double_backward("InPlaceABN")
        y, var, weight, bias, residual = ctx.saved_tensors  # first: may run checkpoint's recompute
        ctx.state.done()
        y = y.detach()
        fmt, yv = _g.layout(y)
        dt = _g.DTYPES[y.dtype]
        c = y.shape[1]
        g = _g.like(grad.detach().to(y.dtype), y)
        gv = _g.view_as_fmt(g, fmt)
        gamma, beta = _scale_shift(weight, bias, ctx.eps, c)
        cg = _g.from_dst_graph(tuple(yv.shape), fmt, dt, c, ctx.eps, ctx.slope, ctx.has_res)
        inputs = {_g.Y: yv, _g.DY: gv, _g.VAR: var, _g.GAMMA: gamma, _g.BETA: beta}
        d_residual = None
        if ctx.has_res:
            inputs[_g.RES] = _g.view_as_fmt(residual.detach(), fmt)
            # The residual's gradient is the one through the activation (one pass, as torch's).
            d_residual = (g if ctx.slope is None else
                          _torch.ops.aten.leaky_relu_backward(g, y, ctx.slope, True))
        dx = _g.pooled_like(y, fmt)
        dgamma = _torch.empty(c, dtype=_torch.float32)
        dbeta = _torch.empty(c, dtype=_torch.float32)
        _g.run(cg, inputs,
               {_g.DX: _g.view_as_fmt(dx, fmt), _g.DGAMMA: dgamma, _g.DBETA: dbeta})
        dw, db = _param_grads(weight, dgamma, dbeta)
        return dx, dw, db, None, None, None, None, None, d_residual


class _InPlaceABNSyncFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, slope, layer, state, total, mean64, var64):
        """Normalises over x with the group's statistics (computed by the caller)."""
        xd = x.detach()
        c = x.shape[1]
        gamma, beta = _scale_shift(weight, bias, eps, c)
        y = _bn.normalize_group(xd, total, mean64, var64, gamma, beta, eps, leaky=slope)
        xd.copy_(y)  # written over x, in x's dtype and memory format
        var = var64.float()
        ctx.eps, ctx.slope, ctx.layer, ctx.state = eps, slope, layer, state
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, var, weight, bias)
        return x

    @staticmethod
    def backward(ctx, grad):
        _bn.no_double_backward("InPlaceABNSync")
        y, var, weight, bias = ctx.saved_tensors  # first: may run checkpoint's recompute
        ctx.state.done()
        y = y.detach()
        g = _g.like(grad.detach().to(y.dtype), y)
        if ctx.slope is not None:  # back through the activation: y and dy before it
            neg = y < 0
            y = _torch.where(neg, y / ctx.slope, y)
            g = _torch.where(neg, g * ctx.slope, g)
        c = y.shape[1]
        gamma, beta = _scale_shift(weight, bias, ctx.eps, c)
        # Sums around beta: sum dy (y - beta) = gamma sum dy x̂. Apply with
        # mean = beta, "inverse std" = 1/gamma and gamma' = gamma^2 s gives
        # x̂ = (y - beta)/gamma and gamma s (dy - sum_dy/M - x̂ diff_gamma/M).
        s = _torch.rsqrt(var + ctx.eps)
        dx, sums = _bn.group_sums_backward(y, g, beta, 1.0 / gamma, gamma * gamma * s, ctx.layer)
        # This process's parameter gradients (DDP reduces them), as SyncBatchNorm.
        dw, db = _param_grads(weight, sums[c:] / gamma, sums[:c])
        return dx, dw, db, None, None, None, None, None, None, None


def _momentum(m):
    """torch's momentum factor for this step (num_batches_tracked counted)."""
    m.num_batches_tracked.add_(1)
    return 1.0 / float(m.num_batches_tracked) if m.momentum is None else m.momentum


def _check_call(m, name, x, residual):
    """Every rule the call's input, residual and the module's tensors must meet."""
    _g.check_input(name, x, m.num_features, m.training, local_batch=m._local_batch())
    _g.check_vectors(name, m.num_features, weight=m.weight, bias=m.bias,
                     running_mean=m.running_mean, running_var=m.running_var)
    if residual is not None:
        _g.check_residual(name, residual)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise _ng.Error("normgrad.torch.%s: the residual is %s %s, expected %s %s like the "
                            "input (rule: residual shape and dtype == input's)"
                            % (name, tuple(residual.shape), residual.dtype, tuple(x.shape),
                               x.dtype))
    if m.training:
        _check_in_place(name, x)


def inplace_abn_module_forward(m, x, residual=None):
    """act(bn(x)) written over x; act(bn(x) + residual) when a residual is given
    (convert's BN -> Add -> LeakyReLU), whose gradient is then returned too.
    Synchronized, the checks run before the group's agreement, and a failed
    one is every rank's error. torch.fx records it as one call."""
    name = type(m).__name__
    layer = m._sync_layer(x)
    error = local = None
    try:
        _check_call(m, name, x, residual)
        if layer is not None and residual is not None:
            raise _ng.Error("normgrad.torch.InPlaceABNSync: a residual is not supported over "
                            "processes (convert fuses BN -> Add -> LeakyReLU into InPlaceABN "
                            "only)")
        if layer is not None:
            local = _bn._local_moments(x.detach())  # first: a recompute needs no collective
    except Exception as e:  # every rule: a synchronized rank still joins the agreement
        if layer is None:
            raise
        error = e
    if layer is not None:
        return m._train_group(x, layer, error, local)
    if not m.training:
        y = m._frozen(x, residual is not None)
        if residual is None:
            return y
        y = y + residual
        return _F.leaky_relu(y, m._slope()) if m._slope() is not None else y
    return m._train(x, residual)


_fx.wrap("inplace_abn_module_forward")


class InPlaceABN(_nn.Module):
    """act(batch_norm(x)) written over x, with mapillary/inplace_abn's signature:
    activation "leaky_relu" (slope activation_param, 0.01 when None) or
    "identity" (which takes no activation_param: one given is an error, not
    ignored). The scale
    is |weight| + eps. In training the forward is in place and the backward
    reads only the output; with frozen statistics (eval) it is in place when
    no gradient is needed, and an ordinary out-of-place computation otherwise.
    momentum=None is a cumulative average, as in torch's BatchNorm."""

    _version = 2  # state_dict version: 2 has num_batches_tracked, as torch's BatchNorm

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 activation="leaky_relu", activation_param=None):
        super().__init__()
        activation_param = _check_activation(type(self).__name__, activation, activation_param)
        self.num_features, self.eps, self.momentum, self.affine = num_features, eps, momentum, affine
        self.activation, self.activation_param = activation, activation_param
        if affine:
            self.weight = _nn.Parameter(_torch.ones(num_features))
            self.bias = _nn.Parameter(_torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.register_buffer("running_mean", _torch.zeros(num_features))
        self.register_buffer("running_var", _torch.ones(num_features))
        self.register_buffer("num_batches_tracked", _torch.tensor(0, dtype=_torch.long))

    def reset_parameters(self):
        self.running_mean.zero_()
        self.running_var.fill_(1)
        self.num_batches_tracked.zero_()
        if self.affine:
            _nn.init.ones_(self.weight)
            _nn.init.zeros_(self.bias)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # A checkpoint without num_batches_tracked (mapillary's InPlaceABN) counts from 0.
        key = prefix + "num_batches_tracked"
        if key not in state_dict:
            state_dict[key] = _torch.tensor(0, dtype=_torch.long)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def _slope(self):
        return self.activation_param if self.activation == "leaky_relu" else None

    def _local_batch(self):
        """Whether this process's batch alone must meet the batch rules."""
        return True

    def _sync_layer(self, x):
        """The synchronized call's _sync.Layer, or None (InPlaceABN never syncs)."""
        return None

    def forward(self, x, residual=None):
        return inplace_abn_module_forward(self, x, residual)

    def __prepare_scriptable__(self):
        raise _ng.Error("normgrad.torch.%s cannot be compiled by TorchScript: it calls normgrad's "
                        "kernels through torch.autograd.Function, which TorchScript does not "
                        "support. Run it in eager mode or trace the model with "
                        "torch.fx.symbolic_trace" % type(self).__name__)

    def _train(self, x, residual=None):
        step = (_ckpt.state_of(self), lambda: _momentum(self), _torch.is_grad_enabled())
        return _InPlaceABNFunction.apply(x, self.weight, self.bias, self.running_mean,
                                         self.running_var, step, self.eps, self._slope(),
                                         residual)

    def _frozen(self, x, no_act=False):
        """bn(x) with the running statistics, then the activation unless no_act."""
        c = x.shape[1]
        gamma, beta = _scale_shift(self.weight, self.bias, self.eps, c)
        needs_grad = _torch.is_grad_enabled() and (
            x.requires_grad or (self.weight is not None and self.weight.requires_grad))
        if needs_grad:
            w = self.weight.abs() + self.eps if self.weight is not None else None
            y = _F.batch_norm(x, self.running_mean, self.running_var, w, self.bias, False, 0.0,
                              self.eps)
            return _F.leaky_relu(y, self._slope()) if self._slope() and not no_act else y
        _check_in_place(type(self).__name__, x)
        fmt, xv = _g.layout(x.detach())
        cg = _g.inference_graph(tuple(xv.shape), fmt, _g.DTYPES[x.dtype], c, self.eps, False)
        _g.run(cg, {_g.X: xv, _g.GAMMA: gamma, _g.BETA: beta,
                    _g.MEAN: _g.f32_vector(self.running_mean),
                    _g.VAR: _g.f32_vector(self.running_var)}, {_g.Y0: xv})
        if self._slope() is not None and not no_act:
            _F.leaky_relu_(x.detach(), self._slope())
        return x

    def extra_repr(self):
        rep = "{num_features}, eps={eps}, momentum={momentum}, affine={affine}, activation={activation}"
        if self.activation == "leaky_relu":
            rep += ", activation_param={activation_param}"
        return rep.format(**self.__dict__)


class InPlaceABNSync(InPlaceABN):
    """InPlaceABN whose statistics cover every process of a torch.distributed
    group (mapillary's InPlaceABNSync; `group` defaults to the world). Without
    an initialized group of more than one process it is InPlaceABN."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 activation="leaky_relu", activation_param=None, group=None):
        super().__init__(num_features, eps, momentum, affine, activation, activation_param)
        self.group = group

    def _local_batch(self):
        return not (self.training and _bn.sync_group(self.group) is not None)

    def _sync_layer(self, x):
        group = _bn.sync_group(self.group) if self.training else None
        if group is None:
            return None
        return _sync.Layer(self, "InPlaceABNSync", group, x, self.eps, self.momentum,
                           self.affine, self._slope())

    def _train_group(self, x, layer, error, local):
        """The synchronized training forward: checkpoint's recompute reuses the
        first pass's group statistics; otherwise the agreement (with this
        rank's `error`), the group's statistics from this rank's `local`
        moments, and the running statistics moved once."""
        state = _ckpt.state_of(self)
        if error is None:
            key, stats = _ckpt.input_key(x), _bn._local_stats(local)
            if state.is_recompute(key, stats, _torch.is_grad_enabled()):
                return _InPlaceABNSyncFunction.apply(x, self.weight, self.bias, self.eps,
                                                     self._slope(), layer, state, *state.extra)
        layer.agree("forward", error)
        total, mean64, var64 = _bn.group_moments(x.detach(), layer, local)
        _g.update_running(self.running_mean, self.running_var, mean64.float(), var64.float(),
                          _momentum(self), total)
        state.remember(key, stats, extra=(total, mean64, var64))
        return _InPlaceABNSyncFunction.apply(x, self.weight, self.bias, self.eps, self._slope(),
                                             layer, state, total, mean64, var64)


for _cls in (InPlaceABN, InPlaceABNSync):
    _cls.__module__ = "normgrad.torch"
