"""Batch norm under activation checkpointing: the recomputed forward is
recognised, so running statistics are updated once per step and a
synchronized layer does not synchronize again.

torch.utils.checkpoint (and checkpoint_sequential) runs a region's forward
twice. Reentrant (the default in torch 1.13): first under no_grad, then
again with gradients inside the backward. Non-reentrant: first with
gradients, its saved tensors dropped, then again during the backward to
refill them. Either way torch's own BatchNorm counts the batch twice and
moves its running statistics twice (pytorch#96136).

normgrad's statistics are deterministic, so the recomputed forward computes
the same ones, bit for bit. Each module remembers its last training
forward (the input's shape, dtype and layout, and the batch statistics)
until that forward's backward runs. A training forward with gradients
enabled whose statistics match that remembered one bit for bit, while its
backward has not run yet, is the recompute: it neither counts the batch
nor moves the running statistics, and a synchronized layer reuses the
group's statistics instead of synchronizing. Outputs and gradients are the
same bits as without checkpointing.

What this cannot tell apart: one module applied twice to the very same
batch with gradients before a backward (the second call then does not move
the running statistics, where torch's would).

``convert(model, checkpoint="blocks")`` uses it: every block of the model's
stages runs under torch.utils.checkpoint (checkpoint_blocks).
"""
import functools as _functools
import types as _types

import torch as _torch


class StepState:
    """A module's last training forward, until its backward runs."""

    __slots__ = ("key", "stats", "extra", "pending")

    def __init__(self):
        self.key, self.stats, self.extra, self.pending = None, None, None, False

    def is_recompute(self, key, stats, grad_enabled):
        """Whether a training forward of input `key` with statistics `stats`
        (tensors), called with gradients enabled or not (the caller's mode:
        inside an autograd.Function's forward they are always off), is the
        recompute of the remembered one."""
        if not (self.pending and grad_enabled and key == self.key):
            return False
        return len(stats) == len(self.stats) and all(
            a.shape == b.shape and _torch.equal(a, b) for a, b in zip(stats, self.stats))

    def remember(self, key, stats, extra=None):
        """A training forward ran (its backward is pending); `extra` is what a
        recompute reuses (a synchronized layer's group statistics)."""
        self.key = key
        # The statistics are fresh tensors nothing writes to afterwards: kept, not copied.
        self.stats = tuple(s.detach() if s.requires_grad else s for s in stats)
        self.extra, self.pending = extra, True

    def done(self):
        """The remembered forward's backward ran. Call it after reading
        ctx.saved_tensors: under non-reentrant checkpointing that read is what
        runs the recompute, which must still find the forward pending."""
        self.pending = False


def state_of(m):
    """Module m's StepState (made on first use)."""
    s = m.__dict__.get("_ng_step")
    if s is None:
        s = m.__dict__["_ng_step"] = StepState()
    return s


def input_key(x):
    return (tuple(x.shape), x.dtype, tuple(x.stride()))


# --- convert(model, checkpoint="blocks") ----------------------------------------


def _checkpointed_forward(self, *args, **kwargs):
    """A block's own forward, run under torch.utils.checkpoint (non-reentrant:
    it needs no input that requires grad) when training with gradients; as
    it is otherwise (eval, no_grad)."""
    inner = type(self).forward
    if self.training and _torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint
        return checkpoint(_functools.partial(inner, self), *args, use_reentrant=False, **kwargs)
    return inner(self, *args, **kwargs)


def blocks_of(model):
    """The blocks checkpoint="blocks" checkpoints: the children of every
    nn.Sequential that is a direct child of `model` (torchvision's ResNet
    layer1..layer4, MobileNet's and EfficientNet's `features`), as
    (stage, name, block)."""
    out = []
    for stage in model.children():
        if isinstance(stage, _torch.nn.Sequential):
            out += [(stage, name, block) for name, block in stage.named_children()]
    return out


def checkpoint_blocks(model, convert_block=None):
    """Makes every block of `model` (blocks_of) run under checkpointing, in
    place: each block's forward is wrapped on the instance, so the module
    tree, its Parameters, buffers and state_dict keys stay as they were.
    `convert_block(block)`, when given, returns the module that takes the
    block's place first (a traced, fused copy sharing its tensors)."""
    blocks = blocks_of(model)
    if not blocks:
        raise ValueError("normgrad.torch.convert(checkpoint='blocks'): %s has no nn.Sequential "
                         "stage among its children, so no blocks to checkpoint (torchvision's "
                         "ResNet, MobileNet, EfficientNet, RegNet and VGG have them)"
                         % type(model).__name__)
    for stage, name, block in blocks:
        if convert_block is not None:
            block = convert_block(block)
            setattr(stage, name, block)
        block.forward = _types.MethodType(_checkpointed_forward, block)
    return model
