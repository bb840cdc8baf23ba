#!/usr/bin/env python3
"""resnet_graph.py: a ResNet-shaped training graph in oneDNN's graph JSON.

K basic blocks, each a whole training step's share of one residual block:

  forward   Convolution -> BatchNormForwardTraining -> ReLU -> Convolution
            -> BatchNormForwardTraining -> Add(residual) -> ReLU
  backward  ReLUBackward -> BatchNormTrainingBackward -> ConvolutionBackwardData
            and ConvolutionBackwardWeights -> ReLUBackward
            -> BatchNormTrainingBackward -> the convolution's backward
            -> Add of the two gradient paths

16 ops a block (10 with --no-conv, where each convolution is the identity).
Block k's output feeds block k+1; the backward runs the blocks in reverse, its
first gradient a graph input. The residual ReLUBackward's output feeds both
the batch norm's backward and the gradient Add: the case a graph of single
ops never shows. Convolutions are oneDNN Graph ops normgrad carries and hands
back (`normgrad run --cut-unsupported` runs the rest).

    scripts/resnet_graph.py --blocks 3 --shape 4x24x7x9 --dt bf16 \
        --layout nxc --no-conv -o g.json
"""
import argparse
import json
import sys


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=2, help="residual blocks (K)")
    p.add_argument("--shape", default="2x8x4x4", help="NxCxHxW of every block")
    p.add_argument("--dt", default="f32", choices=["f32", "bf16", "f16"])
    p.add_argument("--layout", default="ncx", choices=["ncx", "nxc"])
    p.add_argument("--no-conv", action="store_true", help="identity for each convolution")
    p.add_argument("--epsilon", type=float, default=1e-5)
    p.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
    a = p.parse_args(argv)
    try:
        n, c, h, w = (int(v) for v in a.shape.lower().split("x"))
    except ValueError:
        p.error("--shape wants NxCxHxW, got %r" % a.shape)
    if min(n, c, h, w) < 1 or a.blocks < 1:
        p.error("--shape dims and --blocks must be positive")
    json.dump(build(a.blocks, (n, c, h, w), a.dt, a.layout, not a.no_conv, a.epsilon),
              sys.stdout if a.output == "-" else open(a.output, "w"), indent=None)
    return 0


def build(blocks, nchw, dt, layout, conv, epsilon):
    n, c, h, w = nchw
    nxc = layout == "nxc"
    fmt = "NXC" if nxc else "NCX"
    data_shape = [n, h, w, c] if nxc else [n, c, h, w]
    state = {"tensor": 0, "op": 0}
    ops = []

    def dense(shape):
        s, acc = [], 1
        for d in reversed(shape):
            s.append(acc)
            acc *= d
        return list(reversed(s))

    def tensor(shape, dtype=dt):
        t = {"id": state["tensor"], "dtype": dtype, "shape": list(shape),
             "stride": dense(shape), "layout_type": "strided", "property_type": "undef"}
        state["tensor"] += 1
        return t

    def data():
        return tensor(data_shape)

    def channel():
        return tensor([c], "f32")

    def op(kind, name, inputs, outputs, attrs=None):
        ops.append({"id": state["op"], "name": name, "kind": kind,
                    "attrs": attrs or {}, "inputs": inputs, "outputs": outputs})
        state["op"] += 1
        return outputs

    def conv_attrs(extra):
        a = {"strides": {"type": "s64[]", "value": [1, 1]},
             "pads_begin": {"type": "s64[]", "value": [1, 1]},
             "pads_end": {"type": "s64[]", "value": [1, 1]},
             "dilations": {"type": "s64[]", "value": [1, 1]},
             "auto_pad": {"type": "string", "value": "None"},
             "groups": {"type": "s64", "value": 1},
             "data_format": {"type": "string", "value": fmt},
             "weights_format": {"type": "string", "value": "OIX"}}
        a.update(extra)
        return a

    bn_attrs = {"epsilon": {"type": "f32", "value": epsilon},
                "momentum": {"type": "f32", "value": 0.1},
                "data_format": {"type": "string", "value": fmt}}
    bwd_attrs = {"epsilon": {"type": "f32", "value": epsilon},
                 "data_format": {"type": "string", "value": fmt}}
    relu_bwd_attrs = {"use_dst": {"type": "bool", "value": 1}}
    weights_shape = [c, c, 3, 3]

    saved = []  # per block, what the backward reads
    x = data()
    for k in range(blocks):
        b = {"x": x}
        for i in (1, 2):
            src = x if i == 1 else b["r1"]
            if conv:
                wt = tensor(weights_shape)
                b["w%d" % i] = wt
                (cv,) = op("Convolution", "b%d.conv%d" % (k, i), [src, wt], [data()],
                           conv_attrs({}))
            else:
                cv = src
            b["c%d" % i] = cv
            gamma, beta = channel(), channel()
            outs = op("BatchNormForwardTraining", "b%d.bn%d" % (k, i),
                      [cv, channel(), channel(), gamma, beta],
                      [data(), channel(), channel(), channel(), channel()], bn_attrs)
            b["gamma%d" % i], b["mean%d" % i], b["var%d" % i] = gamma, outs[3], outs[4]
            if i == 1:
                (b["r1"],) = op("ReLU", "b%d.relu1" % k, [outs[0]], [data()])
            else:
                (s,) = op("Add", "b%d.add" % k, [outs[0], x], [data()])
                (x,) = op("ReLU", "b%d.relu2" % k, [s], [data()])
                b["out"] = x
        saved.append(b)

    dout = data()
    for k in reversed(range(blocks)):
        b = saved[k]
        (d_s,) = op("ReLUBackward", "b%d.relu2_bwd" % k, [b["out"], dout], [data()],
                    relu_bwd_attrs)
        grad = d_s
        for i in (2, 1):
            if i == 1:
                (grad,) = op("ReLUBackward", "b%d.relu1_bwd" % k, [b["r1"], grad], [data()],
                             relu_bwd_attrs)
            outs = op("BatchNormTrainingBackward", "b%d.bn%d_bwd" % (k, i),
                      [b["c%d" % i], grad, b["mean%d" % i], b["var%d" % i], b["gamma%d" % i]],
                      [data(), channel(), channel()], bwd_attrs)
            grad = outs[0]
            if conv:
                src = b["x"] if i == 1 else b["r1"]
                op("ConvolutionBackwardWeights", "b%d.conv%d_bwd_weights" % (k, i), [src, grad],
                   [tensor(weights_shape)], conv_attrs({"weights_shape": {
                       "type": "s64[]", "value": weights_shape}}))
                (grad,) = op("ConvolutionBackwardData", "b%d.conv%d_bwd_data" % (k, i),
                             [grad, b["w%d" % i]], [data()],
                             conv_attrs({"dst_shape": {"type": "s64[]", "value": data_shape}}))
        (dout,) = op("Add", "b%d.grad_add" % k, [grad, d_s], [data()])
    return {"version": "3.5.0", "engine_kind": "cpu", "fpmath_mode": "strict", "graph": ops}


if __name__ == "__main__":
    sys.exit(main())
