"""Rewrites of a traced model (torch.fx): BN -> ReLU and BN -> Add -> ReLU
fusion, and the swap of batch norms for InPlaceABN where it is safe.

Both work on a GraphModule whose batch norms are normgrad modules that
belong to it alone (convert makes them, sharing the input model's Parameter
and buffer objects), so setting a module's flag never reaches the model the
caller passed in.

``fuse(gm)`` rewrites two shapes of the graph:
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

``swap_inplace_abn(gm, ...)`` replaces a BN by InPlaceABN only where writing
over the BN's input and keeping only its output are both safe: the input is
a fresh tensor that nothing else reads or keeps for its own backward (a
convolution's, linear layer's or out-of-place add's output, never a model
input), and nothing overwrites the output afterwards.
"""
import operator

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


def trace(model, leaf_types):
    """`model` traced by torch.fx into a GraphModule, with `leaf_types` as leaves
    (raises what fx raises when it cannot trace). The GraphModule holds the
    model's leaf modules themselves; the modules on the path to them are its
    own."""
    import torch.fx as fx

    class Tracer(fx.Tracer):
        # Batch norms are leaves (a torch BatchNorm subclass would be traced into).
        def is_leaf_module(self, m, qualname):
            return isinstance(m, leaf_types) or super().is_leaf_module(m, qualname)

    return fx.GraphModule(model, Tracer().trace(model), type(model).__name__)


def module_calls(gm):
    """How many times the traced graph calls each submodule, by target."""
    calls = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    return calls


def set_module(root, target, module):
    parent, _, name = target.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def fuse(gm, bn_types):
    """Fuses BN -> ReLU and BN -> Add -> ReLU in `gm` (its own BN modules);
    returns how many were fused."""
    import torch.fx as fx

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
    return fused


# --- InPlaceABN ------------------------------------------------------------------

# Producers whose output is a fresh tensor that their backward does not keep.
_FRESH_MODULES = (_nn.Conv1d, _nn.Conv2d, _nn.Conv3d, _nn.ConvTranspose1d, _nn.ConvTranspose2d,
                  _nn.ConvTranspose3d, _nn.Linear)
_FRESH_FUNCTIONS = (operator.add, _torch.add, _F.conv1d, _F.conv2d, _F.conv3d, _F.linear)
# Users that read their first operand through a view of it (an in-place op on
# the view writes over the tensor).
_VIEW_METHODS = ("view", "view_as", "reshape", "flatten", "permute", "transpose", "squeeze",
                 "unsqueeze", "narrow", "expand", "contiguous", "__getitem__", "t")
_VIEW_FUNCTIONS = (_torch.flatten, _torch.reshape, _torch.permute, _torch.transpose,
                   _torch.squeeze, _torch.unsqueeze, operator.getitem)


def _leaky_slope(node, modules, bn_node):
    """leaky_relu's slope when `node` is a LeakyReLU applied to bn_node alone, else None."""
    if node.op == "call_module" and type(modules.get(node.target)) is _nn.LeakyReLU:
        return modules[node.target].negative_slope if node.args == (bn_node,) else None
    if node.op == "call_function" and node.target in (_F.leaky_relu, _F.leaky_relu_):
        if not node.args or node.args[0] is not bn_node:
            return None
        slope = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
        return slope if isinstance(slope, float) else None
    return None


def _modifies_input(node, modules):
    """Whether `node` may write over its first argument (in-place ops)."""
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.startswith("__")
    if node.op == "call_function":
        return node.target is operator.iadd or getattr(node.target, "__name__", "").endswith("_")
    if node.op == "call_module":
        return bool(getattr(modules.get(node.target), "inplace", False))
    return False


def _is_view(node):
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    return node.op == "call_function" and node.target in _VIEW_FUNCTIONS


def _overwritten_later(node, modules, allow_iadd):
    """Whether some op writes over `node`'s output, directly or through a view
    (an `out += other` on it counts only when not allow_iadd)."""
    for u in node.users:
        if u.args and u.args[0] is node and _modifies_input(u, modules):
            if not (allow_iadd and u.op == "call_function" and u.target is operator.iadd):
                return True
        if _is_view(u) and _overwritten_later(u, modules, False):
            return True
    return False


def _fresh_unkept(src, modules):
    """Why `src` (a BN's input) must not be overwritten, or None when it may."""
    if src.op == "placeholder":
        return "its input is the model's input, which the caller owns"
    if src.op == "get_attr":
        return "its input is a parameter or buffer of the model"
    if len(src.users) != 1:
        return "its input is read by other ops too"
    if src.op == "call_module" and isinstance(modules.get(src.target), _FRESH_MODULES):
        return None
    if src.op == "call_function" and src.target in _FRESH_FUNCTIONS:
        return None
    what = src.target if src.op != "call_module" else type(modules.get(src.target)).__name__
    return ("its input comes from %s, which may keep it for its own backward or share its "
            "memory (only a convolution's, linear layer's or out-of-place add's output is "
            "overwritten)" % getattr(what, "__name__", what))


def swap_inplace_abn(gm, is_bn, make_abn):
    """Swaps BN -> LeakyReLU for InPlaceABN(leaky_relu), BN -> Add -> LeakyReLU for
    one InPlaceABN with the residual, and other batch norms for
    InPlaceABN(identity), where safe, for each module `is_bn` accepts.
    `make_abn(bn, activation, slope)` builds
    the InPlaceABN (sharing bn's tensors). Returns (swapped, {target: why
    left})."""
    import torch.fx as fx

    modules = dict(gm.named_modules())
    calls = module_calls(gm)
    swapped, left = 0, {}
    for node in list(gm.graph.nodes):
        bn = modules.get(node.target) if node.op == "call_module" else None
        if bn is None or not is_bn(bn):
            continue
        users = list(node.users)
        src = node.args[0] if len(node.args) == 1 and not node.kwargs else None
        if calls[node.target] != 1:
            left[node.target] = "the module is called more than once"
            continue
        if bn.running_mean is None:
            left[node.target] = "it keeps no running statistics (InPlaceABN does)"
            continue
        if not isinstance(src, fx.Node):
            left[node.target] = "it is called with other arguments than one tensor"
            continue
        why = _fresh_unkept(src, modules)
        if why is not None:
            left[node.target] = why
            continue
        slope = _leaky_slope(users[0], modules, node) if len(users) == 1 else None
        if slope is not None and slope <= 0:
            slope = None
        # BN -> Add -> LeakyReLU (torchvision's Bottleneck): one InPlaceABN with the
        # residual, so neither the BN's output nor the sum is kept for the backward.
        add = users[0] if len(users) == 1 and _is_add(users[0]) else None
        if add is not None and len(add.users) == 1:
            other = add.args[1] if add.args[0] is node else add.args[0]
            act = next(iter(add.users))
            res_slope = _leaky_slope(act, modules, add)
            if (isinstance(other, fx.Node) and other is not node and res_slope
                    and res_slope > 0 and not _overwritten_later(act, modules, False)):
                set_module(gm, node.target, make_abn(bn, "leaky_relu", res_slope))
                with gm.graph.inserting_before(add):
                    fused = gm.graph.call_module(node.target, (src, other))
                act.replace_all_uses_with(fused)
                for n in (act, add, node):
                    gm.graph.erase_node(n)
                swapped += 1
                continue
        if slope is None and any(_is_relu(u, modules) for u in users):
            left[node.target] = "ReLU has no inverse, so the backward cannot start from its output"
            continue
        if _overwritten_later(users[0] if slope is not None else node, modules, True):
            left[node.target] = "an in-place op overwrites its output, which InPlaceABN keeps"
            continue
        set_module(gm, node.target,
                   make_abn(bn, "leaky_relu" if slope is not None else "identity", slope))
        if slope is not None:
            users[0].replace_all_uses_with(node)
            gm.graph.erase_node(users[0])
        for u in list(node.users):  # `out += identity` on the kept output: out of place
            if u.op == "call_function" and u.target is operator.iadd and u.args[0] is node:
                u.target = operator.add
        swapped += 1
    gm.graph.lint()
    gm.recompile()
    return swapped, left
