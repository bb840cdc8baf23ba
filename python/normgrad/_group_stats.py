"""The synchronized batch norms' statistics and data passes (SyncBatchNorm and
InPlaceABNSync, normgrad.torch): each process's moments on the JIT, merged
exactly over the group by Chan's formula; the normalisation on the group's
statistics; and the backward's sums, all_reduced between Reduce and Apply.
The collectives go through _sync.Layer (agreement first, bounded waits)."""
import torch as _torch

import normgrad as _ng

from . import _torch_graphs as _g


def _local_moments(x):
    """This process's count and per-channel mean and M2 = sum (x - mean)^2, in
    f64: BatchNormForwardReduce on the JIT, from sums shifted by each
    channel's first values (so data far from zero does not cancel: a constant
    channel has M2 = 0 exactly), accumulated in f32 per fixed chunk and in f64
    across chunks."""
    c = x.shape[1]
    n = x.numel() // c if c else 0
    if n == 0:
        z = _torch.zeros(c, dtype=_torch.float64)
        return 0, z, z.clone()
    fmt, xv = _g.layout(x.detach())
    sums = _torch.empty(2 * c, dtype=_torch.float64)
    count = _torch.zeros(1, dtype=_torch.int64)
    _g.run(_g.forward_reduce_graph(tuple(xv.shape), fmt, _g.DTYPES[x.dtype], c), {_g.X: xv},
           {_g.F_SUM: sums[:c], _g.F_M2: sums[c:], _g.F_COUNT: count})
    return n, sums[:c] / n, sums[c:]


def group_moments(x, layer, local=None):
    """The group's count N and per-channel mean and biased variance (f64),
    merged exactly from every process's (count, mean, M2) by Chan's parallel
    formula in two all_reduce sums over `layer`'s group (a _sync.Layer, whose
    agreement ran): first the counts and count-weighted means (the global
    mean), then each process's M2 + n (its mean - the global mean)^2. Every
    process gets the same bits. `local`: this process's (n, mean, M2) when
    already computed."""
    c = layer.channels
    error = None
    try:
        n, mean_r, m2_r = local if local is not None else _local_moments(x)
    except Exception as e:  # still joins the sums, with its error
        error, n = e, 0
        mean_r = m2_r = _torch.zeros(c, dtype=_torch.float64)
    first = _torch.cat([_torch.tensor([float(n)], dtype=_torch.float64), n * mean_r])
    layer.checked_sum(first, error, "forward", "the counts and means (%d doubles)" % (c + 1))
    total = first[0].item()
    name = layer.kind
    if total == 0:
        raise _ng.Error("normgrad.torch.%s: every process's batch is empty; batch statistics "
                        "need at least one value per channel (rule: group count > 0)" % name)
    if total == 1:
        raise _g.BatchError("normgrad.torch.%s: expected more than 1 value per channel when "
                            "training, got 1 over the whole group (rule: group count > 1)"
                            % name)
    mean = first[1:1 + c] / total
    second = m2_r + n * (mean_r - mean) ** 2
    layer.checked_sum(second, None, "forward", "the M2 sums (%d doubles)" % c)
    return total, mean, second / total


def split_mean(mean64):
    """The f64 mean as hi + lo, two f32 (x - hi is exact for x near the mean)."""
    hi = mean64.float()
    return hi, (mean64 - hi.double()).float()


def group_sums_backward(x, grad, mean, invstd, gamma, layer, mean_lo=None):
    """The synchronized backward's data path: this process's sums (Reduce), one
    all_reduce of the two sums and the count (f64), the input gradient
    (Apply). `mean` is the f32 mean the kernels subtract; `mean_lo` the rest
    of the forward's mean (hi + lo), folded into the sums so the gradient
    uses the mean at full precision:
      sum dy (x - mean) = sum dy (x - hi) - lo sum dy, and Apply's
      (x - hi) s^2 S / M term is corrected through sum_dy' = sum_dy - lo s^2 S.
    Returns (dx, this process's [sum dy, sum dy (x - mean)], f64). `layer` is
    the _sync.Layer whose group sums them (its backward agreement first), or
    None: the sums are this process's alone (the single-process module on
    data far from zero)."""
    if layer is not None:
        layer.agree("backward", None)
    fmt, xv = _g.layout(x)
    dt = _g.DTYPES[x.dtype]
    c = x.shape[1]
    shape = tuple(xv.shape)
    sums = _torch.zeros(2 * c, dtype=_torch.float32)
    count = _torch.zeros(1, dtype=_torch.int64)
    mean = mean.contiguous()
    empty = x.numel() == 0  # this process's batch is empty: it still joins the all_reduce
    error = None
    try:
        gv = _g.view_as_fmt(_g.like(grad.to(x.dtype), x), fmt)
        if not empty:
            _g.run(_g.reduce_graph(shape, fmt, dt, c), {_g.X: xv, _g.DY: gv, _g.MEAN: mean},
                   {_g.SUM_DY: sums[:c], _g.SUM_DY_XMU: sums[c:], _g.COUNT: count})
    except Exception as e:  # still joins the sums, with its error
        if layer is None:
            raise
        error = e
        sums.zero_()
        count.zero_()
    local = sums.double()
    if mean_lo is not None:
        local[c:] -= mean_lo.double() * local[:c]
    packed = _torch.cat([local, count.double()])
    if layer is not None:  # None: one process, its own sums are the batch's
        layer.checked_sum(packed, error, "backward",
                          "the gradient sums (%d doubles)" % packed.numel())
    g_sum_dy, g_sum_dyxm = packed[:c], packed[c:2 * c]
    if mean_lo is not None:
        s = invstd.double()
        g_sum_dy = g_sum_dy - mean_lo.double() * s * s * g_sum_dyxm
    g_count = packed[2 * c:].round().to(_torch.int64)
    dx = _g.pooled_like(x, fmt)
    if empty:
        return dx, local
    inputs = {_g.X: xv, _g.DY: gv, _g.MEAN: mean, _g.VAR: invstd.float().contiguous(),
              _g.GROUP_SUM_DY: g_sum_dy.float().contiguous(),
              _g.GROUP_SUM_DY_XMU: g_sum_dyxm.float().contiguous(), _g.GROUP_COUNT: g_count}
    if gamma is not None:
        inputs[_g.GAMMA] = gamma.contiguous()
    _g.run(_g.apply_graph(shape, fmt, dt, c, gamma is not None), inputs,
           {_g.DX: _g.view_as_fmt(dx, fmt)})
    return dx, local


def normalize_group(x, total, mean64, var64, gamma, beta, eps, leaky=None, relu=False):
    """y = gamma (x - mean) / sqrt(var + eps) + beta [then leaky_relu(leaky), or relu] on
    the JIT (BatchNormForwardApply), from the group's count and f64 mean and
    variance, in x's dtype and memory format. The kernel subtracts the mean as
    hi + lo, so data far from zero keeps its low bits."""
    xd = x.detach()
    fmt, xv = _g.layout(xd)
    c = x.shape[1]
    y = _g.pooled_like(xd, fmt)
    if x.numel() == 0:  # this process's slice is empty: nothing to normalise
        return y
    inputs = {_g.X: xv, _g.RM: _g.constant(c, 0.0), _g.RV: _g.constant(c, 1.0),
              _g.G_SUM: (mean64 * total).contiguous(), _g.G_M2: (var64 * total).contiguous(),
              _g.G_COUNT: _torch.tensor([int(round(total))], dtype=_torch.int64)}
    affine = gamma is not None
    if affine:
        inputs[_g.GAMMA] = _g.f32_vector(gamma)
        inputs[_g.BETA] = _g.f32_vector(beta) if beta is not None else _g.constant(c, 0.0)
    scratch = _torch.empty(4 * c, dtype=_torch.float32)  # the op's statistics outputs, unused
    out = _g.RELU_OUT if leaky is not None or relu else _g.Y0
    _g.run(_g.forward_apply_graph(tuple(xv.shape), fmt, _g.DTYPES[x.dtype], c, affine, eps,
                                  leaky, relu),
           inputs, {out: _g.view_as_fmt(y, fmt), _g.ORM: scratch[:c], _g.ORV: scratch[c:2 * c],
                    _g.BM: scratch[2 * c:3 * c], _g.BV: scratch[3 * c:]})
    return y


def _local_stats(local):
    """This process's (n, mean, M2) as tensors, for a recompute's comparison."""
    n, mean_r, m2_r = local
    return (_torch.tensor([float(n)], dtype=_torch.float64), mean_r, m2_r)
