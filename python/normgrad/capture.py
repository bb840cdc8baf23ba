"""Capture a PyTorch model's training step as one normgrad graph.

``capture(model, *example_inputs)`` traces the forward and the backward
through functorch's AOT autograd (``aot_module``), which hands a compiler
each half as an fx graph of aten ops, and writes both as one oneDNN-format
graph: the tensors the forward saves for the backward are edges between
the halves, and the backward's first gradients are graph inputs.

    python3 -m normgrad.capture resnet18 --batch 2 --size 32 -o resnet18.json
    normgrad partitions resnet18.json
    normgrad run resnet18.json --cut-unsupported --check

How the aten ops map:

- ``native_batch_norm`` in training is BatchNormForwardTraining. Its
  outputs ``save_mean`` and ``save_invstd`` are the op's batch_mean and
  batch_variance: the backward that reads them is given
  ``variance_is_inv_std = false``, so it recomputes 1/sqrt(var + eps) from
  the biased batch variance with the same epsilon, which is what
  ``save_invstd`` holds. torch's ``momentum`` m is oneDNN's 1 - m (oneDNN
  weighs the old running value by momentum). The running-variance output
  is oneDNN's (the biased batch variance); torch updates with the unbiased
  one: nothing in the step reads it.
- ``native_batch_norm`` in eval is BatchNormInference (affine only; a
  non-affine one stays a Wildcard).
- ``native_batch_norm_backward`` is BatchNormTrainingBackward (diff_src,
  diff_gamma, diff_beta; gamma absent when not affine); in eval it reads the
  running statistics with ``is_training = false`` (frozen statistics:
  diff_src = gamma · dy / sqrt(running_var + eps)).
- ``relu`` and ``threshold_backward`` (threshold 0, reading the ReLU's
  output) are ReLU and ReLUBackward with ``use_dst``; ``leaky_relu`` is
  LeakyReLU; ``add.Tensor`` of two same-shaped tensors with alpha 1 is Add;
  ``_to_copy`` that changes only the dtype is TypeCast.
- ``convolution`` and ``convolution_backward`` are Convolution,
  ConvolutionBackwardData, ConvolutionBackwardWeights and BiasAddBackward;
  ``addmm``/``mm`` are MatMul, ``t`` StaticTranspose, ``max_pool2d`` and its
  backward MaxPool and MaxPoolBackward, ``mean.dim`` ReduceMean,
  ``sum.dim_IntList`` ReduceSum, views StaticReshape: kinds normgrad carries
  and hands back.
- ``detach`` and ``alias`` are their input's tensor (no op).
- Any other aten op is a ``Wildcard`` whose ``aten`` attribute keeps its
  name, so the graph is complete.

Tensors keep torch's shapes, dtypes and strides: a channels_last tensor is
an NCX tensor with channels-last strides (the JIT walks it as NXC). A
broadcast view (``expand``, stride 0) is written dense: oneDNN Graph has no
overlapping strides. ``Capture.names`` names the graph
inputs after the model's parameters, buffers and inputs, and the outputs
after the gradients and the step's results.
"""
import argparse
import operator
import sys

import torch

from . import _normgrad

__all__ = ["Capture", "CaptureError", "capture", "main"]

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
           torch.int64: "s64", torch.int32: "s32", torch.int8: "s8", torch.uint8: "u8",
           torch.bool: "boolean", torch.float64: "f64"}


class CaptureError(ValueError):
    """The model cannot be captured: the message says which op or construct."""


class Capture:
    """A captured training step: ``graph`` (a normgrad.Graph, not finalized),
    ``json`` (its oneDNN-format text) and ``names`` (tensor id -> the
    parameter, buffer, input or gradient it stands for)."""

    def __init__(self, doc, names):
        import json
        self.json = json.dumps(doc)
        self.names = names
        self.graph = _normgrad.graph_from_json(self.json)

    def save(self, path):
        with open(path, "w") as f:
            f.write(self.json)


def _pair(v):
    """An int or a list of ints as a list of two."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * 2 if len(v) == 1 else v)]


def _ints(v):
    return {"type": "s64[]", "value": [int(x) for x in v]}


class _Builder:
    """The graph under construction: tensors by fx value, ops in order."""

    def __init__(self):
        self.ops = []
        self.next_tensor = 0
        self.names = {}

    def tensor(self, meta):
        if meta is None or not hasattr(meta, "shape"):
            raise CaptureError("a value without tensor metadata (shape propagation found none)")
        if meta.dtype not in _DTYPES:
            raise CaptureError("dtype %s has no oneDNN Graph name" % meta.dtype)
        shape = [int(d) for d in meta.shape]
        stride = [int(s) for s in meta.stride]
        if any(s == 0 and d > 1 for s, d in zip(stride, shape)):
            # A broadcast view (expand): oneDNN Graph has no overlapping
            # strides, so it is a dense tensor of the same values.
            stride = [1] * len(shape)
            for k in range(len(shape) - 2, -1, -1):
                stride[k] = stride[k + 1] * max(shape[k + 1], 1)
        t = {"id": self.next_tensor, "dtype": _DTYPES[meta.dtype], "shape": shape,
             "stride": stride, "layout_type": "strided", "property_type": "undef"}
        self.next_tensor += 1
        return t

    def op(self, kind, name, inputs, outputs, attrs=None):
        self.ops.append({"id": len(self.ops), "name": name, "kind": kind, "attrs": attrs or {},
                         "inputs": inputs, "outputs": outputs})


class _Half:
    """One fx graph (forward or backward) written into the builder.

    ``values`` maps each fx node to what it produced: a tensor dict, a tuple
    of them (multi-output aten ops, read through getitem), or None.
    """

    def __init__(self, builder, gm, tag):
        self.b = builder
        self.gm = gm
        self.tag = tag
        self.values = {}

    def meta(self, node):
        return node.meta.get("tensor_meta")

    def fresh(self, node):
        return self.b.tensor(self.meta(node))

    def arg(self, a):
        """The tensor dict of an fx argument (None for None)."""
        if a is None:
            return None
        if isinstance(a, torch.fx.Node):
            v = self.values.get(a)
            if v is None:
                raise CaptureError("%s: %s has no tensor" % (self.tag, a.name))
            return v
        raise CaptureError("%s: expected a tensor argument, got %r" % (self.tag, a))

    def run(self, placeholders):
        """Writes the graph; `placeholders` gives the tensors of the inputs in order."""
        inputs = iter(placeholders)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.values[node] = next(inputs)
            elif node.op == "call_function":
                self.values[node] = self.call(node)
            elif node.op == "output":
                return [self.values.get(a) if isinstance(a, torch.fx.Node) else None
                        for a in node.args[0]]
            else:
                raise CaptureError("%s: fx node %s (%s) is not an aten call" %
                                   (self.tag, node.name, node.op))
        return []

    def call(self, node):
        t = node.target
        if t is operator.getitem:
            parent = self.values.get(node.args[0])
            item = parent[node.args[1]] if isinstance(parent, tuple) else None
            if item is None:
                raise CaptureError("%s: %s reads an output nothing wrote" % (self.tag, node.name))
            return item
        name = getattr(t, "__name__", str(t))
        packet = str(getattr(t, "overloadpacket", name))
        handler = getattr(self, "op_" + packet.replace("aten.", "").replace(".", "_"), None)
        try:
            if handler is not None:
                result = handler(node)
                if result is not NotImplemented:
                    return result
            return self.wildcard(node)
        except CaptureError:
            raise
        except (ValueError, TypeError, IndexError, KeyError) as e:
            raise CaptureError("%s: cannot map %s (%s): %s: %s" %
                               (self.tag, node.name, node.target, type(e).__name__, e)) from e

    # ---- the mapped ops

    @staticmethod
    def is_multi(metas):
        # TensorMetadata is itself a named tuple: one tensor has a shape.
        return isinstance(metas, (tuple, list)) and not hasattr(metas, "shape")

    def outputs_for(self, node, count):
        metas = self.meta(node)
        if not self.is_multi(metas):
            metas = (metas,)
        return tuple(self.b.tensor(m) if m is not None and hasattr(m, "shape") else None
                     for m in list(metas)[:count])

    def op_native_batch_norm(self, node):
        x, w, bias, rm, rv, training, momentum, eps = node.args[:8]
        src = self.arg(x)
        gamma, beta = self.arg(w), self.arg(bias)
        dst, save_mean, save_invstd = self.outputs_for(node, 3)
        fmt = {"type": "string", "value": "NCX"}
        if training:
            if rm is None or rv is None or momentum is None:
                return NotImplemented  # no running statistics: torch computes and keeps none
            running_mean, running_var = self.b.tensor(self.meta(rm)), self.b.tensor(self.meta(rv))
            ins = [src, self.arg(rm), self.arg(rv)]
            if gamma is not None:
                ins += [gamma, beta]
            self.b.op("BatchNormForwardTraining", node.name, ins,
                      [dst, running_mean, running_var, save_mean, save_invstd],
                      {"epsilon": {"type": "f32", "value": float(eps)},
                       "momentum": {"type": "f32", "value": 1.0 - float(momentum)},
                       "data_format": fmt})
            return (dst, save_mean, save_invstd)
        if gamma is None:
            return NotImplemented
        self.b.op("BatchNormInference", node.name, [src, gamma, beta, self.arg(rm), self.arg(rv)],
                  [dst], {"epsilon": {"type": "f32", "value": float(eps)}, "data_format": fmt})
        # torch's eval save_mean and save_invstd are empty: no op writes them.
        return (dst, save_mean, save_invstd)

    def op_native_batch_norm_backward(self, node):
        dy, x, w, rm, rv, save_mean, save_invstd, train, eps = node.args[:9]
        if train:
            ins = [self.arg(x), self.arg(dy), self.arg(save_mean), self.arg(save_invstd)]
        elif rm is not None and rv is not None:
            # Eval: frozen running statistics (TensorFlow's is_training = false).
            ins = [self.arg(x), self.arg(dy), self.arg(rm), self.arg(rv)]
        else:
            return NotImplemented
        if w is not None:
            ins.append(self.arg(w))
        outs = self.outputs_for(node, 3)
        # diff_src is required: a backward whose input needs no gradient
        # still writes one, which nothing reads.
        diff_src = outs[0] if outs[0] is not None else self.b.tensor(self.meta(x))
        kept = [diff_src] + ([outs[1], outs[2]] if outs[1] is not None else [])
        self.b.op("BatchNormTrainingBackward", node.name, ins, kept,
                  {"epsilon": {"type": "f32", "value": float(eps)},
                   "data_format": {"type": "string", "value": "NCX"},
                   "is_training": {"type": "bool", "value": 1 if train else 0}})
        return outs

    def op_detach(self, node):
        # An alias of its input (autograd's bookkeeping): no op, the same tensor.
        return self.arg(node.args[0])

    op_alias = op_detach

    def op_relu(self, node):
        (dst,) = self.outputs_for(node, 1)
        self.b.op("ReLU", node.name, [self.arg(node.args[0])], [dst])
        return dst

    def op_threshold_backward(self, node):
        grad, out, threshold = node.args[:3]
        producer = out.target if isinstance(out, torch.fx.Node) else None
        if float(threshold) != 0.0:
            return NotImplemented
        # threshold_backward(grad, y, 0) = grad where y > 0: ReLUBackward on
        # the ReLU's output (use_dst) or on its input, the same mask.
        (dx,) = self.outputs_for(node, 1)
        use_dst = producer is not None and "relu" in str(producer)
        self.b.op("ReLUBackward", node.name, [self.arg(out), self.arg(grad)], [dx],
                  {"use_dst": {"type": "bool", "value": 1 if use_dst else 0}})
        return dx

    def op_leaky_relu(self, node):
        slope = node.args[1] if len(node.args) > 1 else 0.01
        (dst,) = self.outputs_for(node, 1)
        self.b.op("LeakyReLU", node.name, [self.arg(node.args[0])], [dst],
                  {"alpha": {"type": "f32", "value": float(slope)}})
        return dst

    def op_add(self, node):
        a, b = node.args[:2]
        alpha = node.kwargs.get("alpha", 1)
        if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)) or alpha != 1:
            return NotImplemented
        ta, tb = self.arg(a), self.arg(b)
        if ta["shape"] != tb["shape"] or ta["dtype"] != tb["dtype"]:
            return NotImplemented
        (dst,) = self.outputs_for(node, 1)
        self.b.op("Add", node.name, [ta, tb], [dst])
        return dst

    def op__to_copy(self, node):
        src = self.arg(node.args[0])
        (dst,) = self.outputs_for(node, 1)
        if set(node.kwargs) - {"dtype"} or dst["shape"] != src["shape"]:
            return NotImplemented
        self.b.op("TypeCast", node.name, [src], [dst])
        return dst

    def conv_attrs(self, stride, padding, dilation, groups):
        return {"strides": _ints(stride), "pads_begin": _ints(padding), "pads_end": _ints(padding),
                "dilations": _ints(dilation), "auto_pad": {"type": "string", "value": "None"},
                "groups": {"type": "s64", "value": int(groups)},
                "data_format": {"type": "string", "value": "NCX"},
                "weights_format": {"type": "string", "value": "OIX"}}

    def op_convolution(self, node):
        x, w, bias, stride, padding, dilation, transposed, _, groups = node.args[:9]
        if transposed:
            return NotImplemented
        ins = [self.arg(x), self.arg(w)] + ([self.arg(bias)] if bias is not None else [])
        (dst,) = self.outputs_for(node, 1)
        self.b.op("Convolution", node.name, ins, [dst],
                  self.conv_attrs(stride, padding, dilation, groups))
        return dst

    def op_convolution_backward(self, node):
        (dy, x, w, bias_sizes, stride, padding, dilation, transposed, _, groups,
         mask) = node.args[:11]
        if transposed:
            return NotImplemented
        gx, gw, gb = self.outputs_for(node, 3)
        attrs = self.conv_attrs(stride, padding, dilation, groups)
        if mask[0] and gx is not None:
            self.b.op("ConvolutionBackwardData", node.name + ".data", [self.arg(dy), self.arg(w)],
                      [gx], dict(attrs, dst_shape=_ints(gx["shape"])))
        if mask[1] and gw is not None:
            self.b.op("ConvolutionBackwardWeights", node.name + ".weights",
                      [self.arg(x), self.arg(dy)], [gw],
                      dict(attrs, weights_shape=_ints(gw["shape"])))
        if len(mask) > 2 and mask[2] and gb is not None:
            self.b.op("BiasAddBackward", node.name + ".bias", [self.arg(dy)], [gb],
                      {"data_format": {"type": "string", "value": "NCX"}})
        return (gx if mask[0] else None, gw if mask[1] else None,
                gb if len(mask) > 2 and mask[2] else None)

    def simple(self, node, kind, inputs, attrs=None):
        (dst,) = self.outputs_for(node, 1)
        self.b.op(kind, node.name, [self.arg(a) for a in inputs], [dst], attrs)
        return dst

    def op_mm(self, node):
        return self.simple(node, "MatMul", node.args[:2])

    def op_addmm(self, node):
        bias, a, b = node.args[:3]
        if node.kwargs:
            return NotImplemented
        return self.simple(node, "MatMul", [a, b, bias])

    def op_t(self, node):
        return self.simple(node, "StaticTranspose", node.args[:1],
                           {"order": _ints([1, 0])})

    def reshape(self, node):
        (dst,) = self.outputs_for(node, 1)
        self.b.op("StaticReshape", node.name, [self.arg(node.args[0])], [dst],
                  {"shape": _ints(dst["shape"]),
                   "special_zero": {"type": "bool", "value": 0}})
        return dst

    op_view = reshape
    op__reshape_alias = reshape

    def reduce(self, node, kind):
        x, dims = node.args[:2]
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if node.kwargs.get("dtype") is not None:
            return NotImplemented
        return self.simple(node, kind, [x], {"axes": _ints(dims),
                                             "keep_dims": {"type": "bool", "value": int(keep)}})

    def op_mean(self, node):
        return self.reduce(node, "ReduceMean") if len(node.args) > 1 else NotImplemented

    def op_sum(self, node):
        return self.reduce(node, "ReduceSum") if len(node.args) > 1 else NotImplemented

    def pool_attrs(self, node):
        # max_pool2d(x, kernel, stride=[], padding=0, dilation=1, ceil_mode=False);
        # fx leaves out the trailing defaults.
        args = list(node.args[1:]) + [None] * 5
        kernel, stride, padding, dilation, ceil = args[:5]
        kernel = _pair(kernel)
        stride = _pair(stride) if stride else kernel
        padding = _pair(padding if padding is not None else 0)
        dilation = _pair(dilation if dilation is not None else 1)
        return {"kernel": _ints(kernel), "strides": _ints(stride), "pads_begin": _ints(padding),
                "pads_end": _ints(padding), "dilations": _ints(dilation),
                "rounding_type": {"type": "string", "value": "ceil" if ceil else "floor"},
                "data_format": {"type": "string", "value": "NCX"}}

    def op_max_pool2d_with_indices(self, node):
        dst, idx = self.outputs_for(node, 2)
        self.b.op("MaxPool", node.name, [self.arg(node.args[0])], [dst], self.pool_attrs(node))
        return (dst, idx)

    def op_max_pool2d_with_indices_backward(self, node):
        # oneDNN's MaxPoolBackward takes src and recomputes the argmax.
        dy, x = node.args[:2]
        (dx,) = self.outputs_for(node, 1)
        attrs = self.pool_attrs(_Shifted(node))
        self.b.op("MaxPoolBackward", node.name, [self.arg(x), self.arg(dy)], [dx], attrs)
        return dx

    def wildcard(self, node):
        """An op with no oneDNN Graph kind normgrad carries: kept, named, complete."""
        ins = [self.values[a] for a in node.all_input_nodes
               if isinstance(self.values.get(a), dict)]
        metas = self.meta(node)
        multi = self.is_multi(metas)
        outs = self.outputs_for(node, len(metas) if multi else 1)
        scalars = [repr(a) for a in node.args if not isinstance(a, torch.fx.Node)]
        self.b.op("Wildcard", node.name, ins, [o for o in outs if o is not None],
                  {"aten": {"type": "string", "value": str(node.target)},
                   "args": {"type": "string", "value": ", ".join(scalars)}})
        return outs if multi else outs[0]


class _Shifted:
    """A max_pool2d_with_indices_backward node's arguments as the forward's
    (its first argument is the gradient), for pool_attrs."""

    def __init__(self, node):
        self.args = node.args[1:]


def _shape_prop(gm, example):
    from torch.fx.passes.shape_prop import ShapeProp
    # Clones: running the forward again would update the model's buffers.
    args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in example]
    ShapeProp(gm).propagate(*args)


def capture(model, *example_inputs, autocast=None):
    """The training step of `model` on `example_inputs` as one normgrad graph.

    `autocast` is None or a torch dtype (torch.bfloat16) for
    ``torch.autocast("cpu", dtype)`` around the step. The model's outputs
    are summed into the loss (their gradients, ones, are graph inputs named
    ``grad:output<i>``). Raises CaptureError when AOT autograd cannot trace
    the model (data-dependent control flow, for instance), with its reason.
    """
    try:
        from functorch.compile import aot_module, make_boxed_func
    except ImportError as e:  # pragma: no cover - torch without functorch
        raise CaptureError("capture needs functorch's AOT autograd (torch >= 1.13): %s" % e)
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    halves = {}

    def keep(tag):
        def compiler(gm, example):
            _shape_prop(gm, example)
            halves[tag] = gm
            return make_boxed_func(gm.forward)
        return compiler

    traced = aot_module(model, fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    try:
        if autocast is not None:
            with torch.autocast("cpu", dtype=autocast):
                out = traced(*example_inputs)
        else:
            out = traced(*example_inputs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        torch.autograd.backward([o for o in outs if o.requires_grad],
                                [torch.ones_like(o) for o in outs if o.requires_grad])
    except CaptureError:
        raise
    except Exception as e:  # what AOT autograd or the model raised while tracing
        raise CaptureError("AOT autograd could not trace %s: %s: %s" %
                           (type(model).__name__, type(e).__name__, e)) from e
    if "forward" not in halves or "backward" not in halves:
        raise CaptureError("%s: the step has no backward (no parameter needs a gradient)" %
                           type(model).__name__)
    return _assemble(halves["forward"], halves["backward"], names, len(outs))


def _assemble(fw, bw, names, n_outputs):
    b = _Builder()
    fw_half = _Half(b, fw, "forward")
    primals = [n for n in fw.graph.nodes if n.op == "placeholder"]
    inputs, primal_names = [], []
    for i, node in enumerate(primals):
        t = b.tensor(node.meta.get("tensor_meta"))
        primal_names.append(names[i] if i < len(names) else "input%d" % (i - len(names)))
        b.names[t["id"]] = primal_names[-1]
        inputs.append(t)
    fw_out = fw_half.run(inputs)
    saved = fw_out[n_outputs:]
    bw_nodes = [n for n in bw.graph.nodes if n.op == "placeholder"]
    bw_in = []
    k = 0
    for node in bw_nodes:
        if node.name.startswith("tangents"):
            t = b.tensor(node.meta.get("tensor_meta"))
            b.names[t["id"]] = "grad:output%d" % (len(bw_in) - len(saved))
            bw_in.append(t)
        else:
            if k >= len(saved) or saved[k] is None:
                raise CaptureError("backward input %s is no tensor the forward saved" % node.name)
            bw_in.append(saved[k])
            k += 1
    bw_half = _Half(b, bw, "backward")
    grads = bw_half.run(bw_in)
    for i, t in enumerate(fw_out[:n_outputs]):
        if isinstance(t, dict):
            b.names[t["id"]] = "output%d" % i
    for i, t in enumerate(grads):  # one per primal, None where none is needed
        if isinstance(t, dict) and i < len(primal_names):
            b.names[t["id"]] = "grad:" + primal_names[i]
    doc = {"version": "3.5.0", "engine_kind": "cpu", "fpmath_mode": "strict", "graph": b.ops}
    return Capture(doc, b.names)


def leaky_relus(module, slope):
    """Replaces every torch.nn.ReLU under `module` by a LeakyReLU of `slope`,
    not in place: its backward then reads its input (an in-place one's reads
    its output, as ReLU's does). Returns how many it replaced."""
    n = 0
    for name, child in module.named_children():
        if isinstance(child, torch.nn.ReLU):
            setattr(module, name, torch.nn.LeakyReLU(slope))
            n += 1
        else:
            n += leaky_relus(child, slope)
    return n


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python3 -m normgrad.capture",
        description="Capture a torchvision model's training step as one oneDNN-format graph.")
    p.add_argument("model", help="a torchvision.models name (resnet18, mobilenet_v2, ...)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", type=int, default=32, help="input height and width")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--autocast", choices=["bf16"], help="torch.autocast('cpu', bfloat16)")
    p.add_argument("--eval", action="store_true", help="the model in eval mode")
    p.add_argument("--leaky-relu", type=float, metavar="SLOPE",
                   help="every nn.ReLU module replaced by nn.LeakyReLU(SLOPE) first, not in "
                   "place (its backward reads its input, so each batch norm's output is read "
                   "twice)")
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args(argv)
    import torchvision
    if not hasattr(torchvision.models, a.model):
        p.error("torchvision.models has no model %r" % a.model)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=10)
    model.train(not a.eval)
    if a.leaky_relu is not None:
        leaky_relus(model, a.leaky_relu)
    x = torch.randn(a.batch, 3, a.size, a.size)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    try:
        c = capture(model, x, autocast=torch.bfloat16 if a.autocast else None)
    except CaptureError as e:
        print("normgrad.capture: %s" % e, file=sys.stderr)
        return 1
    c.save(a.output)
    kinds = {}
    for op in __import__("json").loads(c.json)["graph"]:
        kinds[op["kind"]] = kinds.get(op["kind"], 0) + 1
    print("%s: %d ops (%s) -> %s" % (a.model, sum(kinds.values()),
                                     ", ".join("%s %d" % kv for kv in sorted(kinds.items())),
                                     a.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
