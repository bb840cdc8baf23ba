"""normgrad.torch against torch's own BatchNorm, in float64 on the same
(rounded) inputs: every layout, dtype, affine and track_running_stats
combination, in train and eval mode; plus a small CNN trained both ways."""
import itertools

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: normgrad.torch is not tested")
import normgrad  # noqa: E402
import normgrad.torch as ngt  # noqa: E402

from limits import close  # noqa: E402


def rel(a, b):
    b = b.double()
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


def make_pair(kind, c, affine, track, dtype, seed):
    torch.manual_seed(seed)
    ref = getattr(torch.nn, kind)(c, affine=affine, track_running_stats=track).double()
    if affine:
        ref.weight.data.uniform_(0.5, 1.5)
        ref.bias.data.uniform_(-0.5, 0.5)
    if track:
        ref.running_mean.uniform_(-0.3, 0.3)
        ref.running_var.uniform_(0.5, 2.0)
    ours = ngt.convert(getattr(torch.nn, kind)(c, affine=affine, track_running_stats=track))
    ours.load_state_dict({k: v.float() if v.is_floating_point() else v
                          for k, v in ref.state_dict().items()})
    ours = ours.to(dtype)
    # The reference starts from the same rounded parameters and buffers.
    ref.load_state_dict({k: v.double() if v.is_floating_point() else v
                         for k, v in ours.state_dict().items()})
    return ref, ours


CASES = list(itertools.product(
    ["BatchNorm2d:NCHW", "BatchNorm2d:channels_last", "BatchNorm1d:NC", "BatchNorm1d:NCL",
     "BatchNorm3d:NCDHW", "BatchNorm3d:channels_last_3d"],
    [torch.float32, torch.bfloat16, torch.float16], [True, False], [True, False],
    [True, False]))


@pytest.mark.parametrize("spec,dtype,affine,track,train", CASES)
def test_gradients_match_torch_in_float64(spec, dtype, affine, track, train):
    kind, layout = spec.split(":")
    shapes = {"NCHW": (4, 6, 5, 7), "channels_last": (4, 6, 5, 7), "NC": (9, 6), "NCL": (4, 6, 11),
              "NCDHW": (2, 6, 3, 4, 5), "channels_last_3d": (2, 6, 3, 4, 5)}
    torch.manual_seed(1)
    x = torch.randn(shapes[layout]).to(dtype)
    g = torch.randn(shapes[layout]).to(dtype)
    if layout == "channels_last":
        x, g = (t.contiguous(memory_format=torch.channels_last) for t in (x, g))
    if layout == "channels_last_3d":
        x, g = (t.contiguous(memory_format=torch.channels_last_3d) for t in (x, g))
    ref, ours = make_pair(kind, 6, affine, track, dtype, 2)
    ref.train(train)
    ours.train(train)
    xr = x.double().contiguous().requires_grad_()
    xo = x.clone().requires_grad_()
    yr = ref(xr)
    yo = ours(xo)
    yr.backward(g.double())
    yo.backward(g)
    assert yo.dtype == dtype and xo.grad.dtype == dtype
    close(yo, yr, dtype, "dst")
    close(xo.grad, xr.grad, dtype, "diff_src")
    if layout.startswith("channels_last"):
        fmt = torch.channels_last if layout == "channels_last" else torch.channels_last_3d
        assert xo.grad.is_contiguous(memory_format=fmt)
    # Parameters and buffers are in the module's dtype: their limit is that dtype's.
    if affine:
        close(ours.weight.grad, ref.weight.grad, dtype, "diff_gamma")
        close(ours.bias.grad, ref.bias.grad, dtype, "diff_beta")
    if track:
        close(ours.running_mean, ref.running_mean, dtype, "running_mean")
        close(ours.running_var, ref.running_var, dtype, "running_var")
        assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked)


@pytest.mark.parametrize("layout", ["NCHW", "channels_last"])
def test_fused_relu_backward(layout):
    torch.manual_seed(3)
    x = torch.randn(4, 8, 6, 6)
    g = torch.randn(4, 8, 6, 6)
    if layout == "channels_last":
        x, g = (t.contiguous(memory_format=torch.channels_last) for t in (x, g))
    ref = torch.nn.BatchNorm2d(8).double()
    ours = ngt.BatchNorm2d(8, fuse_relu=True)
    xr = x.double().contiguous().requires_grad_()
    xo = x.clone().requires_grad_()
    torch.relu(ref(xr)).backward(g.double())
    ours(xo).backward(g)
    assert rel(xo.grad, xr.grad) < 2e-6
    assert rel(ours.weight.grad, ref.weight.grad) < 1e-5


def test_convert_keeps_weights_buffers_and_mode():
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.Sequential(torch.nn.BatchNorm1d(5)))
    model[1].weight.data.uniform_(0.5, 1.5)
    model[1].running_var.fill_(3.0)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ngt.convert(model)
    assert isinstance(model[1], ngt.BatchNorm2d) and isinstance(model[2][0], ngt.BatchNorm1d)
    assert isinstance(model[1], torch.nn.BatchNorm2d)  # still a torch BatchNorm2d (drop-in)
    assert not model[1].training
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_backward_runs_on_normgrad():
    ours = ngt.BatchNorm2d(8)
    x = torch.randn(2, 8, 4, 4, requires_grad=True)
    y = ours(x).sum()
    with ngt.recording() as ran:
        y.backward()
    kinds = [p.ops for cg in ran for p in cg.partitions]
    assert kinds == [["BatchNormTrainingBackward"]], kinds


def test_bad_input_raises_a_clear_error():
    with pytest.raises((ValueError, normgrad.Error)):
        ngt.BatchNorm2d(8)(torch.randn(2, 8))


def small_cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, padding=1, stride=2), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1, stride=2), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10))


def train(model, steps, data, labels):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_small_cnn_trains_like_torch():
    torch.manual_seed(5)
    data = torch.randn(32, 3, 16, 16)
    labels = torch.randint(0, 10, (32,))
    torch.manual_seed(6)
    a = small_cnn()
    b = small_cnn()
    b.load_state_dict(a.state_dict())
    ngt.convert(b)
    la = train(a, 50, data, labels)
    lb = train(b, 50, data, labels)
    assert la[-1] < 0.5 * la[0], "the model learns"
    worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    assert worst < 1e-4, "loss curves differ by %.2e relative" % worst


def test_convert_fuses_a_following_relu():
    torch.manual_seed(7)
    a = small_cnn()
    b = small_cnn()
    b.load_state_dict(a.state_dict())
    ngt.convert(b, fuse_relu=True)
    assert [type(m).__name__ for m in b][:3] == ["Conv2d", "BatchNorm2d", "Identity"]
    assert b[1].fuse_relu
    x = torch.randn(8, 3, 16, 16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a(xa).sum().backward()
    loss = b(xb).sum()
    with ngt.recording() as ran:
        loss.backward()
    assert rel(xb.grad, xa.grad) < 1e-5
    kinds = [p.ops for cg in ran for p in cg.partitions]
    assert kinds == [["ReLUBackward", "BatchNormTrainingBackward"]] * 3, kinds


@pytest.mark.parametrize("layout", ["NCHW", "channels_last"])
@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (True, True)])
def test_data_far_from_zero_keeps_the_mean_at_full_precision(layout, relu, residual):
    # At an offset of 1e4 standard deviations, a backward that took the batch
    # mean as one f32 was 2.5e-4 off float64 in the weight gradient.
    torch.manual_seed(8)
    x = 2 * torch.randn(8, 6, 5, 5) + 1e4
    r = torch.randn(8, 6, 5, 5)
    g = torch.randn(8, 6, 5, 5)
    if layout == "channels_last":
        x, r, g = (t.contiguous(memory_format=torch.channels_last) for t in (x, r, g))
    ours = ngt.BatchNorm2d(6, fuse_relu=relu)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-0.5, 0.5)
    ref = torch.nn.BatchNorm2d(6).double()
    ref.load_state_dict({k: v.double() if v.is_floating_point() else v
                         for k, v in ours.state_dict().items()})
    xo, xr = x.clone().requires_grad_(), x.double().requires_grad_()
    ro, rr = r.clone().requires_grad_(), r.double().requires_grad_()
    yo = ours(xo, ro) if residual else ours(xo)
    yr = ref(xr) + rr if residual else ref(xr)
    if relu:
        yr = torch.relu(yr)
    yo.backward(g)
    yr.backward(g.double())
    for what, a, b in (("dst", yo, yr), ("diff_src", xo.grad, xr.grad),
                       ("diff_gamma", ours.weight.grad, ref.weight.grad),
                       ("diff_beta", ours.bias.grad, ref.bias.grad)):
        assert rel(a, b) < 1e-6, (what, rel(a, b))
    if residual:
        assert rel(ro.grad, rr.grad) < 1e-6


@pytest.mark.parametrize("layout", ["NCHW", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (False, True),
                                           (True, True)])
def test_eval_is_one_pass_with_its_residual_and_relu(layout, dtype, relu, residual):
    # In eval the batch norm, a residual's Add and the ReLU are one
    # BatchNormInference partition, which the JIT runs in one pass.
    torch.manual_seed(9)
    x = torch.randn(4, 6, 5, 7).to(dtype)
    r = torch.randn(4, 6, 5, 7).to(dtype)
    if layout == "channels_last":
        x, r = (t.contiguous(memory_format=torch.channels_last) for t in (x, r))
    ours = ngt.BatchNorm2d(6, fuse_relu=relu)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-0.5, 0.5)
        ours.running_mean.uniform_(-0.3, 0.3)
        ours.running_var.uniform_(0.5, 2.0)
    ref = torch.nn.BatchNorm2d(6).double()
    ref.load_state_dict({k: v.double() if v.is_floating_point() else v
                         for k, v in ours.state_dict().items()})
    ours.eval()
    ref.eval()
    with ngt.recording() as ran:
        yo = ours(x, r) if residual else ours(x)
    yr = ref(x.double()) + r.double() if residual else ref(x.double())
    if relu:
        yr = torch.relu(yr)
    assert yo.dtype == dtype
    close(yo, yr, dtype, "dst")
    if layout == "channels_last":
        assert yo.is_contiguous(memory_format=torch.channels_last)
    ops = ["BatchNormInference"] + (["Add"] if residual else []) + (["ReLU"] if relu else [])
    assert [p.ops for cg in ran for p in cg.partitions] == [ops]
    if "jit" in normgrad.backends():
        assert [p.backend for cg in ran for p in cg.partitions] == ["jit"]
