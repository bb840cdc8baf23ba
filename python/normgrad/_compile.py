"""normgrad.torch.compile: a training backend on functorch's AOT autograd.

``compile(model)`` returns a module whose training step runs through
``functorch.compile.aot_function``: AOT autograd traces the forward and the
backward into one joint graph of aten ops, normgrad rewrites that graph, and
functorch's default partitioner splits it into the forward and the backward
that run. The rewrite:

- Each training ``native_batch_norm`` becomes normgrad's forward, the
  synchronized batch norm's on this process alone: the moments
  (BatchNormForwardReduce, f64 from shifted f32 chunks) and the
  normalisation from them (BatchNormForwardApply), with the ``relu`` (or
  ``leaky_relu``, slope >= 0) that alone reads its output fused in; one
  followed by ``add`` (a same-shaped residual)
  and ``relu``, a residual block's end, is one BatchNormForwardTraining ->
  Add -> ReLU partition, as convert(fuse=True) runs it. The running buffers
  and ``num_batches_tracked`` are updated as torch's module updates them,
  once per step.
- Each ``native_batch_norm_backward`` becomes normgrad's backward
  (BatchNormTrainingBackward), with the ``threshold_backward`` in front of
  it fused in when that ReLU's gradient has no other reader, or, after a
  residual, with the masked gradient written as a side output for the
  residual's readers: the same kernels, and the same bits, as
  ``convert(fuse=True)``'s modules.
- What the forward keeps for the backward (``recompute=True``): the
  backward's reads of a fused BN+ReLU's output (the ReLU's mask, and the next
  convolution's weight gradient; a LeakyReLU's backward, which reads the
  batch norm's output, reads the activation instead: the same mask for a
  slope >= 0) read a recomputation instead, made where the backward first
  needs it from the batch norm's input and its f64 mean and variance: one
  pass of the same BatchNormForwardApply kernel on the same inputs, so the
  same bits as the forward's. The partitioner then keeps the convolution's
  output and C-sized statistics, not the activation: one activation fewer per
  BN+ReLU held from the forward to the backward. functorch's min-cut
  partitioner would choose recomputation by cost, but it needs networkx
  (not a dependency here) and does not recompute batch norms; this rule
  is the one that pays in a CNN, where the activation a BN+ReLU writes is as
  large as the input it would be recomputed from, which the backward keeps
  anyway.

Everything else runs as aten ops. The step is traced once per input
signature (shapes, dtypes, strides, autocast, which inputs need gradients)
and per mode; evaluation, and gradient-free calls, run ``convert(fuse=True)``
of the model. A model AOT cannot trace runs ``convert(fuse=True)`` too, with a
warning that says why. The Parameters and buffers are the model's own.
"""
import operator
import warnings
from types import SimpleNamespace

import torch as _torch

from . import _batch_norm as _bn
from . import _torch_graphs as _g
from ._group_stats import _local_moments, normalize_group

_aten = _torch.ops.aten


# -- the kernels the rewritten graphs call ------------------------------------------------------

def _count(tracked, momentum):
    """torch's module's bookkeeping: the batch counted in `tracked`, and this batch's
    momentum factor (momentum None: the cumulative average)."""
    factor = 0.0 if momentum is None else momentum
    if tracked is not None:
        tracked.add_(1)
        if momentum is None:
            factor = 1.0 / float(tracked)
    return factor


def bn_forward(x, weight, bias, running_mean, running_var, tracked, momentum, eps, relu,
               leaky=None):
    """A training batch norm [+ ReLU or LeakyReLU], as torch's module runs it, through the
    synchronized batch norm's two passes on this process alone (its moments, then the
    normalisation from them): (y, batch mean, batch variance, the f64 mean and variance
    the normalisation used). Counts the batch and updates the running buffers."""
    factor = _count(tracked, momentum)
    n, mean64, m2 = _local_moments(x)
    var64 = m2 / n
    y = normalize_group(x, n, mean64, var64, weight, bias, eps, leaky, relu)
    mean, var = mean64.float(), var64.float()
    _g.update_running(running_mean, running_var, mean, var, factor, n)
    return y, mean, var, mean64, var64


def bn_forward_residual(x, weight, bias, running_mean, running_var, tracked, momentum, eps,
                        residual):
    """relu(batch_norm(x) + residual) as convert(fuse=True)'s module runs it (one
    BN -> Add -> ReLU partition): (y, batch mean, batch variance)."""
    saved = []
    ctx = SimpleNamespace(save_for_backward=lambda *t: saved.extend(t))
    y = _bn._BatchNormFunction.forward(ctx, x, weight, bias, running_mean, running_var, True,
                                       _count(tracked, momentum), eps, True, residual)
    return y, saved[3], saved[4]


def bn_recompute(x, weight, bias, mean64, var64, eps, relu, leaky=None):
    """The forward's output again, bit for bit: the same kernel on the same inputs."""
    return normalize_group(x, x.numel() // x.shape[1], mean64, var64, weight, bias, eps, leaky,
                           relu)


def bn_backward(grad, x, weight, mean, var, y, eps, relu, residual=False):
    """(diff_src, diff_gamma, diff_beta) by normgrad.torch's BatchNorm backward, with the
    ReLU's backward fused in when `relu` (y: its output); with `residual`, also the
    masked gradient, the residual's (the JIT writes it as a side output)."""
    # The bias is read for its dtype alone (torch's is the weight's).
    ctx = SimpleNamespace(saved_tensors=(x, weight, weight, mean, var, y), step_state=None,
                          use_batch_stats=True, fuse_relu=relu, eps=eps, has_residual=residual,
                          mean_lo=_bn._mean_lo(x, mean, var, eps))
    out = _bn._BatchNormFunction.backward(ctx, grad)
    return (out[0], out[1], out[2], out[9]) if residual else (out[0], out[1], out[2])


def bn_counted(x, weight, bias, running_mean, running_var, tracked, momentum, eps):
    """torch's own training batch norm, with the module's batch count (a batch norm the
    rewrite leaves: aten's op does not count)."""
    factor = _count(tracked, momentum)
    return _aten.native_batch_norm(x, weight, bias, running_mean, running_var, True, factor, eps)


# -- the joint-graph rewrite --------------------------------------------------------------------

def _meta_like(node, like):
    if "tensor_meta" in like.meta:
        node.meta["tensor_meta"] = like.meta["tensor_meta"]
    if "val" in like.meta:
        node.meta["val"] = like.meta["val"]


def _meta_of(node, tensor):
    from torch.fx.passes.shape_prop import _extract_tensor_metadata
    node.meta["tensor_meta"] = _extract_tensor_metadata(tensor)


def _tensor_meta(node):
    return node.meta.get("tensor_meta") if isinstance(node, _torch.fx.Node) else None


def _through_detach(node):
    chain = _detach_chain(node)
    return chain[-1].args[0] if chain else node


def _getitems(node):
    return {u.args[1]: u for u in node.users if u.target == operator.getitem}


def _ancestors(outputs):
    seen, stack = set(), [o for o in outputs if isinstance(o, _torch.fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


_SUPPORTED = (_torch.float32, _torch.bfloat16, _torch.float16)


def rewrite_joint(gm, num_fwd_outputs, recompute, names=(), momenta=None):
    """Rewrites AOT's joint graph in place (module docstring); returns how many batch norms
    run on normgrad. The first `num_fwd_outputs` outputs are the forward's. `names`: the
    primal inputs' names (parameters, buffers, inputs, in aot_function's order), and
    `momenta`: batch-norm module path -> its momentum; without them (torch.compile's
    graphs, which count the batch themselves) the traced momentum, and no count."""
    import torch.utils._pytree as pytree
    momenta = momenta or {}
    g = gm.graph
    primal = [n for n in g.nodes if n.op == "placeholder" and "tangents" not in n.target]
    name_of = {n: names[k] for k, n in enumerate(primal) if k < len(names)}
    node_of = {v: n for n, v in name_of.items()}
    outputs = pytree.tree_flatten([n.args for n in g.nodes if n.op == "output"])[0]
    forward = _ancestors(outputs[:num_fwd_outputs])
    rewritten = 0
    for bn in [n for n in g.nodes if n.op == "call_function"
               and n.target == _aten.native_batch_norm.default and n.args[5]]:
        x, weight, bias, running_mean, running_var, _, _, eps = bn.args[:8]
        owner = name_of.get(running_mean, "").rsplit(".", 1)[0] if running_mean else None
        tracked = node_of.get(owner + ".num_batches_tracked") if owner is not None else None
        momentum = momenta[owner] if owner in momenta else bn.args[6]
        items = _getitems(bn)
        out, mean_n, invstd_n = items.get(0), items.get(1), items.get(2)
        backwards = list(dict.fromkeys(u for n in (mean_n, invstd_n) if n is not None
                                       for u in n.users))
        meta = _tensor_meta(x)
        fits = (meta is not None and meta.dtype in _SUPPORTED and len(meta.shape) >= 2
                and out is not None and len(bn.users) == len(items)
                and all(u.target == _aten.native_batch_norm_backward.default
                        and u.args[5] is mean_n and u.args[6] is invstd_n for u in backwards))
        if not fits:  # torch's op, with the module's batch count
            bn.target = bn_counted
            bn.args = (x, weight, bias, running_mean, running_var, tracked, momentum, eps)
            continue
        relu, add, residual = None, None, None
        leaky, leaky_backs = _leaky_of(out, forward)
        if leaky is not None:
            relu = leaky  # the activation whose output the rewrite produces
        elif len(out.users) == 1:
            (user,) = out.users
            if user.target == _aten.relu.default:
                relu = user
            else:
                residual = _residual_of(user, out, meta)
                if residual is not None:
                    add, relu = user, next(iter(user.users))
        slope = _slope(leaky) if leaky is not None else None
        y_old = relu if relu is not None else out
        # Before the Add when there is one: the residual may be made after the batch norm.
        with g.inserting_before(add if add is not None else bn):
            if residual is not None:
                fwd = g.call_function(bn_forward_residual, (x, weight, bias, running_mean,
                                                            running_var, tracked, momentum, eps,
                                                            residual))
            else:
                fwd = g.call_function(bn_forward, (x, weight, bias, running_mean, running_var,
                                                   tracked, momentum, eps,
                                                   relu is not None and leaky is None, slope))
            y, mean, var = (g.call_function(operator.getitem, (fwd, k)) for k in range(3))
            if residual is None:
                mean64, var64 = (g.call_function(operator.getitem, (fwd, k)) for k in (3, 4))
        _meta_like(y, y_old)
        for n in (mean, var):
            _meta_like(n, mean_n if mean_n is not None else invstd_n)
        if residual is None:
            for n in (mean64, var64):
                _meta_of(n, _torch.empty(meta.shape[1], dtype=_torch.float64))
        # The forward reads y; the backward reads a recomputation (or y itself). A residual
        # block's output is the next block's input, which the backward keeps anyway.
        late = [u for u in y_old.users if u not in forward and u.op != "output"]
        for u in list(y_old.users):
            if u not in late:
                u.replace_input_with(y_old, y)
        y_back = y
        if late and recompute and relu is not None and residual is None:
            first = min(late, key=lambda u: list(g.nodes).index(u))
            with g.inserting_before(first):
                y_back = g.call_function(bn_recompute, (x, weight, bias, mean64, var64, eps,
                                                        leaky is None, slope))
            _meta_like(y_back, y_old)
        for u in late:
            u.replace_input_with(y_old, y_back)
        # LeakyReLU's backward reads the batch norm's output; it reads the activation's
        # instead (the same mask: y > 0 exactly where leaky(y) > 0, the slope >= 0).
        for u in leaky_backs:
            u.args = (u.args[0], y_back, slope, True)
        for back in backwards:
            _rewrite_backward(g, back, x, weight, mean, var,
                              y_back if relu is not None and leaky is None else None, eps,
                              residual is not None)
        for n in [relu, add, out, mean_n, invstd_n]:
            if n is not None and not n.users:
                g.erase_node(n)
        g.erase_node(bn)
        rewritten += 1
    g.lint()
    gm.recompile()
    return rewritten


def _slope(leaky):
    return float(leaky.args[1]) if len(leaky.args) > 1 else 0.01


def _leaky_of(out, forward):
    """(the leaky_relu that is the forward's one reader of `out`, the leaky_relu_backward
    nodes that are its others), or (None, []). A negative slope does not qualify."""
    readers = list(out.users)
    acts = [u for u in readers if u.target == _aten.leaky_relu.default]
    if len(acts) != 1 or acts[0] not in forward or _slope(acts[0]) < 0 or acts[0].kwargs:
        return None, []
    slope = _slope(acts[0])
    backs = [u for u in readers if u is not acts[0]]
    if not all(u.target == _aten.leaky_relu_backward.default and u.args[1] is out
               and float(u.args[2]) == slope and u.args[3] is False for u in backs):
        return None, []
    return acts[0], backs


def _residual_of(add, out, meta):
    """The residual r when `add` is out + r (same shape and dtype, alpha 1) read by a
    ReLU alone, else None."""
    if (add.target != _aten.add.Tensor or add.kwargs or len(add.args) != 2
            or len(add.users) != 1 or next(iter(add.users)).target != _aten.relu.default):
        return None
    other = add.args[1] if add.args[0] is out else add.args[0]
    m = _tensor_meta(other)
    if other is out or m is None or m.shape != meta.shape or m.dtype != meta.dtype:
        return None
    return other


def _rewrite_backward(g, back, x, weight, mean, var, y, eps, residual):
    """A native_batch_norm_backward as bn_backward; when its gradient is the
    threshold_backward of the fused ReLU's output `y`, that too (with `residual`, its
    other readers read the side output)."""
    grad = back.args[0]
    fuse = (y is not None and grad.op == "call_function"
            and grad.target == _aten.threshold_backward.default and grad.args[2] == 0
            and _through_detach(grad.args[1]) is y
            and (residual or len(grad.users) == 1))
    # With a side output, right after the gradient (every other reader of it comes later,
    # and the forward's values before it); else where the batch norm's backward was.
    with (g.inserting_after(grad) if fuse and residual else g.inserting_before(back)):
        new = g.call_function(bn_backward, (grad.args[0] if fuse else grad, x, weight, mean, var,
                                            y if fuse else None, eps, fuse, fuse and residual))
    items = _getitems(back)
    if fuse and residual:
        with g.inserting_after(new):
            masked = g.call_function(operator.getitem, (new, 3))
        _meta_like(masked, grad)
        for u in list(grad.users):
            if u is not back:
                u.replace_input_with(grad, masked)
    for k, item in items.items():
        with g.inserting_after(new):
            got = g.call_function(operator.getitem, (new, k))
        _meta_like(got, item)
        item.replace_all_uses_with(got)
    for item in list(back.users):
        g.erase_node(item)
    g.erase_node(back)
    if fuse:
        for n in [grad] + _detach_chain(grad.args[1]):
            if not n.users:
                g.erase_node(n)


def _detach_chain(node):
    chain = []
    while (isinstance(node, _torch.fx.Node) and node.op == "call_function"
           and node.target == _aten.detach.default):
        chain.append(node)
        node = node.args[0]
    return chain


def _boxed(gm):
    """`gm` called with its inputs in one list that it empties (AOT's boxed calling
    convention): AOT hands the backward its saved tensors in that list, and the graph
    drops each after its last use, as eager autograd frees each op's saved tensors
    after that op's backward. Called with the inputs spread out (functorch's own
    make_boxed_func), the saved tensors would all live until the backward ends."""
    g = gm.graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    with g.inserting_before(placeholders[0]):
        args = g.placeholder("args")
    with g.inserting_after(placeholders[-1]):
        clear = g.call_method("clear", (args,))
    for k, ph in enumerate(placeholders):
        with g.inserting_before(clear):
            item = g.call_function(operator.getitem, (args, k))
        item.meta = dict(ph.meta)
        ph.replace_all_uses_with(item)
        g.erase_node(ph)
    g.lint()
    gm.recompile()

    def run(inputs):
        return gm(inputs)

    run._boxed_call = True
    return run


# -- the module ---------------------------------------------------------------------------------

class _Buffers:
    """The model's buffers before a first step: put back after a step that failed part
    way (a model AOT cannot trace), so that the fallback's step is the one that counts."""

    def __init__(self, model):
        self._saved = [(b, b.detach().clone()) for b in model.buffers()]

    def restore(self):
        with _torch.no_grad():
            for b, v in self._saved:
                b.copy_(v)


def _holds_normgrad_modules(model):
    from ._inplace_abn import InPlaceABN, InPlaceABNSync
    kinds = (_bn._NormgradBatchNorm, _bn.SyncBatchNorm, InPlaceABN, InPlaceABNSync)
    return any(isinstance(m, kinds) for m in model.modules())


class CompiledModule(_torch.nn.Module):
    """`model` with its training step compiled by normgrad.torch.compile (the module
    docstring of normgrad/_compile.py). ``module`` is the model; ``normgrad_batch_norms``
    counts the batch norms the last trace ran on normgrad."""

    def __init__(self, model, recompute):
        super().__init__()
        self.module = model
        self._recompute = recompute
        self._steps = {}
        self._converted = None
        self._failed = None
        self._as_is = None  # the model holds normgrad modules: run as it is
        self.normgrad_batch_norms = 0

    def _convert(self):
        if self._converted is None:
            from ._torch_convert import convert
            self._converted = convert(self.module, fuse=True)
        self._converted.train(self.training)
        return self._converted

    def forward(self, *args):
        tensors = [a for a in args if isinstance(a, _torch.Tensor)]
        if self._as_is is None:
            self._as_is = _holds_normgrad_modules(self.module)
            if self._as_is:
                warnings.warn("normgrad.torch.compile: the model already holds normgrad.torch "
                              "modules (convert's, or its own), which AOT autograd cannot trace "
                              "into: it runs as it is. Compile torch's model instead",
                              stacklevel=2)
        if self._as_is:
            return self.module(*args)
        if (self._failed is not None or not self.training or not _torch.is_grad_enabled()
                or len(tensors) != len(args)):
            return self._convert()(*args)
        autocast = (_torch.is_autocast_cpu_enabled(), _torch.get_autocast_cpu_dtype())
        key = (autocast, tuple((tuple(t.shape), t.dtype, t.stride(), t.requires_grad)
                               for t in tensors))
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = self._trace()
        buffers = _Buffers(self.module) if step.fresh else None
        try:
            return step(*args)
        except Exception as e:  # noqa: BLE001 - any tracing failure falls back, said
            if not step.fresh:
                raise
            buffers.restore()
            self._steps.pop(key, None)
            self._failed = "%s: %s" % (type(e).__name__, e)
            warnings.warn("normgrad.torch.compile: AOT autograd cannot trace this model's step "
                          "(%s); running convert(model, fuse=True) instead" % self._failed,
                          stacklevel=2)
            return self._convert()(*args)
        finally:
            step.fresh = False

    def _trace(self):
        from functorch._src.named_members_polyfill import _named_buffers, _named_parameters
        from functorch.compile import aot_function, default_partition
        from torch.nn.utils import stateless
        model = self.module
        params = dict(_named_parameters(model, remove_duplicate=False))
        buffers = dict(_named_buffers(model, remove_duplicate=False))
        names = list(params) + list(buffers)
        modules = dict(model.named_modules())
        state = SimpleNamespace(traced=False)
        momenta = {path: m.momentum for path, m in modules.items()
                   if isinstance(m, _torch.nn.modules.batchnorm._BatchNorm)}

        def functional_call(named_params, named_buffers, *args):
            return stateless.functional_call(model, {**named_params, **named_buffers}, args)

        def partition(joint, joint_inputs):
            self.normgrad_batch_norms = rewrite_joint(
                joint, joint._out_spec.children_specs[0].num_leaves, self._recompute, names,
                momenta)
            return default_partition(joint, joint_inputs)

        def keep(gm, _inputs):
            return _boxed(gm)

        compiled = aot_function(functional_call, keep, keep, partition_fn=partition)

        def step(*args):
            from functorch._src import config
            params = dict(_named_parameters(model, remove_duplicate=False))
            buffers = dict(_named_buffers(model, remove_duplicate=False))
            if state.traced:
                return compiled(params, buffers, *args)
            # Traced on fake tensors (shapes and dtypes, no data): tracing on the real
            # ones, functorch's default, takes a second step's memory. momentum=None
            # makes torch's module read num_batches_tracked's value in Python, which
            # no trace can: it traces with a number there, and the rewrite takes the
            # cumulative average from the module's own momentum (`momenta`).
            fake, config.use_fake_tensor = config.use_fake_tensor, True
            cumulative = [m for m in modules.values()
                          if isinstance(m, _torch.nn.modules.batchnorm._BatchNorm)
                          and m.momentum is None]
            for m in cumulative:
                m.momentum = 0.0
            try:
                out = compiled(params, buffers, *args)
            finally:
                config.use_fake_tensor = fake
                for m in cumulative:
                    m.momentum = None
            state.traced = True
            return out

        step.fresh = True
        return step


def compile(model, recompute=True):  # noqa: A001 - torch.compile's name, on purpose
    """`model`'s training step on normgrad through AOT autograd (normgrad/_compile.py):
    the batch norms (with their ReLUs) on normgrad's kernels, forward and backward, the
    rest on aten; with ``recompute`` the backward recomputes each BN+ReLU's output instead
    of keeping it. Returns a module holding `model` (the same Parameters and buffers)."""
    if not isinstance(model, _torch.nn.Module):
        raise TypeError("normgrad.torch.compile: expected a torch.nn.Module, got %s"
                        % type(model).__name__)
    if not isinstance(recompute, bool):
        raise TypeError("normgrad.torch.compile: recompute must be True or False, got %r"
                        % (recompute,))
    return CompiledModule(model, recompute)


def dynamo_backend(recompute=True):
    """A ``torch.compile`` backend on torch 2.x: ``torch.compile(model,
    backend=normgrad.torch.dynamo_backend())``. The same rewrite and the same boxed
    graphs through torch._dynamo's ``aot_autograd``; torch 2's graphs count the batch
    themselves, so the rewrite takes the traced momentum. Not available on torch 1.13
    (no torch.compile): use normgrad.torch.compile(model) there."""
    major = int(_torch.__version__.split(".")[0])
    if major < 2:
        raise RuntimeError("normgrad.torch.dynamo_backend needs torch 2 (torch.compile and "
                           "torch._dynamo); this is torch %s: use normgrad.torch.compile(model)"
                           % _torch.__version__)
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        rewrite_joint(joint, num_fwd_outputs, recompute)
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    def keep(gm, _inputs):
        return _boxed(gm)
    return aot_autograd(fw_compiler=keep, bw_compiler=keep, partition_fn=partition)
