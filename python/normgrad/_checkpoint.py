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
"""
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
        self.stats = tuple(s.detach().clone() for s in stats)
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
