"""normgrad.partition (oneDNN Graph's get_partitions from Python): a graph
normgrad runs only in part lists every partition, supported or not with the
reason; a supported one compiles and executes alone, checked against float64
NumPy. Also the unknown dims a graph's outputs may leave to finalize."""
import os

import numpy as np
import pytest

import normgrad

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BLOCK = os.path.join(ROOT, "examples", "partitioning", "resnet_block_training_backward.json")


def test_a_graph_with_unsupported_ops_is_listed_partition_by_partition():
    g = normgrad.load_graph(BLOCK)  # finalized: inputs and outputs known
    assert g.finalized and len(g.inputs) > 0
    with pytest.raises(normgrad.Error, match=r"normgrad\.partition\(graph\) in Python"):
        normgrad.compile(g)
    parts = normgrad.partition(g)
    assert [p.supported for p in parts] == [False, True, False, False]
    for p in parts:
        if not p.supported:
            assert p.ops[0].startswith("Convolution") and "no kernel" in p.reason
            with pytest.raises(normgrad.Error, match="not supported"):
                p.compile()
    bn = parts[1]
    assert bn.ops == ["ReLUBackward", "BatchNormTrainingBackward"] and bn.backend
    assert sorted(t.id for t in bn.inputs) == [2, 3, 5, 6, 7, 8]
    assert sorted(t.id for t in bn.outputs) == [9, 10, 11]


def test_a_supported_partition_executes_alone_against_float64():
    g = normgrad.load_graph(BLOCK)
    bn = normgrad.partition(g)[1]
    cp = bn.compile()
    rng = np.random.default_rng(3)
    shape, c = (8, 64, 14, 14), 64
    relu_dst = np.maximum(rng.standard_normal(shape), 0).astype(np.float32)  # tensor 3
    grad = rng.standard_normal(shape).astype(np.float32)  # tensor 2, the incoming gradient
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)  # tensor 5
    mean = x.astype(np.float64).mean(axis=(0, 2, 3)).astype(np.float32)
    var = x.astype(np.float64).var(axis=(0, 2, 3)).astype(np.float32)
    gamma = (rng.random(c) + 0.5).astype(np.float32)
    out = cp.execute({3: relu_dst, 2: grad, 5: x, 6: mean, 7: var, 8: gamma})
    # float64: ReLUBackward (use_dst) masks the gradient, then batch norm's backward.
    dy = np.where(relu_dst > 0, grad, 0).astype(np.float64)
    xd, m, s = x.astype(np.float64), mean.astype(np.float64)[None, :, None, None], \
        1 / np.sqrt(var.astype(np.float64) + 1e-5)[None, :, None, None]
    xhat = (xd - m) * s
    n = shape[0] * shape[2] * shape[3]
    dbeta = dy.sum(axis=(0, 2, 3))
    dgamma = (dy * xhat).sum(axis=(0, 2, 3))
    dx = gamma.astype(np.float64)[None, :, None, None] * s * (
        dy - dbeta[None, :, None, None] / n - xhat * dgamma[None, :, None, None] / n)
    for got, want in ((out[9], dx), (out[10], dgamma), (out[11], dbeta)):
        err = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)
        assert err < 1e-5, err
    with pytest.raises(normgrad.Error, match="input 5 is not given"):
        cp.execute({3: relu_dst, 2: grad, 6: mean, 7: var, 8: gamma})
    with pytest.raises(normgrad.Error, match="not one of its inputs"):
        cp.execute({3: relu_dst, 2: grad, 5: x, 6: mean, 7: var, 8: gamma, 0: x})
    with pytest.raises(normgrad.Error, match="not one of its outputs"):
        cp.execute({3: relu_dst, 2: grad, 5: x, 6: mean, 7: var, 8: gamma},
                   {4: np.empty(shape, np.float32)})
    given = np.empty(shape, np.float32)  # written in place, and returned as it is
    assert cp.execute({3: relu_dst, 2: grad, 5: x, 6: mean, 7: var, 8: gamma}, {9: given})[9] \
        is given
    assert np.array_equal(given, out[9])


@pytest.mark.parametrize("dst_shape", [[None, None, None, None], [-1, 16, None, 5], None])
def test_unknown_output_dims_are_inferred(dst_shape):
    """None (or -1) for an unknown dim, None for an unknown rank, as oneDNN
    Graph users write them: finalize infers them."""
    g = normgrad.Graph()
    x = normgrad.LogicalTensor(0, "f32", [2, 16, 5, 5])
    y = normgrad.LogicalTensor(1, "f32", dst_shape)
    assert y.shape == (None if dst_shape is None else
                       [None if d in (None, -1) else d for d in dst_shape])
    g.add_op("ReLU", [x], [y])
    g.finalize()
    assert g.outputs[0].shape == [2, 16, 5, 5]
    with pytest.raises(normgrad.Error, match="not an int or None"):
        normgrad.LogicalTensor(1, "f32", [2, "x"])
