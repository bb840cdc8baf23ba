"""The graphs normgrad.torch compiles, and the tensors it runs them on.

Each batch-norm call runs one compiled graph, cached by everything its code
depends on (shape, layout, dtype, strides, fused epilogue, epsilon):
  - forward training: BatchNormForwardTraining [-> Add] [-> ReLU], one JIT
    partition that computes the statistics and normalises (and adds, clamps);
  - forward with frozen statistics (eval): BatchNormInference;
  - backward: BatchNormTrainingBackward, with ReLUBackward on diff_dst when the
    module fused a ReLU.
  - the synchronized backward's two halves: BatchNormBackwardReduce (this
    process's sums) and BatchNormBackwardApply (on the group's sums);
  - the synchronized forward's two data passes: BatchNormForwardReduce (this
    process's sum, M2 and count) and BatchNormForwardApply (the normalisation
    on the group's, with an optional LeakyReLU).
Outputs come from normgrad's caching pool (``pooled_like``): torch frees them
through their DLPack deleter, which returns the block, so step 2 onward
takes no page faults.

The graphs run by data pointer (``run``), so this module also holds the
input rules every module checks first (``check_input``): a tensor that does
not match the compiled graph must never reach a kernel.

On import it puts the JIT's loops on torch's thread pool
(``share_torch_threads``).
"""
import contextlib
import os

import torch as _torch
import torch.utils.dlpack as _dlpack

import normgrad as _ng


def share_torch_threads():
    """Runs the JIT's loops on OpenMP when torch's CPU ops do (ATen's parallel
    backend) and this build has libgomp: a batch norm then takes the threads
    still spinning from the convolution before it, and as many as torch uses
    (torch.set_num_threads). On its own oneTBB arena it would compete with
    those threads for the cores, 1.5-2x slower per layer on 2 cores. A
    NORMGRAD_THREADING the user set is kept. Returns the runtime in use."""
    if "NORMGRAD_THREADING" not in os.environ and _ng.has_openmp_runtime():
        info = _torch.__config__.parallel_info()
        if "ATen parallel backend: OpenMP" in info:
            _ng.set_thread_runtime("openmp")
    return _ng.thread_runtime()


share_torch_threads()

DTYPES = {_torch.float32: "f32", _torch.bfloat16: "bf16", _torch.float16: "f16"}
CACHE = {}  # graph key -> compiled graph

# Tensor ids, by role. Batch norm's own ports:
X, DY, MEAN, VAR, GAMMA, DX, DGAMMA, DBETA = range(8)
Y, G = 10, 11  # a fused ReLUBackward's dst and incoming gradient
# BatchNormBackwardReduce's outputs, and the group's sums BatchNormBackwardApply reads.
SUM_DY, SUM_DY_XMU, COUNT = 20, 21, 22
GROUP_SUM_DY, GROUP_SUM_DY_XMU, GROUP_COUNT = 23, 24, 25
# The forward's ports: running statistics in and out, beta, dst, batch statistics,
# the residual and the epilogue's outputs.
RM, RV, BETA, Y0, ORM, ORV, BM, BV, RES, ADD_OUT, RELU_OUT = range(30, 41)
# The synchronized forward's parts: this process's sum, M2 and count
# (BatchNormForwardReduce), and the group's (BatchNormForwardApply reads them).
F_SUM, F_M2, F_COUNT, G_SUM, G_M2, G_COUNT = range(50, 56)


class RankError(_ng.Error, ValueError):
    """An input of the wrong rank: a ValueError, as torch's batch norm raises,
    and a normgrad.Error."""


class InputTypeError(_ng.Error, TypeError, AttributeError):
    """An input that is not a tensor: a TypeError, and the AttributeError
    torch's batch norm raises ("'list' object has no attribute 'dim'")."""


class BatchError(_ng.Error, ValueError):
    """One value per channel in training (this process's, or the whole
    group's): a ValueError, as torch's batch norm raises, and a normgrad.Error."""


def check_input(name, x, num_features, training, rank_check=None, local_batch=True,
                empty_ok=False):
    """The rules a batch-norm input must meet before any kernel runs, as errors
    naming the module `name` and the rule. `rank_check` is the module's
    _check_input_dim (torch's ValueError becomes a RankError). Without
    `local_batch` (a synchronized batch norm) this process's batch may be
    empty or hold one value per channel: the group's count is checked instead.
    With `empty_ok` an empty input passes (torch's BatchNorm returns it empty)."""
    if not isinstance(x, _torch.Tensor):
        raise InputTypeError("normgrad.torch.%s: expected a torch.Tensor input, got %s (rule: "
                             "input is a tensor)"
                             % (name, type(x).__name__))
    if x.device.type != "cpu":
        raise _ng.Error("normgrad.torch.%s: input is on %s; normgrad runs on the CPU (rule: "
                        "device == cpu)" % (name, x.device))
    if x.dtype not in DTYPES:
        raise _ng.Error("normgrad.torch.%s: %s data is not supported (rule: dtype in float32, "
                        "bfloat16, float16)" % (name, x.dtype))
    if rank_check is not None:
        try:
            rank_check(x)
        except ValueError as e:
            raise RankError("normgrad.torch.%s: %s (rule: the module's input rank)" % (name, e)) \
                from None
    if x.dim() < 2:
        raise RankError("normgrad.torch.%s: expected input of shape (N, C, ...), got %dD input "
                        "of shape %s (rule: rank >= 2)" % (name, x.dim(), tuple(x.shape)))
    if x.shape[1] != num_features:
        raise _ng.Error("normgrad.torch.%s: input of shape %s has %d channels (dim 1), expected "
                        "num_features=%d (rule: input.shape[1] == num_features)"
                        % (name, tuple(x.shape), x.shape[1], num_features))
    if not local_batch:
        return
    if x.numel() == 0:
        if empty_ok:
            return
        raise _ng.Error("normgrad.torch.%s: input %s is empty; batch statistics need at least one "
                        "element per channel (rule: N * spatial > 0)" % (name, tuple(x.shape)))
    if training and x.numel() // x.shape[1] == 1:
        raise BatchError("normgrad.torch.%s: expected more than 1 value per channel when training, "
                        "got input %s (rule: N * spatial > 1)" % (name, tuple(x.shape)))


def check_vectors(name, num_features, **vectors):
    """Each per-channel tensor given (weight, bias, running_mean, ...; None when
    absent) is a CPU floating-point vector of num_features elements."""
    for role, t in vectors.items():
        if t is None:
            continue
        # The usual case first, in one expression: this runs on every call of every layer.
        if isinstance(t, _torch.Tensor) and t.is_cpu and t.dim() == 1 and \
                t.shape[0] == num_features and t.is_floating_point():
            continue
        if not isinstance(t, _torch.Tensor):
            raise TypeError("normgrad.torch.%s: %s is a %s, expected a tensor or None"
                            % (name, role, type(t).__name__))
        if t.device.type != "cpu":
            raise _ng.Error("normgrad.torch.%s: %s is on %s; normgrad runs on the CPU (rule: "
                            "device == cpu)" % (name, role, t.device))
        if not t.is_floating_point():
            raise _ng.Error("normgrad.torch.%s: %s is %s, expected a floating-point tensor "
                            "(rule: %s dtype)" % (name, role, t.dtype, role))
        if tuple(t.shape) != (num_features,):
            raise _ng.Error("normgrad.torch.%s: %s has shape %s, expected (%d,) (rule: one %s "
                            "value per channel, num_features=%d)"
                            % (name, role, tuple(t.shape), num_features, role, num_features))


def check_residual(name, residual):
    """The residual of a fused BN -> Add: a CPU tensor (its shape and dtype are
    compared with the input's by the caller, which falls back when they differ)."""
    if not isinstance(residual, _torch.Tensor):
        raise TypeError("normgrad.torch.%s: the residual is a %s, expected a tensor"
                        % (name, type(residual).__name__))
    if residual.device.type != "cpu":
        raise _ng.Error("normgrad.torch.%s: the residual is on %s; normgrad runs on the CPU "
                        "(rule: device == cpu)" % (name, residual.device))


def f32_vector(t):
    """A per-channel tensor as the kernels read it (by pointer), dense f32: one
    that is so already is passed as it is, a Parameter too, without the
    detach/float/contiguous calls a per-call path would pay for nothing."""
    if t.dtype == _torch.float32 and t.is_contiguous():
        return t
    return t.detach().float().contiguous()


def like(grad, x):
    """grad in x's memory format (a copy only when they differ)."""
    if channels_last(x):
        mf = _torch.channels_last if x.dim() == 4 else _torch.channels_last_3d
        return grad.contiguous(memory_format=mf)
    return grad.contiguous()


_RECORDERS = []


@contextlib.contextmanager
def recording():
    """Collects the compiled graphs that run inside the block (in order), so a
    caller can ask which kernels one call ran."""
    ran = []
    _RECORDERS.append(ran)
    try:
        yield ran
    finally:
        _RECORDERS.remove(ran)


def update_running(running_mean, running_var, mean, var, factor, n):
    """torch's running-statistics update: momentum `factor` towards the batch's
    mean and variance, the variance unbiased by n / (n - 1). Contiguous f32
    buffers take the C++ update (in f64, as torch's CPU kernel); others torch ops."""
    if running_mean is None:
        return
    c, unbias = mean.numel(), n / max(n - 1, 1)
    f32 = _torch.float32
    if (running_mean.dtype == f32 and running_var.dtype == f32 and mean.dtype == f32 and
            var.dtype == f32 and running_mean.is_contiguous() and running_var.is_contiguous() and
            mean.is_contiguous() and var.is_contiguous()):
        _ng._normgrad._update_running(running_mean.data_ptr(), running_var.data_ptr(),
                                      mean.data_ptr(), var.data_ptr(), c, float(factor),
                                      float(unbias))
        return
    with _torch.no_grad():
        running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
        running_var.mul_(1 - factor).add_((var * unbias).to(running_var.dtype), alpha=factor)


def channels_last(x):
    """Whether x (rank 4 or 5) is in channels_last order and not also plain contiguous."""
    if x.dim() == 4:
        return x.is_contiguous(memory_format=_torch.channels_last) and not x.is_contiguous()
    if x.dim() == 5:
        return x.is_contiguous(memory_format=_torch.channels_last_3d) and not x.is_contiguous()
    return False


def to_nxc(t):
    """(N, C, spatial...) -> the (N, spatial..., C) view."""
    return t.permute(0, *range(2, t.dim()), 1)


def layout(x):
    """('NXC', x viewed N, spatial..., C) for channels_last, else ('NCX', contiguous x)."""
    if channels_last(x):
        return "NXC", to_nxc(x)
    return "NCX", x.contiguous()


# Below this many bytes torch's own allocator is faster than the pool's
# DLPack round trip, and glibc serves such blocks from its heap (no fresh
# mapping, so no page faults in steady state).
POOL_MIN_BYTES = 256 * 1024
# With glibc's heap retained (normgrad.set_heap_retention), blocks up to
# this many bytes come from the heap without page faults too, and torch
# reuses what they free: the pool serves only larger outputs, which glibc
# would map afresh every time.
HEAP_BLOCK_MAX_BYTES = _ng._normgrad.HEAP_BLOCK_MAX_BYTES
# A DLPack capsule to a tensor: torch's own converter where this torch has
# it (torch.utils.dlpack.from_dlpack calls it after asking, in Python,
# whether its argument is a tensor).
_from_capsule = getattr(_torch._C, "_from_dlpack", _dlpack.from_dlpack)


def run(cg, inputs, outputs):
    """Executes `cg` on {id: tensor} dicts by data pointer (normgrad.torch's
    per-call path). The graph was built from these tensors' shapes, strides and
    dtypes (its cache key), which is what the unchecked call relies on."""
    ids = list(inputs) + list(outputs)
    ptrs = [t.data_ptr() for t in inputs.values()] + [t.data_ptr() for t in outputs.values()]
    cg._execute_unchecked(ids, ptrs, len(inputs))
    for ran in _RECORDERS:
        ran.append(cg)


_POOL_PLANS = {}  # (shape, fmt, dtype) -> what pooled_like needs for it


def _pool_plan(shape, fmt, dtype):
    """(bytes, shape list, dense strides in fmt's order, normgrad dtype name,
    torch memory format) of a tensor of `shape`: made once per shape, since
    a call per layer per step would otherwise redo them in Python."""
    key = (shape, fmt, dtype)
    plan = _POOL_PLANS.get(key)
    if plan is None:
        rank = len(shape)
        if fmt == "NXC":
            order = [0] + list(range(2, rank)) + [1]  # memory order, outermost first
            mf = _torch.channels_last if rank == 4 else _torch.channels_last_3d
        else:
            order = list(range(rank))
            mf = _torch.contiguous_format
        strides = [0] * rank
        step = 1
        for d in reversed(order):
            strides[d] = step
            step *= shape[d]
        nbytes = step * (_torch.finfo(dtype).bits // 8)
        plan = _POOL_PLANS[key] = (nbytes, list(shape), strides, DTYPES[dtype], mf)
    return plan


def pooled_like(x, fmt, dtype=None):
    """A tensor of x's shape from the caching pool, dense in `fmt`'s order
    (small ones, and up to 32 MiB with glibc's heap retained, from torch's
    allocator)."""
    nbytes, shape, strides, dt, mf = _pool_plan(x.shape, fmt, dtype or x.dtype)
    if nbytes < POOL_MIN_BYTES or (nbytes <= HEAP_BLOCK_MAX_BYTES and _ng.heap_retention()):
        return _torch.empty(shape, dtype=dtype or x.dtype, memory_format=mf)
    # The capsule straight to torch: torch.utils.dlpack.from_dlpack first
    # asks, in Python, whether its argument is a tensor.
    return _from_capsule(_ng._pooled_empty(shape, strides, dt))


def view_as_fmt(t, fmt):
    return to_nxc(t) if fmt == "NXC" else t


def _compiled(key, build):
    cg = CACHE.get(key)
    if cg is None:
        g = _ng.Graph()
        build(g)
        g.finalize()
        cg = CACHE[key] = _ng.compile(g)
    return cg


def _t(i, dt, shape, strides=None):
    if strides is None:
        return _ng.LogicalTensor(i, dt, list(shape))
    return _ng.LogicalTensor(i, dt, list(shape), list(strides))


def forward_graph(shape, fmt, dt, c, affine, eps, residual, relu, leaky=None):
    """BatchNormForwardTraining [-> Add(residual)] [-> ReLU, or LeakyReLU(leaky) when
    leaky is its alpha]; dst is the last op's output."""
    def build(g):
        ins = [_t(X, dt, shape), _t(RM, "f32", [c]), _t(RV, "f32", [c])]
        if affine:
            ins += [_t(GAMMA, "f32", [c]), _t(BETA, "f32", [c])]
        outs = [_t(Y0, dt, shape)] + [_t(i, "f32", [c]) for i in (ORM, ORV, BM, BV)]
        g.add_op("BatchNormForwardTraining", ins, outs,
                 {"epsilon": float(eps), "data_format": fmt}, id=0, name="bn_fwd")
        last = Y0
        if residual:
            g.add_op("Add", [_t(Y0, dt, shape), _t(RES, dt, shape)], [_t(ADD_OUT, dt, shape)], {},
                     id=1, name="add")
            last = ADD_OUT
        if relu and leaky is not None:
            g.add_op("LeakyReLU", [_t(last, dt, shape)], [_t(RELU_OUT, dt, shape)],
                     {"alpha": float(leaky)}, id=2, name="leaky_relu")
        elif relu:
            g.add_op("ReLU", [_t(last, dt, shape)], [_t(RELU_OUT, dt, shape)], {}, id=2,
                     name="relu")
    return _compiled(("fwd", tuple(shape), fmt, dt, affine, float(eps), residual, relu, leaky),
                     build)


def forward_output_id(residual, relu):
    return RELU_OUT if relu else (ADD_OUT if residual else Y0)


def inference_graph(shape, fmt, dt, c, eps, relu, residual=False):
    """BatchNormInference [-> Add(residual)] [-> ReLU] on frozen statistics;
    dst is the last op's output (forward_output_id)."""
    def build(g):
        ins = [_t(X, dt, shape), _t(GAMMA, "f32", [c]), _t(BETA, "f32", [c]),
               _t(MEAN, "f32", [c]), _t(VAR, "f32", [c])]
        g.add_op("BatchNormInference", ins, [_t(Y0, dt, shape)],
                 {"epsilon": float(eps), "data_format": fmt}, id=0, name="bn_inf")
        last = Y0
        if residual:
            g.add_op("Add", [_t(Y0, dt, shape), _t(RES, dt, shape)], [_t(ADD_OUT, dt, shape)], {},
                     id=1, name="add")
            last = ADD_OUT
        if relu:
            g.add_op("ReLU", [_t(last, dt, shape)], [_t(RELU_OUT, dt, shape)], {}, id=2,
                     name="relu")
    return _compiled(("inf", tuple(shape), fmt, dt, float(eps), relu, residual), build)


def backward_graph(shape, fmt, dt, c, affine, training, fuse_relu, eps, dy_strides,
                   masked_out=False):
    """BatchNormTrainingBackward on (mean, biased variance, eps); with fuse_relu,
    diff_dst is ReLUBackward(dst, grad) (use_dst: the module's output is > 0
    where the ReLU passed), and with masked_out that masked gradient (DY) is
    an output too, for a residual (the JIT writes it as a side output).
    `dy_strides` are the gradient's, when it arrived in another memory format
    than src (the JIT walks or stages it; no copy)."""
    def build(g):
        dy_id = DY
        if fuse_relu:
            g.add_op("ReLUBackward", [_t(Y, dt, shape), _t(G, dt, shape, dy_strides)],
                     [_t(DY, dt, shape)], {"use_dst": True}, id=1, name="relu_bwd")
        ins = [_t(X, dt, shape), _t(dy_id, dt, shape, None if fuse_relu else dy_strides),
               _t(MEAN, "f32", [c]), _t(VAR, "f32", [c])]
        outs = [_t(DX, dt, shape)]
        if affine:
            ins.append(_t(GAMMA, "f32", [c]))
            outs += [_t(DGAMMA, "f32", [c]), _t(DBETA, "f32", [c])]
        g.add_op("BatchNormTrainingBackward", ins, outs,
                 {"epsilon": float(eps), "data_format": fmt, "is_training": bool(training)},
                 id=0, name="bn_bwd")
        if fuse_relu and masked_out:
            g.set_output_ports([DY] + [o.id for o in outs])
    key = ("bwd", tuple(shape), fmt, dt, affine, bool(training), fuse_relu, float(eps),
           None if dy_strides is None else tuple(dy_strides), bool(fuse_relu and masked_out))
    return _compiled(key, build)


def from_dst_graph(shape, fmt, dt, c, eps, alpha, residual=False):
    """BatchNormTrainingBackwardFromDst: diff_src, diff_gamma, diff_beta from the
    forward's dst (alpha: leaky_relu's, None: identity; residual: dst was
    act(bn(src) + residual))."""
    def build(g):
        ins = [_t(Y, dt, shape), _t(DY, dt, shape), _t(VAR, "f32", [c]), _t(GAMMA, "f32", [c]),
               _t(BETA, "f32", [c])] + ([_t(RES, dt, shape)] if residual else [])
        outs = [_t(DX, dt, shape), _t(DGAMMA, "f32", [c]), _t(DBETA, "f32", [c])]
        attrs = {"epsilon": float(eps), "data_format": fmt}
        if alpha is not None:
            attrs.update(activation="leaky_relu", alpha=float(alpha))
        g.add_op("BatchNormTrainingBackwardFromDst", ins, outs, attrs, id=0, name="abn_bwd")
    return _compiled(("from_dst", tuple(shape), fmt, dt, float(eps), alpha, residual), build)


def reduce_graph(shape, fmt, dt, c):
    """BatchNormBackwardReduce: this process's sum(dy), sum(dy (x - mean)) and count."""
    def build(g):
        g.add_op("BatchNormBackwardReduce",
                 [_t(X, dt, shape), _t(DY, dt, shape), _t(MEAN, "f32", [c])],
                 [_t(SUM_DY, "f32", [c]), _t(SUM_DY_XMU, "f32", [c]), _t(COUNT, "s64", [1])],
                 {"data_format": fmt}, id=0, name="reduce")
    return _compiled(("reduce", tuple(shape), fmt, dt), build)


def apply_graph(shape, fmt, dt, c, affine):
    """BatchNormBackwardApply on the group's sums; VAR holds the inverse std."""
    def build(g):
        ins = [_t(X, dt, shape), _t(DY, dt, shape), _t(MEAN, "f32", [c]), _t(VAR, "f32", [c]),
               _t(GROUP_SUM_DY, "f32", [c]), _t(GROUP_SUM_DY_XMU, "f32", [c]),
               _t(GROUP_COUNT, "s64", [1])]
        if affine:
            ins.append(_t(GAMMA, "f32", [c]))
        g.add_op("BatchNormBackwardApply", ins, [_t(DX, dt, shape)],
                 {"epsilon": 0.0, "data_format": fmt, "variance_is_inv_std": True}, id=0,
                 name="apply")
    return _compiled(("apply", tuple(shape), fmt, dt, affine), build)


def forward_reduce_graph(shape, fmt, dt, c):
    """BatchNormForwardReduce: this process's per-channel sum and M2 about its
    own mean (f64, from the JIT's shifted sums) and its count."""
    def build(g):
        g.add_op("BatchNormForwardReduce", [_t(X, dt, shape)],
                 [_t(F_SUM, "f64", [c]), _t(F_M2, "f64", [c]), _t(F_COUNT, "s64", [1])],
                 {"data_format": fmt}, id=0, name="fwd_reduce")
    return _compiled(("fwd_reduce", tuple(shape), fmt, dt), build)


def forward_apply_graph(shape, fmt, dt, c, affine, eps, leaky=None, relu=False):
    """BatchNormForwardApply on the group's sum, M2 and count [-> LeakyReLU(leaky),
    or ReLU with relu]: the normalisation with the mean as hi + lo, as the
    whole forward does."""
    def build(g):
        ins = [_t(X, dt, shape), _t(RM, "f32", [c]), _t(RV, "f32", [c]), _t(G_SUM, "f64", [c]),
               _t(G_M2, "f64", [c]), _t(G_COUNT, "s64", [1])]
        if affine:
            ins += [_t(GAMMA, "f32", [c]), _t(BETA, "f32", [c])]
        outs = [_t(Y0, dt, shape)] + [_t(i, "f32", [c]) for i in (ORM, ORV, BM, BV)]
        g.add_op("BatchNormForwardApply", ins, outs, {"epsilon": float(eps), "data_format": fmt},
                 id=0, name="fwd_apply")
        if leaky is not None:
            g.add_op("LeakyReLU", [_t(Y0, dt, shape)], [_t(RELU_OUT, dt, shape)],
                     {"alpha": float(leaky)}, id=2, name="leaky_relu")
        elif relu:
            g.add_op("ReLU", [_t(Y0, dt, shape)], [_t(RELU_OUT, dt, shape)], {}, id=2,
                     name="relu")
    return _compiled(("fwd_apply", tuple(shape), fmt, dt, affine, float(eps), leaky, relu),
                     build)


_CONSTANTS = {}


def constant(c, value):
    """A read-only f32 vector of C `value`s, shared by every call."""
    key = (c, value)
    t = _CONSTANTS.get(key)
    if t is None:
        t = _torch.full((c,), value, dtype=_torch.float32)
        if t.data_ptr() == 0:  # made under a tracer's fake-tensor mode: not kept
            return t
        _CONSTANTS[key] = t
    return t
