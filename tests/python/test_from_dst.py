"""BatchNormTrainingBackwardFromDst (the backward recomputed from the forward's
output) on ref and the JIT. The expected values are computed independently:
the ordinary training backward from src in float64 NumPy, with the gradient
taken through leaky_relu at the pre-activation value, so recovering src from
dst is what is under test."""
import numpy as np
import pytest

import normgrad

try:
    import torch  # bf16 conversions only
except ImportError:  # pragma: no cover
    torch = None

EPS = 1e-5


def from_dst_graph(shape, fmt, dt="f32", activation="leaky_relu", alpha=0.01, outputs=3):
    c = shape[1] if fmt == "NCX" else shape[-1]
    T = normgrad.LogicalTensor
    g = normgrad.Graph()
    ins = [T(0, dt, shape), T(1, dt, shape), T(2, "f32", [c]), T(3, "f32", [c]), T(4, "f32", [c])]
    outs = [T(5, dt, shape)] + ([T(6, "f32", [c]), T(7, "f32", [c])] if outputs == 3 else [])
    attrs = {"epsilon": EPS, "data_format": fmt, "activation": activation}
    if activation == "leaky_relu":
        attrs["alpha"] = alpha
    g.add_op("BatchNormTrainingBackwardFromDst", ins, outs, attrs)
    g.finalize()
    return g


def to_dtype(a, dt):
    """Rounds a float64 array to dt and returns (the stored array, its value in float64)."""
    if dt == "f32":
        s = a.astype(np.float32)
        return s, s.astype(np.float64)
    if dt == "f16":
        s = a.astype(np.float16)
        return s, s.astype(np.float64)
    t = torch.from_numpy(a).to(torch.bfloat16)
    return t, t.double().numpy()


def problem(shape, axis, alpha, dt, seed=0):
    """src, its batch statistics, gamma, beta, dst = act(bn(src)) and diff_dst,
    plus the float64 backward computed from src."""
    rng = np.random.default_rng(seed)
    c = shape[axis]
    red = tuple(i for i in range(len(shape)) if i != axis)
    bshape = [1] * len(shape)
    bshape[axis] = -1
    x = rng.normal(0.3, 2.0, shape)
    mean, var = x.mean(axis=red), x.var(axis=red)
    gamma = rng.uniform(0.5, 1.5, c) * rng.choice([-1.0, 1.0], c)
    beta = rng.uniform(-0.5, 0.5, c)
    s = 1.0 / np.sqrt(var + EPS)
    pre = gamma.reshape(bshape) * (x - mean.reshape(bshape)) * s.reshape(bshape) + beta.reshape(bshape)
    y = np.where(pre >= 0, pre, alpha * pre)
    dst, dst64 = to_dtype(y, dt)
    ddst, ddst64 = to_dtype(rng.uniform(-1, 1, shape), dt)
    # Expected: the ordinary backward from src, the gradient through act at pre.
    dy = np.where(pre >= 0, ddst64, alpha * ddst64)
    m = x.size / c
    xhat = (x - mean.reshape(bshape)) * s.reshape(bshape)
    dbeta = dy.sum(axis=red)
    dgamma = (dy * xhat).sum(axis=red)
    dx = (gamma * s).reshape(bshape) * (dy - dbeta.reshape(bshape) / m - xhat * dgamma.reshape(bshape) / m)
    f32 = lambda v: v.astype(np.float32)
    inputs = {0: dst, 1: ddst, 2: f32(var), 3: f32(gamma), 4: f32(beta)}
    return inputs, (dx, dgamma, dbeta)


def rel(a, b):
    if isinstance(a, np.ndarray) and a.dtype == np.uint16:  # bf16 bits from NumPy inputs
        a = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    a = a.double().numpy() if torch is not None and isinstance(a, torch.Tensor) else np.asarray(a, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


# Relative L2 error bounds per data type. The recovered x̂ carries dst's
# rounding (x̂ = (y - beta) / gamma), so these are the dtype's precision
# times the conditioning, not the f32 accumulation.
TOL = {"f32": 2e-5, "bf16": 3e-2, "f16": 4e-3}


@pytest.mark.parametrize("backend", ["ref", "jit"])
@pytest.mark.parametrize("fmt,shape", [("NCX", [4, 16, 7, 9]), ("NCX", [2, 5, 33, 1]),
                                       ("NXC", [4, 7, 9, 16]), ("NXC", [3, 5, 5, 200]),
                                       ("NXC", [2, 3, 3, 77])])
@pytest.mark.parametrize("activation,alpha", [("leaky_relu", 0.01), ("leaky_relu", 3.0),
                                              ("identity", 1.0)])
def test_matches_float64_backward_from_src(backend, fmt, shape, activation, alpha):
    axis = 1 if fmt == "NCX" else len(shape) - 1
    inputs, (dx, dgamma, dbeta) = problem(shape, axis, alpha, "f32")
    cg = normgrad.compile(from_dst_graph(shape, fmt, activation=activation, alpha=alpha),
                          backend=backend)
    out = cg.execute(inputs)
    assert rel(out[5], dx) < TOL["f32"]
    assert rel(out[6], dgamma) < TOL["f32"]
    assert rel(out[7], dbeta) < TOL["f32"]


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("fmt,shape", [("NCX", [4, 16, 7, 9]), ("NXC", [3, 5, 5, 200])])
def test_16_bit_data_on_the_jit(dt, fmt, shape):
    if dt == "bf16" and torch is None:
        pytest.skip("bf16 arrays need torch")
    axis = 1 if fmt == "NCX" else len(shape) - 1
    inputs, (dx, dgamma, dbeta) = problem(shape, axis, 0.01, dt, seed=3)
    if dt == "bf16":
        inputs = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
    cg = normgrad.compile(from_dst_graph(shape, fmt, dt=dt), backend="jit")
    out = cg.execute(inputs)
    assert rel(out[5], dx) < TOL[dt]
    assert rel(out[6], dgamma) < TOL[dt]
    assert rel(out[7], dbeta) < TOL[dt]


def test_same_bits_for_any_thread_count():
    shape = [8, 14, 14, 256]
    inputs, _ = problem(shape, 3, 0.01, "f32", seed=5)
    cg = normgrad.compile(from_dst_graph(shape, "NXC"), backend="jit")
    before = normgrad.num_threads()
    try:
        normgrad.set_num_threads(1)
        one = cg.execute(inputs)
        normgrad.set_num_threads(2)
        two = cg.execute(inputs)
    finally:
        normgrad.set_num_threads(before)
    for k in (5, 6, 7):
        assert np.array_equal(one[k], two[k])


@pytest.mark.parametrize("backend", ["ref", "jit"])
def test_diff_src_over_diff_dst(backend):
    shape = [4, 6, 6, 32]
    inputs, (dx, _, _) = problem(shape, 3, 0.01, "f32", seed=7)
    cg = normgrad.compile(from_dst_graph(shape, "NXC"), backend=backend)
    assert (1, 5) in cg.inplace_pairs()
    buf = inputs[1].copy()
    inputs[1] = buf
    out = cg.execute(inputs, {5: buf})
    assert out[5] is buf and rel(buf, dx) < TOL["f32"]


@pytest.mark.parametrize("backend", ["ref", "jit"])
def test_zero_gamma_is_refused_naming_the_channel(backend):
    shape = [2, 4, 4, 8]
    inputs, _ = problem(shape, 3, 0.01, "f32")
    inputs[3] = inputs[3].copy()
    inputs[3][5] = 0.0
    cg = normgrad.compile(from_dst_graph(shape, "NXC"), backend=backend)
    with pytest.raises(normgrad.Error, match=r"gamma.*channel 5"):
        cg.execute(inputs)


@pytest.mark.parametrize("attrs,message", [
    ({"activation": "relu"}, "relu has no inverse"),
    ({"activation": "tanh"}, "expected identity or leaky_relu"),
    ({"activation": "leaky_relu"}, "'alpha' is required with leaky_relu"),
    ({"activation": "leaky_relu", "alpha": 0.0}, "'alpha' must be finite and > 0"),
    ({"activation": "leaky_relu", "alpha": -0.1}, "'alpha' must be finite and > 0"),
    ({"activation": "identity", "alpha": 0.1}, "'alpha' is only read with leaky_relu"),
])
def test_bad_attributes_are_named(attrs, message):
    shape, c = [2, 3, 3, 8], 8
    T = normgrad.LogicalTensor
    g = normgrad.Graph()
    ins = [T(0, "f32", shape), T(1, "f32", shape), T(2, "f32", [c]), T(3, "f32", [c]), T(4, "f32", [c])]
    with pytest.raises(normgrad.Error, match=message):
        g.add_op("BatchNormTrainingBackwardFromDst", ins, [T(5, "f32", shape)],
                 dict({"epsilon": EPS}, **attrs))
        g.finalize()
        normgrad.compile(g)


def test_aliased_output_the_op_does_not_allow_is_refused():
    shape = [2, 3, 3, 8]
    inputs, _ = problem(shape, 3, 0.01, "f32")
    cg = normgrad.compile(from_dst_graph(shape, "NXC"))
    with pytest.raises(normgrad.Error, match="output tensor 5 shares memory with input tensor 0"):
        cg.execute(inputs, {5: inputs[0]})
