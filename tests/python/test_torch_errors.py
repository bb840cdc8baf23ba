"""normgrad.torch's modules raise the exception classes torch's own raise,
for the same triggers, so code written for torch catches them: each case
runs torch's module and normgrad's on the same input and compares classes
(normgrad's is also a normgrad.Error). Where torch raises nothing, neither
does normgrad, and the results match."""
import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
import normgrad  # noqa: E402
import normgrad.torch as ngt  # noqa: E402

PAIRS = {"1d": (torch.nn.BatchNorm1d, ngt.BatchNorm1d), "2d": (torch.nn.BatchNorm2d, ngt.BatchNorm2d),
         "3d": (torch.nn.BatchNorm3d, ngt.BatchNorm3d)}


def wrong_weight(m):
    m.weight = torch.nn.Parameter(torch.ones(4))
    return m


# (name, module kind, how the module is made ready, input)
CASES = [
    ("one value per channel, 2D", "1d", lambda m: m, lambda: torch.randn(1, 3)),
    ("one value per channel, 3D", "1d", lambda m: m, lambda: torch.randn(1, 3, 1)),
    ("one value per channel, 4D", "2d", lambda m: m, lambda: torch.randn(1, 3, 1, 1)),
    ("one value per channel, 5D", "3d", lambda m: m, lambda: torch.randn(1, 3, 1, 1, 1)),
    ("1D input to BatchNorm1d", "1d", lambda m: m, lambda: torch.randn(3)),
    ("4D input to BatchNorm1d", "1d", lambda m: m, lambda: torch.randn(2, 3, 4, 4)),
    ("3D input to BatchNorm2d", "2d", lambda m: m, lambda: torch.randn(2, 3, 4)),
    ("4D input to BatchNorm3d", "3d", lambda m: m, lambda: torch.randn(2, 3, 4, 4)),
    ("wrong channels, training", "2d", lambda m: m, lambda: torch.randn(2, 4, 4, 4)),
    ("wrong channels, eval", "2d", lambda m: m.eval(), lambda: torch.randn(2, 4, 4, 4)),
    ("integer input", "2d", lambda m: m, lambda: torch.ones(2, 3, 4, 4, dtype=torch.int64)),
    ("float64 input", "2d", lambda m: m, lambda: torch.ones(2, 3, 4, 4, dtype=torch.float64)),
    ("a list as input", "2d", lambda m: m, lambda: [1.0, 2.0]),
    ("weight of the wrong size", "2d", wrong_weight, lambda: torch.randn(2, 3, 4, 4)),
]


def raised(fn):
    try:
        fn()
    except Exception as e:  # the class is what is compared
        return e
    return None


@pytest.mark.parametrize("name,kind,prepare,make", CASES, ids=[c[0] for c in CASES])
def test_the_same_class_as_torch(name, kind, prepare, make):
    torch_cls, ng_cls = PAIRS[kind]
    expected = raised(lambda: prepare(torch_cls(3))(make()))
    got = raised(lambda: prepare(ng_cls(3))(make()))
    assert expected is not None, "torch raises nothing for %s" % name
    assert got is not None, "normgrad raises nothing where torch raises %r" % expected
    assert isinstance(got, type(expected)), (
        "%s: torch raises %s (%s), normgrad %s (%s)" % (name, type(expected).__name__, expected,
                                                         type(got).__name__, got))
    assert isinstance(got, normgrad.Error), got
    assert "normgrad.torch.%s" % ng_cls.__name__ in str(got), got


@pytest.mark.parametrize("shape,mode", [((0, 3, 4, 4), "train"), ((2, 3, 0, 4), "train"),
                                        ((0, 3, 4, 4), "eval")])
def test_an_empty_input_is_returned_empty_as_torch_does(shape, mode):
    t, n = torch.nn.BatchNorm2d(3), ngt.BatchNorm2d(3)
    t.train(mode == "train")
    n.train(mode == "train")
    xt = torch.randn(*shape, requires_grad=True)
    xn = xt.detach().clone().requires_grad_()
    yt, yn = t(xt), n(xn)
    assert yn.shape == yt.shape and yn.dtype == yt.dtype
    for a, b in ((n.running_mean, t.running_mean), (n.running_var, t.running_var),
                 (n.num_batches_tracked, t.num_batches_tracked)):
        assert torch.equal(a, b)
    yt.sum().backward()
    yn.sum().backward()
    assert xn.grad.shape == xt.grad.shape
    assert torch.equal(n.weight.grad, t.weight.grad) and torch.equal(n.bias.grad, t.bias.grad)


def test_sync_batch_norm_classes():
    """torch.nn.SyncBatchNorm refuses CPU tensors outright, so its classes are
    read from its source (torch/nn/modules/batchnorm.py and _functions.py):
    ValueError for an input under 2D and for one value per channel over the
    group. Without a process group normgrad's checks its own batch."""
    m = ngt.SyncBatchNorm(3)
    e = raised(lambda: m(torch.randn(3)))
    assert isinstance(e, ValueError) and isinstance(e, normgrad.Error), e
    e = raised(lambda: m(torch.randn(1, 3)))
    assert isinstance(e, ValueError) and isinstance(e, normgrad.Error), e
    e = raised(lambda: m(torch.randn(2, 4)))
    assert isinstance(e, RuntimeError) and isinstance(e, normgrad.Error), e


def test_torch_versions_are_checked_at_import():
    from normgrad.torch import _check_torch_version
    with pytest.raises(ImportError, match="needs torch 1.13 or newer"):
        _check_torch_version("1.12.1+cpu")
    _check_torch_version("1.13.0a0")  # Debian 12's
    with pytest.warns(UserWarning, match="not tested"):
        _check_torch_version("2.1.0")
