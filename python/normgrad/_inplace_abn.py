"""In-place activated batch norm (InPlace-ABN) on normgrad: the module, its
synchronized twin and the model conversion.

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
"""
import operator
import warnings

import torch as _torch
import torch.distributed as _dist
import torch.nn as _nn
import torch.nn.functional as _F

import normgrad as _ng

from . import _torch_graphs as _g
from .torch import _apply_graph, _check, _like, _reduce_graph, _SUM_DY, _SUM_DYXM, _COUNT

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
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, slope, name,
                residual=None):
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
            if residual.shape != x.shape or residual.dtype != x.dtype:
                raise _ng.Error("normgrad.torch.%s: the residual is %s %s, expected %s %s like "
                                "the input" % (name, tuple(residual.shape), residual.dtype,
                                               tuple(x.shape), x.dtype))
            residual = _like(residual.detach(), x)  # in x's memory format (a copy if not)
            inputs[_g.RES] = _g.view_as_fmt(residual, fmt)
        scratch = _torch.empty(2 * c, dtype=_torch.float32)
        _g.run(cg, inputs, {_g.forward_output_id(has_res, leaky): xv, _g.ORM: scratch[:c],
                            _g.ORV: scratch[c:], _g.BM: mean, _g.BV: var})
        _g.update_running(running_mean, running_var, mean, var, momentum, x.numel() // c)
        ctx.eps, ctx.slope, ctx.has_res = eps, slope, has_res
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, var, weight, bias, residual)
        return x

    @staticmethod
    def backward(ctx, grad):
        y, var, weight, bias, residual = ctx.saved_tensors
        y = y.detach()
        fmt, yv = _g.layout(y)
        dt = _g.DTYPES[y.dtype]
        c = y.shape[1]
        g = _like(grad.detach().to(y.dtype), y)
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
        return dx, dw, db, None, None, None, None, None, None, d_residual


class _InPlaceABNSyncFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, slope, group):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        xd = x.detach()
        xf = xd.double()
        stats = _torch.cat([xf.sum(dims), (xf * xf).sum(dims),
                            _torch.tensor([float(xd.numel() // c)], dtype=_torch.float64)])
        _dist.all_reduce(stats, group=group)
        n = stats[-1].item()
        mean64 = stats[:c] / n
        var64 = (stats[c:2 * c] / n - mean64 * mean64).clamp_min(0)
        mean, var = mean64.float(), var64.float()
        _g.update_running(running_mean, running_var, mean, var, momentum, n)
        fmt, xv = _g.layout(xd)
        gamma, beta = _scale_shift(weight, bias, eps, c)
        cg = _g.inference_graph(tuple(xv.shape), fmt, _g.DTYPES[x.dtype], c, eps, False)
        _g.run(cg, {_g.X: xv, _g.GAMMA: gamma, _g.BETA: beta, _g.MEAN: mean, _g.VAR: var},
               {_g.Y0: xv})
        if slope is not None:
            _F.leaky_relu_(xd, slope)
        ctx.eps, ctx.slope, ctx.group = eps, slope, group
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, var, weight, bias)
        return x

    @staticmethod
    def backward(ctx, grad):
        y, var, weight, bias = ctx.saved_tensors
        y = y.detach()
        g = _like(grad.detach().to(y.dtype), y)
        if ctx.slope is not None:  # back through the activation: y and dy before it
            neg = y < 0
            y = _torch.where(neg, y / ctx.slope, y)
            g = _torch.where(neg, g * ctx.slope, g)
        fmt, yv = _g.layout(y)
        gv = _g.view_as_fmt(_like(g, y), fmt)
        dt = _g.DTYPES[y.dtype]
        c = y.shape[1]
        shape = tuple(yv.shape)
        gamma, beta = _scale_shift(weight, bias, ctx.eps, c)
        sums = _torch.empty(2 * c, dtype=_torch.float32)
        count = _torch.empty(1, dtype=_torch.int64)
        # Sums around beta: sum dy (y - beta) = gamma sum dy x̂.
        _reduce_graph(shape, fmt, dt, c).execute(
            {_g.X: yv, _g.DY: gv, _g.MEAN: beta},
            {_SUM_DY: sums[:c], _SUM_DYXM: sums[c:], _COUNT: count})
        packed = _torch.cat([sums.double(), count.double()])
        _dist.all_reduce(packed, group=ctx.group)
        g_sums = packed[:2 * c].float()
        g_count = packed[2 * c:].round().to(_torch.int64)
        # Apply with mean = beta, "inverse std" = 1/gamma and gamma' = gamma^2 s gives
        # x̂ = (y - beta)/gamma and gamma s (dy - sum_dy/M - x̂ diff_gamma/M).
        s = _torch.rsqrt(var + ctx.eps)
        dx = _g.pooled_like(y, fmt)
        _apply_graph(shape, fmt, dt, c, True).execute(
            {_g.X: yv, _g.DY: gv, _g.MEAN: beta, _g.VAR: (1.0 / gamma).contiguous(),
             _SUM_DY + 10: g_sums[:c].contiguous(), _SUM_DYXM + 10: g_sums[c:].contiguous(),
             _COUNT + 10: g_count, _g.GAMMA: (gamma * gamma * s).contiguous()},
            {_g.DX: _g.view_as_fmt(dx, fmt)})
        # This process's parameter gradients (DDP reduces them), as SyncBatchNorm.
        dw, db = _param_grads(weight, sums[c:] / gamma, sums[:c])
        return dx, dw, db, None, None, None, None, None, None


class InPlaceABN(_nn.Module):
    """act(batch_norm(x)) written over x, with mapillary/inplace_abn's signature:
    activation "leaky_relu" (slope activation_param, 0.01 when None) or
    "identity" (which takes no activation_param: one given is an error, not
    ignored). The scale
    is |weight| + eps. In training the forward is in place and the backward
    reads only the output; with frozen statistics (eval) it is in place when
    no gradient is needed, and an ordinary out-of-place computation otherwise."""

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

    def reset_parameters(self):
        self.running_mean.zero_()
        self.running_var.fill_(1)
        if self.affine:
            _nn.init.ones_(self.weight)
            _nn.init.zeros_(self.bias)

    def _slope(self):
        return self.activation_param if self.activation == "leaky_relu" else None

    def forward(self, x, residual=None):
        """act(bn(x)) written over x; act(bn(x) + residual) when a residual is given
        (convert's BN -> Add -> LeakyReLU), whose gradient is then returned too."""
        name = type(self).__name__
        _check(name, x, self.training)
        if x.shape[1] != self.num_features:
            raise _ng.Error("normgrad.torch.%s: input has %d channels, expected num_features=%d"
                            % (name, x.shape[1], self.num_features))
        if not self.training:
            y = self._frozen(x, residual is not None)
            if residual is None:
                return y
            y = y + residual
            return _F.leaky_relu(y, self._slope()) if self._slope() is not None else y
        _check_in_place(name, x)
        return self._train(x, residual)

    def _train(self, x, residual=None):
        return _InPlaceABNFunction.apply(x, self.weight, self.bias, self.running_mean,
                                         self.running_var, self.momentum, self.eps, self._slope(),
                                         type(self).__name__, residual)

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
                    _g.MEAN: self.running_mean.detach().float().contiguous(),
                    _g.VAR: self.running_var.detach().float().contiguous()}, {_g.Y0: xv})
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

    def _train(self, x, residual=None):
        group = self.group or (_dist.group.WORLD if _dist.is_initialized() else None)
        if group is None or _dist.get_world_size(group) < 2:
            return super()._train(x, residual)
        if residual is not None:
            raise _ng.Error("normgrad.torch.InPlaceABNSync: a residual is not supported over "
                            "processes (convert fuses BN -> Add -> LeakyReLU into InPlaceABN only)")
        return _InPlaceABNSyncFunction.apply(x, self.weight, self.bias, self.running_mean,
                                             self.running_var, self.momentum, self.eps,
                                             self._slope(), group)


# --- convert(model, inplace_abn=True) ------------------------------------------------


def _leaky_slope(node, modules, bn_node):
    """leaky_relu's slope when `node` is a LeakyReLU applied to bn_node alone, else None."""
    if node.op == "call_module" and type(modules.get(node.target)) is _nn.LeakyReLU:
        return modules[node.target].negative_slope if node.args == (bn_node,) else None
    if node.op == "call_function" and node.target in (_F.leaky_relu, _F.leaky_relu_):
        if not node.args or node.args[0] is not bn_node:
            return None
        slope = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
        return slope if isinstance(slope, float) else None
    return None


def _modifies_input(node, modules):
    """Whether `node` may write over its first argument (in-place ops)."""
    if node.op == "call_method":
        return node.target.endswith("_")
    if node.op == "call_function":
        return node.target is operator.iadd or getattr(node.target, "__name__", "").endswith("_")
    if node.op == "call_module":
        return bool(getattr(modules.get(node.target), "inplace", False))
    return False


def _abn_like(bn, activation, slope):
    """An InPlaceABN with `bn`'s parameters, buffers, dtype and mode."""
    abn = InPlaceABN(bn.num_features, eps=bn.eps,
                     momentum=0.1 if bn.momentum is None else bn.momentum, affine=bn.affine,
                     activation=activation, activation_param=slope)
    if bn.affine and bool((bn.weight < 0).any()):
        warnings.warn("normgrad.torch.convert(inplace_abn=True): a batch norm has negative "
                      "weights; InPlaceABN scales by |weight| + eps", stacklevel=4)
    with _torch.no_grad():
        if bn.affine:
            abn.weight.copy_(bn.weight)
            abn.bias.copy_(bn.bias)
        if bn.running_mean is not None:
            abn.running_mean.copy_(bn.running_mean)
            abn.running_var.copy_(bn.running_var)
    return abn.to(bn.weight.dtype if bn.affine else abn.running_mean.dtype).train(bn.training)


def _set_module(root, target, module):
    parent, _, name = target.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def convert_inplace_abn(model, bn_types):
    """Traces `model` with torch.fx and swaps BN -> LeakyReLU for
    InPlaceABN(leaky_relu) and other batch norms for InPlaceABN(identity)
    where writing over the BN's input is safe. Returns (GraphModule, swapped,
    reasons for the ones left), or None when fx cannot trace the model."""
    import torch.fx as fx

    from ._torch_fx import _is_add, _is_relu, module_calls, trace
    try:
        gm = trace(model, bn_types)
    except Exception as e:  # fx raises many kinds (TraceError, TypeError, ...)
        warnings.warn("normgrad.torch.convert(inplace_abn=True): torch.fx cannot trace %s (%s: %s);"
                      " no InPlaceABN swapped" % (type(model).__name__, type(e).__name__, e),
                      stacklevel=3)
        return None
    modules = dict(gm.named_modules())
    calls = module_calls(gm)
    swapped, left = 0, {}

    def leave(why):
        left[why] = left.get(why, 0) + 1

    for node in list(gm.graph.nodes):
        bn = modules.get(node.target) if node.op == "call_module" else None
        if not isinstance(bn, bn_types):
            continue
        users = list(node.users)
        src = node.args[0] if len(node.args) == 1 and not node.kwargs else None
        if calls[node.target] != 1 or not isinstance(src, fx.Node) or len(src.users) != 1:
            leave("its input is read elsewhere too (or it is called twice), so it cannot be "
                  "overwritten")
            continue
        slope = _leaky_slope(users[0], modules, node) if len(users) == 1 else None
        if slope is not None and slope <= 0:
            slope = None
        # BN -> Add -> LeakyReLU (torchvision's Bottleneck): one InPlaceABN with the
        # residual, so neither the BN's output nor the sum is kept for the backward.
        add = users[0] if len(users) == 1 and _is_add(users[0]) else None
        other = None
        if add is not None and len(add.users) == 1:
            other = add.args[1] if add.args[0] is node else add.args[0]
            act = next(iter(add.users))
            res_slope = _leaky_slope(act, modules, add)
            if isinstance(other, fx.Node) and other is not node and res_slope and res_slope > 0:
                _set_module(gm, node.target, _abn_like(bn, "leaky_relu", res_slope))
                with gm.graph.inserting_before(add):
                    fused = gm.graph.call_module(node.target, (src, other))
                act.replace_all_uses_with(fused)
                for n in (act, add, node):
                    gm.graph.erase_node(n)
                swapped += 1
                continue
        if slope is None and any(_is_relu(u, modules) for u in users):
            leave("ReLU has no inverse, so the backward cannot start from its output")
            continue
        if slope is None and any(_modifies_input(u, modules) and u.target is not operator.iadd
                                 for u in users):
            leave("an in-place op overwrites its output, which InPlaceABN saves")
            continue
        _set_module(gm, node.target,
                    _abn_like(bn, "leaky_relu" if slope is not None else "identity", slope))
        if slope is not None:
            users[0].replace_all_uses_with(node)
            gm.graph.erase_node(users[0])
        else:
            for u in users:  # `out += identity` on the saved output: out of place
                if u.op == "call_function" and u.target is operator.iadd:
                    u.target = operator.add
        swapped += 1
    gm.graph.lint()
    gm.recompile()
    return gm, swapped, left

