"""The Python API: graphs, compile, execute on NumPy arrays and PyTorch
tensors without copies, errors as normgrad.Error. Numbers are checked against
a float64 NumPy computation of the batch-norm backward."""
import json
import os
import threading
import time

import numpy as np
import pytest

import normgrad

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "graphs")


def bn_graph(shape, fmt="NCX", dt="f32", gamma=True, outputs=3):
    c = shape[1] if fmt == "NCX" else shape[-1]
    g = normgrad.Graph()
    T = normgrad.LogicalTensor
    ins = [T(0, dt, shape), T(1, dt, shape), T(2, "f32", [c]), T(3, "f32", [c])]
    if gamma:
        ins.append(T(4, "f32", [c]))
    outs = [T(5, dt, shape)] + ([T(6, "f32", [c]), T(7, "f32", [c])] if outputs == 3 else [])
    g.add_op("BatchNormTrainingBackward", ins, outs, {"epsilon": 1e-5, "data_format": fmt})
    g.finalize()
    return g


def reference(x, dy, mean, var, gamma, eps, axis):
    """The training backward in float64 (x, dy with channels on `axis`)."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    red = tuple(i for i in range(x.ndim) if i != axis)
    shape = [1] * x.ndim
    shape[axis] = -1
    m = x.size / x.shape[axis]
    s = 1.0 / np.sqrt(var.astype(np.float64) + eps)
    xm = x - mean.reshape(shape)
    dbeta = dy.sum(axis=red)
    dgamma = s * (dy * xm).sum(axis=red)
    dx = (gamma * s).reshape(shape) * (dy - dbeta.reshape(shape) / m
                                      - xm * (s * dgamma).reshape(shape) / m)
    return dx, dgamma, dbeta


def inputs_for(shape, axis, rng):
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    dy = rng.uniform(-1, 1, shape).astype(np.float32)
    red = tuple(i for i in range(len(shape)) if i != axis)
    mean = x.astype(np.float64).mean(axis=red).astype(np.float32)
    var = x.astype(np.float64).var(axis=red).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, shape[axis]).astype(np.float32)
    return x, dy, mean, var, gamma


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("backend", ["auto", "ref"])
def test_numpy_round_trip_matches_float64(fmt, backend):
    shape = [4, 16, 7, 9] if fmt == "NCX" else [4, 7, 9, 16]
    axis = 1 if fmt == "NCX" else 3
    x, dy, mean, var, gamma = inputs_for(shape, axis, np.random.default_rng(1))
    cg = normgrad.compile(bn_graph(shape, fmt), backend=backend)
    assert [p.ops for p in cg.partitions] == [["BatchNormTrainingBackward"]]
    out = cg.execute({0: x, 1: dy, 2: mean, 3: var, 4: gamma})
    assert set(out) == {5, 6, 7} and out[5].dtype == np.float32 and list(out[5].shape) == shape
    dx, dgamma, dbeta = reference(x, dy, mean, var, gamma, 1e-5, axis)
    assert np.linalg.norm(out[5] - dx) / np.linalg.norm(dx) < 6e-7
    assert np.linalg.norm(out[6] - dgamma) / np.linalg.norm(dgamma) < 1e-5
    assert np.linalg.norm(out[7] - dbeta) / np.linalg.norm(dbeta) < 1e-5


def test_given_outputs_are_written_in_place():
    shape = [2, 8, 5, 5]
    x, dy, mean, var, gamma = inputs_for(shape, 1, np.random.default_rng(2))
    cg = normgrad.compile(bn_graph(shape))
    dx = np.full(shape, np.nan, np.float32)
    out = cg.execute({0: x, 1: dy, 2: mean, 3: var, 4: gamma}, {5: dx})
    assert out[5] is dx and not np.isnan(dx).any()


def test_strided_arrays_are_honoured_or_refused_clearly():
    shape = [2, 8, 5, 5]
    x, dy, mean, var, gamma = inputs_for(shape, 1, np.random.default_rng(3))
    cg = normgrad.compile(bn_graph(shape))
    wide = np.zeros([2, 8, 5, 10], np.float32)
    wide[..., ::2] = x
    with pytest.raises(normgrad.Error, match=r"input 0 \(tensor 0\): strides .* expected"):
        cg.execute({0: wide[..., ::2], 1: dy, 2: mean, 3: var, 4: gamma})
    # Declared with those strides, the same view runs in place.
    T = normgrad.LogicalTensor
    g = normgrad.Graph()
    g.add_op("BatchNormTrainingBackward",
             [T(0, "f32", shape, strides=[400, 50, 10, 2]), T(1, "f32", shape), T(2, "f32", [8]),
              T(3, "f32", [8]), T(4, "f32", [8])],
             [T(5, "f32", shape), T(6, "f32", [8]), T(7, "f32", [8])],
             {"epsilon": 1e-5, "data_format": "NCX"})
    out = normgrad.compile(g).execute({0: wide[..., ::2], 1: dy, 2: mean, 3: var, 4: gamma})
    dx, _, _ = reference(x, dy, mean, var, gamma, 1e-5, 1)
    assert np.linalg.norm(out[5] - dx) / np.linalg.norm(dx) < 6e-7


def test_errors_raise_normgrad_error_with_the_cpp_message():
    assert issubclass(normgrad.Error, RuntimeError)
    with pytest.raises(normgrad.Error, match="cannot open"):
        normgrad.load_graph("/no/such/graph.json")
    g = normgrad.Graph()
    T = normgrad.LogicalTensor
    with pytest.raises(normgrad.Error, match="input 4 'gamma' has 3 elements, expected C=8"):
        g.add_op("BatchNormTrainingBackward",
                 [T(0, "f32", [2, 8, 3]), T(1, "f32", [2, 8, 3]), T(2, "f32", [8]),
                  T(3, "f32", [8]), T(4, "f32", [3])], [T(5, "f32", [2, 8, 3])],
                 {"epsilon": 1e-5, "data_format": "NCX"})
    with pytest.raises(normgrad.Error, match="unknown op kind|Nope"):
        normgrad.Op(0, "Nope")
    cg = normgrad.compile(bn_graph([2, 8, 3]))
    with pytest.raises(normgrad.Error, match=r"shape 2x8x4, expected 2x8x3"):
        cg.execute({0: np.zeros([2, 8, 4], np.float32)})
    with pytest.raises(normgrad.Error, match="dtype f64, expected f32"):
        cg.execute({0: np.zeros([2, 8, 3])})
    with pytest.raises(normgrad.Error, match="expected a NumPy array"):
        cg.execute({0: "not an array"})
    with pytest.raises(normgrad.Error, match="unknown backend"):
        normgrad.compile(bn_graph([2, 8, 3]), backend="gpu")
    with pytest.raises(normgrad.Error, match="unknown pass"):
        normgrad.compile(bn_graph([2, 8, 3]), passes=["no-such-pass"])


def test_an_empty_pass_list_runs_no_pass():
    g = normgrad.Graph()
    T = normgrad.LogicalTensor
    g.add_op("ReLUBackward", [T(10, "f32", [2, 8, 3]), T(11, "f32", [2, 8, 3])],
             [T(1, "f32", [2, 8, 3])], id=1)
    g.add_op("BatchNormTrainingBackward",
             [T(0, "f32", [2, 8, 3]), T(1, "f32", [2, 8, 3]), T(2, "f32", [8]), T(3, "f32", [8])],
             [T(5, "f32", [2, 8, 3]), T(6, "f32", [8]), T(7, "f32", [8])],
             {"epsilon": 1e-5, "data_format": "NCX"}, id=0)
    # Fusion is the backends' patterns, not a pass: it happens with no pass too.
    (fused,) = normgrad.compile(g).partitions
    assert fused.pattern == "jit.bn_bwd_producers" and fused.backend == "jit"
    assert len(normgrad.compile(g, passes=[]).partitions) == 1
    assert len(normgrad.compile(g, optimize=False).partitions) == 2


def test_load_graph_to_json_and_partitions():
    g = normgrad.load_graph(os.path.join(EXAMPLES, "bn_training_backward_bf16_ncx.json"))
    doc = json.loads(g.to_json())
    assert doc["graph"][0]["kind"] == "BatchNormTrainingBackward"
    cg = normgrad.compile(g, backend="ref", passes=["canonicalize"])
    (p,) = cg.partitions
    assert p.backend == "ref" and p.kernel.startswith("ref:") and p.ops == ["BatchNormTrainingBackward"]
    assert [t.dtype for t in cg.inputs][:2] == ["bf16", "bf16"]


def test_bf16_as_uint16_bit_patterns():
    shape = [2, 8, 4, 4]
    x, dy, mean, var, gamma = inputs_for(shape, 1, np.random.default_rng(4))
    to_bits = lambda a: (a.view(np.uint32) >> 16).astype(np.uint16)  # truncation: exact bf16 values
    xb, dyb = to_bits(x), to_bits(dy)
    from_bits = lambda b: (b.astype(np.uint32) << 16).view(np.float32)
    cg = normgrad.compile(bn_graph(shape, dt="bf16"))
    out = cg.execute({0: xb, 1: dyb, 2: mean, 3: var, 4: gamma})
    assert out[5].dtype == np.uint16
    dx, _, _ = reference(from_bits(xb), from_bits(dyb), mean, var, gamma, 1e-5, 1)
    assert np.linalg.norm(from_bits(out[5]) - dx) / np.linalg.norm(dx) < 3.9e-2


def test_version_threads_and_backends():
    assert normgrad.__version__.count(".") == 2
    assert "ref" in normgrad.backends()
    normgrad.set_num_threads(1)
    assert normgrad.num_threads() == 1
    normgrad.set_num_threads(0)


def test_execute_releases_the_gil():
    """While one thread is inside execute, the main thread keeps running Python
    all through the call. The result still equals a serial run's."""
    # The call must last long enough to tell a released GIL from a held one;
    # how long ref takes depends on the host, so the batch grows until one
    # serial call takes 0.1 s. Ref runs on the calling thread alone, so the
    # main thread keeps the other core.
    n = 8
    while True:
        shape = [n, 32, 28, 28]
        x, dy, mean, var, gamma = inputs_for(shape, 1, np.random.default_rng(5))
        cg = normgrad.compile(bn_graph(shape), backend="ref")
        ins = {0: x, 1: dy, 2: mean, 3: var, 4: gamma}
        begin = time.perf_counter()
        serial = cg.execute(ins)[5]
        if time.perf_counter() - begin >= 0.1 or n >= 512:
            break
        n *= 2
    window = {}

    def work():
        window["start"] = time.perf_counter()
        window["out"] = cg.execute(ins)[5]
        window["end"] = time.perf_counter()

    t = threading.Thread(target=work)
    ticks = []
    t.start()
    while t.is_alive():
        ticks.append(time.perf_counter())
    t.join()
    # A held GIL would leave one gap in the main thread's ticks as long as the
    # call (a few switch intervals of 5 ms at most fall inside at its edges).
    span = window["end"] - window["start"]
    inside = [window["start"]] + [v for v in ticks if window["start"] < v < window["end"]]
    inside.append(window["end"])
    largest_gap = max(b - a for a, b in zip(inside, inside[1:]))
    assert span > 0.05, "the call is too short to tell (%.3f s)" % span
    assert largest_gap < 0.5 * span, "the main thread stalled %.3f s of %.3f s" % (largest_gap, span)
    assert np.array_equal(window["out"], serial)


def test_torch_tensors_are_borrowed_not_copied():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    shape = [2, 8, 5, 5]
    x, dy, mean, var, gamma = (torch.from_numpy(a) for a in inputs_for(shape, 1,
                                                                     np.random.default_rng(6)))
    cg = normgrad.compile(bn_graph(shape))
    dx = torch.empty(shape)
    ptr = dx.data_ptr()
    out = cg.execute({0: x, 1: dy, 2: mean, 3: var, 4: gamma}, {5: dx})
    assert out[5] is dx and dx.data_ptr() == ptr
    ref, _, _ = reference(x.numpy(), dy.numpy(), mean.numpy(), var.numpy(), gamma.numpy(), 1e-5, 1)
    assert np.linalg.norm(dx.numpy() - ref) / np.linalg.norm(ref) < 6e-7
    # channels_last memory is NXC: the permuted view goes in without a copy.
    xc = x.contiguous(memory_format=torch.channels_last)
    dyc = dy.contiguous(memory_format=torch.channels_last)
    g = bn_graph([2, 5, 5, 8], "NXC")
    dxc = torch.empty_like(xc)
    normgrad.compile(g).execute({0: xc.permute(0, 2, 3, 1), 1: dyc.permute(0, 2, 3, 1), 2: mean,
                                 3: var, 4: gamma}, {5: dxc.permute(0, 2, 3, 1)})
    assert np.linalg.norm(dxc.numpy() - ref) / np.linalg.norm(ref) < 6e-7
    with pytest.raises(normgrad.Error, match="dtype"):
        cg.execute({0: x.double()})
