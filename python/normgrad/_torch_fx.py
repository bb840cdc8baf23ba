"""Fusion over a whole model with torch.fx: BN -> ReLU and BN -> Add -> ReLU.

``fuse(model)`` traces the model (after convert swapped its batch norms for
normgrad's) and rewrites two shapes of its graph:
  - a normgrad BatchNorm whose only user is a ReLU (an nn.ReLU module, or
    torch.relu / F.relu / .relu()): the BN takes the ReLU in (fuse_relu);
  - a normgrad BatchNorm whose only user is an add (``+``, ``+=``, torch.add
    without alpha) whose only user is a ReLU: torchvision's BasicBlock and
    Bottleneck, where ``out += identity`` is followed by the block's shared
    ``self.relu``. The BN is then called as ``bn(x, identity)`` at the add's
    place (the identity branch is computed after the BN in the traced order)
    and returns relu(bn(x) + identity) from one fused JIT partition.
Only the call is rewritten, never a shared ReLU module; a BN module called
more than once is left alone, since its fuse flag would apply to every call.
"""
import operator
import warnings

import torch as _torch
import torch.nn as _nn
import torch.nn.functional as _F


def _is_relu(node, modules):
    if node.op == "call_module":
        m = modules.get(node.target)
        return type(m) is _nn.ReLU
    if node.op == "call_function":
        return node.target in (_torch.relu, _F.relu, _torch.relu_)
    if node.op == "call_method":
        return node.target in ("relu", "relu_")
    return False


def _is_add(node):
    if node.op == "call_function" and node.target in (operator.add, operator.iadd, _torch.add):
        return len(node.args) == 2 and not node.kwargs
    if node.op == "call_method" and node.target in ("add", "add_"):
        return len(node.args) == 2 and not node.kwargs
    return False


def trace(model, bn_types):
    """`model` traced by torch.fx into a GraphModule, with `bn_types` as leaves
    (raises what fx raises when it cannot trace)."""
    import torch.fx as fx

    class Tracer(fx.Tracer):
        # normgrad's batch norms are leaves, like torch.nn's own modules.
        def is_leaf_module(self, m, qualname):
            return isinstance(m, bn_types) or super().is_leaf_module(m, qualname)

    return fx.GraphModule(model, Tracer().trace(model), type(model).__name__)


def module_calls(gm):
    """How many times the traced graph calls each submodule, by target."""
    calls = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    return calls


def fuse(model, bn_types):
    """The traced, fused GraphModule, or None when torch.fx cannot trace `model`
    (the caller then swaps modules only, and says so)."""
    import torch.fx as fx

    try:
        gm = trace(model, bn_types)
    except Exception as e:  # fx raises many kinds (TraceError, TypeError, ...)
        warnings.warn("normgrad.torch.convert(fuse=True): torch.fx cannot trace %s (%s: %s); "
                      "batch norms are swapped without BN->ReLU / BN->Add->ReLU fusion"
                      % (type(model).__name__, type(e).__name__, e), stacklevel=3)
        return None
    modules = dict(gm.named_modules())
    calls = module_calls(gm)
    fused = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(modules.get(node.target), bn_types):
            continue
        bn = modules[node.target]
        if calls[node.target] != 1 or bn.fuse_relu or len(node.args) != 1 or node.kwargs:
            continue
        users = list(node.users)
        if len(users) != 1:
            continue
        user = users[0]
        if _is_relu(user, modules) and user.args[0] is node and len(user.args) == 1:
            bn.fuse_relu = True
            user.replace_all_uses_with(node)
            gm.graph.erase_node(user)
            fused += 1
            continue
        if not _is_add(user):
            continue
        other = user.args[1] if user.args[0] is node else user.args[0]
        if other is node or not isinstance(other, fx.Node) or len(user.users) != 1:
            continue
        relu = next(iter(user.users))
        if not (_is_relu(relu, modules) and relu.args[0] is user and len(relu.args) == 1):
            continue
        bn.fuse_relu = True
        with gm.graph.inserting_before(user):
            fused_node = gm.graph.call_module(node.target, (node.args[0], other))
        relu.replace_all_uses_with(fused_node)
        gm.graph.erase_node(relu)
        gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        fused += 1
    gm.graph.lint()
    gm.recompile()
    gm.normgrad_fused = fused
    return gm
