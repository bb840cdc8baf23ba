"""The collectives of normgrad's synchronized batch norms (SyncBatchNorm and
InPlaceABNSync): agreement before data, bounded waits, and one error on
every rank.

The rule is the graph's AllReduce under MPI (backends/mpi/mpi_communicator.cpp):
before a layer's data moves, its processes agree in one small MAX
all_reduce. Each process sends (failed, v, -v), where v holds what must
match across the group (the phase, the layer, num_features, the input's
dtype, eps, momentum, training mode, affine, the activation) and `failed`
is its rank + 1 when its own input checks failed. One collective then tells
every process whether all agree (max(v) == -max(-v)) and whether any failed.
A process whose input fails its checks still takes part, so no peer waits on
it; when anything is off, every process gathers the others' messages (only
on that path) and raises: the failing process its own error, the others a
``SyncError`` naming the layer, the failing rank and its rule.

The agreement has the same size in the forward and the backward of every
layer, so a process that skipped a backward, or runs another layer, meets its
peers at an agreement and is told so, instead of feeding a data collective
of another size (which gloo answers by aborting the process).

Between the agreement and the data collectives a process can still fail
(its kernel); the data collective then carries a failed flag in one more
element, and every process raises after it.

Waits are bounded by the process group's timeout (torch's default is 30
minutes; ``init_process_group(timeout=...)`` sets it), or, when
``NORMGRAD_COLLECTIVE_TIMEOUT`` (seconds, as for the MPI backend) or
``set_collective_timeout`` gives a shorter one, by that: a collective that
does not complete raises a ``SyncError`` naming the layer and the
collective. The group is unusable after that (its pending operation cannot
be cancelled, and the process's exit waits for the group's own timeout).
"""
import datetime
import os
import time
import zlib

import torch as _torch
import torch.distributed as _dist

import normgrad as _ng


class SyncError(_ng.Error):
    """A synchronized layer failed on another rank of its group, its ranks
    disagree, or a collective did not complete: raised on every live rank."""


_timeout = None  # seconds, set_collective_timeout; None: NORMGRAD_COLLECTIVE_TIMEOUT or the group's
_stats = {"collectives": 0, "bytes": 0, "agreement_s": 0.0, "data_s": 0.0}

_FORWARD, _BACKWARD = 1.0, 2.0
_DTYPE_CODES = {_torch.float32: 1.0, _torch.bfloat16: 2.0, _torch.float16: 3.0}
# What every process of a group must run a layer with, in agreement order.
_FIELDS = ("phase", "layer", "num_features", "dtype", "eps", "momentum", "training", "affine",
           "activation")


def set_collective_timeout(seconds):
    """Bounds every collective of normgrad's synchronized layers to `seconds`
    (None: ``NORMGRAD_COLLECTIVE_TIMEOUT`` if set, else the process group's
    own timeout)."""
    global _timeout
    if seconds is not None and not (isinstance(seconds, (int, float)) and seconds > 0):
        raise ValueError("normgrad.torch.set_collective_timeout: expected seconds > 0 or None, "
                         "got %r" % (seconds,))
    _timeout = None if seconds is None else float(seconds)


def collective_timeout():
    """The bound in seconds normgrad puts on its collectives, or None when only
    the process group's timeout applies."""
    if _timeout is not None:
        return _timeout
    v = os.environ.get("NORMGRAD_COLLECTIVE_TIMEOUT")
    try:
        s = float(v) if v else 0.0
    except ValueError:
        s = 0.0
    return s if s > 0 else None


def sync_stats(reset=False):
    """What this process's synchronized layers did since the last reset:
    "collectives" and "bytes" sent (agreements included), and the seconds
    spent in the agreements ("agreement_s") and in the data collectives
    ("data_s"), waiting for the peers included."""
    out = dict(_stats)
    if reset:
        _stats.update(collectives=0, bytes=0, agreement_s=0.0, data_s=0.0)
    return out


def layer_name(m):
    """The name a synchronized layer goes by in errors: the qualified name the
    converters (or ``name_layers``) gave it, else its class and width."""
    return getattr(m, "layer_name", None) or "%s(%d)" % (type(m).__name__, m.num_features)


def name_layers(model):
    """Gives every synchronized layer in `model` its qualified module name
    (what errors and the agreement call it); returns `model`."""
    from ._batch_norm import SyncBatchNorm
    from ._inplace_abn import InPlaceABNSync
    for name, m in model.named_modules():
        if isinstance(m, (SyncBatchNorm, InPlaceABNSync)):
            m.layer_name = name or type(m).__name__
    return model


def _describe(field, value):
    if field == "phase":
        return {_FORWARD: "forward", _BACKWARD: "backward"}.get(value, str(value))
    if field == "dtype":
        return {v: str(k) for k, v in _DTYPE_CODES.items()}.get(value, "not a supported dtype")
    if field == "momentum" and value < 0:
        return "None (cumulative average)"
    if field in ("training", "affine"):
        return str(bool(value))
    if field == "activation":
        return "none" if value < 0 else "leaky_relu(%g)" % value
    return "%g" % value


class Layer:
    """One synchronized layer's call over its group: `kind` names the module
    class, `config` its values for the agreement (see _FIELDS)."""

    def __init__(self, m, kind, group, x, eps, momentum, affine, activation=None):
        self.kind, self.name, self.group = kind, layer_name(m), group
        self.rank, self.size = _dist.get_rank(group), _dist.get_world_size(group)
        self.channels = m.num_features
        dtype = getattr(x, "dtype", None)
        self.config = {
            "layer": float(zlib.crc32(self.name.encode()) & 0xFFFFFF),
            "num_features": float(m.num_features),
            "dtype": _DTYPE_CODES.get(dtype, -1.0),
            "eps": float(eps),
            "momentum": -1.0 if momentum is None else float(momentum),
            "training": 1.0 if m.training else 0.0,
            "affine": 1.0 if affine else 0.0,
            "activation": -1.0 if activation is None else float(activation),
        }

    def _where(self, phase):
        return "normgrad.torch.%s '%s' (%s, rank %d of %d)" % (
            self.kind, self.name, phase, self.rank, self.size)

    def _all_reduce(self, t, op, phase, what):
        _stats["collectives"] += 1
        _stats["bytes"] += t.numel() * t.element_size()
        limit = collective_timeout()
        t0 = time.perf_counter()
        try:
            work = _dist.all_reduce(t, op=op, group=self.group, async_op=True)
            if limit is None:
                work.wait()
            else:
                work.wait(timeout=datetime.timedelta(seconds=limit))
            _stats["agreement_s" if op == _dist.ReduceOp.MAX else "data_s"] += \
                time.perf_counter() - t0
        except RuntimeError as e:
            bound = ("NORMGRAD_COLLECTIVE_TIMEOUT=%gs" % limit if limit is not None
                     else "the process group's timeout")
            raise SyncError(
                "%s: the all_reduce of %s did not complete: %s. A peer exited, failed outside "
                "this layer, or never reached it (bounded by %s); this process group cannot be "
                "used again" % (self._where(phase), what, str(e).strip(), bound)) from None

    def _gather(self, mine, phase):
        out = [None] * self.size
        limit = collective_timeout()
        try:
            _dist.all_gather_object(out, mine, group=self.group)
        except RuntimeError as e:
            raise SyncError("%s: gathering the ranks' errors failed: %s (bounded by %s)"
                            % (self._where(phase), str(e).strip(),
                               "%gs" % limit if limit else "the group's timeout")) from None
        return out

    def agree(self, phase_name, error):
        """The agreement before this layer's first collective in `phase_name`
        ("forward" or "backward"); `error` is this process's own failed check
        (an exception) or None. Raises on every rank unless all is well."""
        phase = _FORWARD if phase_name == "forward" else _BACKWARD
        values = [phase] + [self.config[f] for f in _FIELDS[1:]]
        if phase == _BACKWARD:  # only the layer and phase matter in the backward
            values = values[:2] + [0.0] * (len(values) - 2)
        v = _torch.tensor(values, dtype=_torch.float64)
        failed = float(self.rank + 1) if error is not None else 0.0
        packed = _torch.cat([_torch.tensor([failed], dtype=_torch.float64), v, -v])
        self._all_reduce(packed, _dist.ReduceOp.MAX, phase_name,
                         "the agreement (%d doubles, before the data)" % packed.numel())
        k = len(values)
        agreed = bool((packed[1:1 + k] == -packed[1 + k:]).all())
        if error is None and packed[0] == 0 and agreed:
            return
        self._fail(phase_name, error, values)

    def _fail(self, phase_name, error, values):
        mine = (None if error is None else "%s: %s" % (type(error).__name__, error), values,
                self.name)
        everyone = self._gather(mine, phase_name)
        failed = [(r, msg) for r, (msg, _, _) in enumerate(everyone) if msg is not None]
        where = self._where(phase_name)
        if failed:
            ranks = ", ".join(str(r) for r, _ in failed)
            what = "rank %s failed its checks, so no rank of the group ran the layer: %s" % (
                ranks, "; ".join("rank %d: %s" % rm for rm in failed))
        else:
            what = self._disagreement([vals for _, vals, _ in everyone],
                                      [name for _, _, name in everyone])
        if error is not None:
            msg = "%s [%s; every rank of the group raised]" % (error, where)
            try:
                new = type(error)(msg)
            except Exception:
                new = SyncError(msg)
            raise new from None
        raise SyncError("%s: %s" % (where, what))

    def _disagreement(self, all_values, names):
        for i, field in enumerate(_FIELDS):
            seen = [vals[i] for vals in all_values]
            if len(set(seen)) == 1:
                continue
            per_rank = ", ".join("rank %d: %s" % (r, _describe(field, s)) for r, s in
                                 enumerate(seen))
            if field in ("phase", "layer"):
                where = ", ".join("rank %d: the %s of '%s'" % (r, _describe("phase", vals[0]), n)
                                  for r, (vals, n) in enumerate(zip(all_values, names)))
                return ("the ranks are at different layers or phases (%s) (rule: every rank "
                        "runs the same synchronized layers in the same order, forward and "
                        "backward; a rank skipped a backward or a layer)" % where)
            return "the ranks disagree on %s (%s) (rule: every rank runs the layer with the " \
                   "same %s)" % (field, per_rank, field)
        return "the agreement failed without a difference (a collective returned wrong data)"

    def checked_sum(self, t, error, phase_name, what):
        """all_reduce SUM of the f64 tensor `t` (in place) with this process's
        failed flag in one more element (`error`: an exception or None, from
        what ran since the agreement). Returns the summed `t`; raises on every
        rank when any failed."""
        packed = _torch.cat([t, _torch.tensor([1.0 if error is not None else 0.0],
                                              dtype=_torch.float64)])
        self._all_reduce(packed, _dist.ReduceOp.SUM, phase_name, what)
        if packed[-1] != 0:
            self._fail(phase_name, error, [0.0] * len(_FIELDS))
        t.copy_(packed[:-1])
        return t
