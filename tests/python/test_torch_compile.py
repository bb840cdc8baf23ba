"""normgrad.torch.compile, the training backend on AOT autograd: the step's
outputs, gradients and running buffers against torch's in float64, once per
step; the recomputed BN+ReLU outputs give the same bits as the saved ones and
less is saved; each input signature traced once; eval, gradient-free calls
and untraceable models on convert(fuse=True), the last with a warning."""
import copy
import warnings

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
pytest.importorskip("functorch", reason="torch has no functorch (AOT autograd)")

import normgrad.torch as ngt  # noqa: E402


class Block(torch.nn.Module):
    """conv-BN-ReLU, conv-BN, + residual, ReLU; a BatchNorm1d head (BN alone)."""

    def __init__(self, momentum=0.1, affine=True, track=True):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(8, momentum=momentum, affine=affine,
                                       track_running_stats=track)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 6)
        self.b3 = torch.nn.BatchNorm1d(6, momentum=None)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        z = torch.relu(self.b2(self.c2(y)) + y)
        return self.b3(self.head(z.mean((2, 3))))


def run_steps(model, xs):
    """Outputs and parameter gradients of one training step per input."""
    outs = []
    for x in xs:
        for p in model.parameters():
            p.grad = None
        out = model(x)
        (out * torch.arange(out.numel(), dtype=out.dtype).view_as(out).sin()).sum().backward()
        outs.append(out.detach())
    return outs


def grads(model):
    return [p.grad for p in model.parameters()]


def inputs(n=2, memory_format=torch.contiguous_format, dtype=torch.float32):
    torch.manual_seed(5)
    return [(torch.randn(6, 3, 7, 9) * 2 + 1).to(dtype).contiguous(memory_format=memory_format)
            for _ in range(n)]


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("kw", [{}, {"momentum": None}, {"affine": False},
                                {"track": False}])
def test_step_matches_torch_in_float64(memory_format, kw):
    torch.manual_seed(1)
    model = Block(**kw)
    ref = copy.deepcopy(model).double()
    compiled = ngt.compile(model)
    xs = inputs(memory_format=memory_format)
    got = run_steps(compiled, xs)
    want = run_steps(ref, [x.double() for x in xs])
    assert compiled.normgrad_batch_norms == 3
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)
    for g, w in zip(grads(model), grads(ref)):
        torch.testing.assert_close(g.double(), w, rtol=1e-3, atol=1e-4)
    for (name, b), (_, r) in zip(model.named_buffers(), ref.named_buffers()):
        if name.endswith("num_batches_tracked"):
            assert int(b) == int(r) == 2, name  # once per step
        else:
            torch.testing.assert_close(b.double(), r, rtol=1e-5, atol=1e-6, msg=name)
    # The same Parameters and buffers: an optimizer on the model trains the compiled one.
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]


def test_bf16_model_is_as_close_to_float64_as_torchs_own():
    # A bf16 model's convolutions round too: the bar is torch's own bf16 step.
    torch.manual_seed(1)
    model = Block().to(torch.bfloat16)
    eager, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = ngt.compile(model)
    xs = inputs(1, dtype=torch.bfloat16)
    try:
        theirs = run_steps(eager, xs)
    except RuntimeError as e:  # oneDNN capped below AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2)
        pytest.skip("torch itself cannot run a bf16 convolution on this host: %s" % e)
    got = run_steps(compiled, xs)
    want = run_steps(ref, [x.double() for x in xs])
    assert compiled.normgrad_batch_norms == 3

    def err(a, b):
        return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()
    assert err(got[0], want[0]) <= 2 * err(theirs[0], want[0]) + 1e-3
    for g, t, w in zip(grads(model), grads(eager), grads(ref)):
        assert err(g, w) <= 2 * err(t, w) + 1e-3


def saved_bytes(module, x):
    seen = {}

    def pack(t):
        seen[t.storage().data_ptr()] = t.storage().size() * t.storage().element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def test_recompute_gives_the_same_bits_and_saves_less():
    torch.manual_seed(2)
    model = Block()
    again = copy.deepcopy(model)
    with_recompute, kept = ngt.compile(model), ngt.compile(again, recompute=False)
    xs = inputs()
    for a, b in zip(run_steps(with_recompute, xs), run_steps(kept, xs)):
        assert torch.equal(a, b)
    for a, b in zip(grads(model), grads(again)):
        assert torch.equal(a, b)
    # One BN+ReLU output (6x8x7x9 f32) fewer is kept for the backward, for what its
    # recomputation reads besides: the f64 mean and variance and the bias (C = 8).
    saving = saved_bytes(kept, xs[0]) - saved_bytes(with_recompute, xs[0])
    assert saving == 6 * 8 * 7 * 9 * 4 - (2 * 8 * 8 + 8 * 4)


def test_each_signature_is_traced_once():
    model = Block()
    compiled = ngt.compile(model)
    run_steps(compiled, inputs(2))
    assert len(compiled._steps) == 1
    run_steps(compiled, [torch.randn(4, 3, 5, 5)])  # a new shape: a new trace, not a wrong one
    assert len(compiled._steps) == 2
    ref = copy.deepcopy(model).double()
    x = torch.randn(4, 3, 5, 5)
    torch.testing.assert_close(compiled(x).double(), ref(x.double()), rtol=1e-4, atol=1e-5)


def test_eval_and_no_grad_run_convert():
    torch.manual_seed(4)
    model = Block()
    compiled = ngt.compile(model)
    run_steps(compiled, inputs(1))
    compiled.eval()
    ref = copy.deepcopy(model).double().eval()
    x = inputs(1)[0]
    torch.testing.assert_close(compiled(x).double(), ref(x.double()), rtol=1e-4, atol=1e-5)
    compiled.train()
    with torch.no_grad():
        before = model.b1.num_batches_tracked.item()
        compiled(x)
        assert model.b1.num_batches_tracked.item() == before + 1  # counted, as torch does


class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.bn(self.conv(x))
        # Data-dependent: AOT cannot trace it. On the input, whose sum is far
        # from 0 (the batch norm's output sums to about 0: its sign is rounding).
        return y if x.sum() > 0 else -y


def test_untraceable_model_falls_back_to_convert_with_a_warning():
    torch.manual_seed(6)
    model = DataDependent()
    ref = copy.deepcopy(model).double()
    compiled = ngt.compile(model)
    x = torch.randn(2, 3, 4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x)
    assert any("cannot trace" in str(w.message) and "convert(model, fuse=True)" in str(w.message)
               for w in caught)
    torch.testing.assert_close(out.double(), ref(x.double()), rtol=1e-4, atol=1e-5)
    assert int(model.bn.num_batches_tracked) == 1  # the failed trace did not count


def test_a_batch_norm_normgrad_cannot_run_stays_torchs_and_counts_once():
    # float64: no normgrad kernel, so torch's op, with the module's batch count.
    torch.manual_seed(9)
    model = Block().double()
    ref = copy.deepcopy(model)
    compiled = ngt.compile(model)
    xs = [x.double() for x in inputs()]
    for g, w in zip(run_steps(compiled, xs), run_steps(ref, xs)):
        torch.testing.assert_close(g, w)
    assert compiled.normgrad_batch_norms == 0
    for (name, b), (_, r) in zip(model.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(b, r, msg=name)  # num_batches_tracked 2, as torch's


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        ngt.compile(lambda x: x)
    with pytest.raises(TypeError, match="recompute must be True or False"):
        ngt.compile(Block(), recompute="yes")


@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                    reason="torch.compile needs torch 2; this is torch " + torch.__version__ +
                    " (normgrad.torch.compile is its backend-free form)")
def test_dynamo_backend_on_torch2():
    torch.manual_seed(1)
    model = Block()
    ref = copy.deepcopy(model).double()
    compiled = torch.compile(model, backend=ngt.dynamo_backend())
    xs = inputs()
    got = run_steps(compiled, xs)
    want = run_steps(ref, [x.double() for x in xs])
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)
    for g, w in zip(grads(model), grads(ref)):
        torch.testing.assert_close(g.double(), w, rtol=1e-3, atol=1e-4)


def test_dynamo_backend_refuses_torch_1():
    if int(torch.__version__.split(".")[0]) >= 2:
        pytest.skip("torch 2 has torch.compile: test_dynamo_backend_on_torch2 runs instead")
    with pytest.raises(RuntimeError, match="needs torch 2"):
        ngt.dynamo_backend()


def test_a_model_of_normgrad_modules_runs_as_it_is_with_a_warning():
    torch.manual_seed(7)
    model = ngt.convert(Block())  # in place: normgrad's BatchNorm modules
    ref = copy.deepcopy(model)
    compiled = ngt.compile(model)
    x = inputs(1)[0]
    with pytest.warns(UserWarning, match="already holds normgrad.torch modules"):
        out = compiled(x)
    assert torch.equal(out, ref(x))
    assert compiled.normgrad_batch_norms == 0


@pytest.mark.parametrize("slope", [0.01, 0.2])
def test_leaky_relu_is_recomputed_too(slope):
    # BN -> LeakyReLU: the forward fused, the activation recomputed for the
    # backward, whose leaky_relu_backward then reads it (the same mask).
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(8), torch.nn.LeakyReLU(slope),
                                torch.nn.Conv2d(8, 5, 3, padding=1))
    kept_model, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled, kept = ngt.compile(model), ngt.compile(kept_model, recompute=False)
    xs = inputs()
    got, same = run_steps(compiled, xs), run_steps(kept, xs)
    want = run_steps(ref, [x.double() for x in xs])
    assert compiled.normgrad_batch_norms == 1
    for g, s, w in zip(got, same, want):
        assert torch.equal(g, s)
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)
    for g, s, w in zip(grads(model), grads(kept_model), grads(ref)):
        assert torch.equal(g, s)
        torch.testing.assert_close(g.double(), w, rtol=1e-3, atol=1e-4)
    assert saved_bytes(kept, xs[0]) - saved_bytes(compiled, xs[0]) > 6 * 8 * 7 * 9 * 4 // 2
