"""An epoch's order as a value: the sweeps the out-of-core engine runs, in order, each with the
step variant every partition runs in it, the tables it reads and writes, and the tables made
before it and freed after it.

`epoch_schedule` is the one place that derives this order. The engine
(`jgrind.engine.OutOfCore`) executes the schedule, and the cost model (`jgrind.plan.cost`)
prices the same sweeps and counts stored bytes from the same makes and frees. It is plain data:
no JAX, no arrays, so a test can build one for a small case and compare it with one written out
by hand.

An epoch runs the forward sweeps 0 .. L-2 (sweep l computes ``H_{l+1}`` from ``H_l``; the top
layer's forward is fused with its backward), then the backward sweeps L-1 .. 0 (sweep l reads
``H_l`` and ``G_{l+1}`` and writes ``G_l``). Two choices of the plan change that order:

- A recomputed layer ``H_j`` (RECOMPUTE fate) is not stored by its forward sweep beyond its
  next use: it is made (``make H_j``) by the sweep that computes it and freed after the sweep
  that reads it last. Before a backward sweep whose input was freed, recompute sweeps
  (forward sweeps that keep no aggregation) rebuild it from the nearest stored layer below.
- A layer whose aggregation ``Z_l`` is kept writes it in its forward sweep and reads it,
  instead of ``H_l``, in its backward sweep: nothing is recomputed for that layer.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Iterable, Optional

FORWARD, RECOMPUTE, BACKWARD = "forward", "recompute", "backward"

# table names in reads, writes, makes and frees
ACTIVATIONS, GRADIENTS, AGGREGATIONS, LABELS, SNAPSHOTS = "H", "G", "Z", "labels", "snapshot"


class Variant(enum.Enum):
    """Which of a layer's jitted steps (`jgrind.engine.steps.LayerSteps`) a sweep runs, one
    name per step function. Masked variants take the output mask the layer above made in its
    own backward sweep (a ReLU's derivative from its output) instead of recomputing the
    output; ``_PARAMS`` variants are the bottom layer's, with no input gradient to store;
    ``SAVED`` variants read the kept aggregation instead of regathering the input."""

    FORWARD = "forward"
    FORWARD_SAVING = "forward_saving"
    TOP = "top"
    BACKWARD = "backward"
    MASKED_BACKWARD = "masked_backward"
    BACKWARD_PARAMS = "backward_params"
    MASKED_BACKWARD_PARAMS = "masked_backward_params"
    SAVED_BACKWARD = "saved_backward"
    SAVED_BACKWARD_PARAMS = "saved_backward_params"


@dataclasses.dataclass(frozen=True)
class Table:
    """A stored tensor of one layer: ``H`` activations (a layer's input), ``G`` their
    gradients, ``Z`` a kept aggregation, ``snapshot`` the naive scheme's saved step inputs,
    ``labels`` the targets and loss weights."""

    name: str
    layer: int

    def __str__(self) -> str:
        return self.name if self.name == LABELS else f"{self.name}_{self.layer}"


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One pass over every partition. ``reads`` and ``writes``: the tables each step of the
    sweep reads (an input regathered with halo rows, or a whole block) and writes (a whole
    block, or rows scatter-added into ``G``). ``makes``: tables that come into being before
    the sweep (a gradient table; a recomputed layer's transient); ``frees``: tables released
    after it."""

    kind: str
    layer: int
    variant: Variant
    reads: tuple[Table, ...] = ()
    writes: tuple[Table, ...] = ()
    makes: tuple[Table, ...] = ()
    frees: tuple[Table, ...] = ()


@dataclasses.dataclass(frozen=True)
class Step:
    """One partition's step in a sweep, and the tier (a `jgrind.plan.fates.Fate` value:
    ``"device"``, ``"host"``, ``"ssd"``, ``"recompute"``) of every block it reads or writes:
    for a regathered input, the tiers of the partitions whose rows it gathers."""

    sweep: int
    partition: int
    reads: tuple[tuple[Table, tuple[str, ...]], ...]
    writes: tuple[tuple[Table, tuple[str, ...]], ...]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """An epoch: its sweeps in order. ``prefetch``: each step's reads for the next partition
    run on a loader thread while the step runs; ``write_behind``: its writes run on a writer
    thread (both the engine's ``prefetch`` argument)."""

    num_layers: int
    sweeps: tuple[Sweep, ...]
    prefetch: bool = True
    write_behind: bool = True

    def order(self) -> list[tuple[str, int]]:
        """``(kind, layer)`` of every sweep."""
        return [(s.kind, s.layer) for s in self.sweeps]

    def backward(self, layer: int) -> Sweep:
        return next(s for s in self.sweeps if s.kind == BACKWARD and s.layer == layer)

    def steps(self, partitions: Iterable[int],
              tiers: Optional[dict] = None, halo_sources: Optional[dict] = None
              ) -> list[Step]:
        """Every partition's step in every sweep, in the order they run (``partitions``: the
        engine's order). ``tiers``: ``{(table name, layer): [tier per partition]}``, as
        fate values; ``halo_sources``: ``{partition: partitions it gathers halo rows
        from}``. Without them every tier is ``"?"``."""
        partitions = list(partitions)
        tiers = tiers or {}
        halo_sources = halo_sources or {}

        def tier(table: Table, p: int) -> str:
            per_part = tiers.get((table.name, table.layer))
            return "?" if per_part is None else str(per_part[p])

        def where(table: Table, p: int, gathered: bool) -> tuple[str, ...]:
            sources = [p, *halo_sources.get(p, ())] if gathered else [p]
            return tuple(sorted({tier(table, q) for q in sources}))

        out = []
        for i, s in enumerate(self.sweeps):
            for p in partitions:
                # a regathered input and a scatter-added gradient touch the halo's owners
                out.append(Step(i, p, tuple((t, where(t, p, t.name == ACTIVATIONS))
                                            for t in s.reads),
                                tuple((t, where(t, p, t.name == GRADIENTS)) for t in s.writes)))
        return out


def epoch_schedule(num_layers: int, *, recomputed: Iterable[int] = (),
                   kept: Iterable[int] = (), masked: Iterable[int] = (),
                   snapshots: bool = False, prefetch: bool = True) -> Schedule:
    """The training epoch of an ``num_layers``-layer model (layers as executed: a narrowing
    GCN layer split in two counts as two).

    ``recomputed``: layers whose activations are recomputed (never 0, the features);
    ``kept``: layers whose aggregation is kept; ``masked``: layers ``l`` whose output mask
    layer ``l + 1``'s backward steps make (`jgrind.plan.cost.Workload.masked`), used by layer
    ``l``'s backward unless layer ``l + 1`` reads a kept aggregation (which does not see its
    input); ``snapshots``: the naive scheme's step inputs, saved by the forward sweeps and read
    back by the backward ones."""
    L = num_layers
    recomputed, kept, masked = frozenset(recomputed), frozenset(kept), frozenset(masked)
    if 0 in recomputed:
        raise ValueError("layer 0's activations are the features: they cannot be recomputed")
    H = lambda l: Table(ACTIVATIONS, l)  # noqa: E731
    G = lambda l: Table(GRADIENTS, l)  # noqa: E731
    Z = lambda l: Table(AGGREGATIONS, l)  # noqa: E731
    snap = lambda l: Table(SNAPSHOTS, l)  # noqa: E731
    sweeps: list[Sweep] = []
    live: set[int] = set()  # recomputed layers whose transient exists now

    def forward(kind: str, l: int, last_use: bool) -> Sweep:
        """Forward sweep l (``kind``: a first computation or a recomputation): makes a
        recomputed ``H_{l+1}``, frees a recomputed ``H_l`` read for the last time."""
        saving = kind == FORWARD and l in kept
        makes = (H(l + 1),) if l + 1 in recomputed else ()
        if kind == FORWARD and snapshots:
            makes = (snap(l),) + makes
        live.update(t.layer for t in makes if t.name == ACTIVATIONS)
        frees = (H(l),) if last_use and l in live else ()
        live.difference_update(t.layer for t in frees)
        reads = (H(l),)
        writes = (H(l + 1),) + ((Z(l),) if saving else ()) + \
            ((snap(l),) if kind == FORWARD and snapshots else ())
        return Sweep(kind, l, Variant.FORWARD_SAVING if saving else Variant.FORWARD, reads,
                     writes, makes, frees)

    for l in range(L - 1):
        sweeps.append(forward(FORWARD, l, last_use=l >= 1))
    for l in reversed(range(L)):
        if l not in kept:  # rebuild a freed recomputed input from the nearest stored layer
            need = []
            j = l
            while j >= 1 and j in recomputed and j not in live:
                need.append(j)
                j -= 1
            for j in reversed(need):  # recompute sweep j-1 makes H_j; a recomputed H_{j-1}
                # stays until its own backward sweep, which then needs no recompute
                sweeps.append(forward(RECOMPUTE, j - 1, last_use=False))
        top, bottom = l == L - 1, l == 0
        masks = l in masked and not top and (l + 1) not in kept
        if l in kept:
            variant = Variant.SAVED_BACKWARD_PARAMS if bottom else Variant.SAVED_BACKWARD
            reads = (Z(l), G(l + 1))
        else:
            variant = Variant.TOP if top else {
                (False, False): Variant.BACKWARD, (True, False): Variant.MASKED_BACKWARD,
                (False, True): Variant.BACKWARD_PARAMS,
                (True, True): Variant.MASKED_BACKWARD_PARAMS}[(masks, bottom)]
            source = snap(l) if snapshots and not top else H(l)
            reads = (source, Table(LABELS, 0) if top else G(l + 1))
        frees = ((G(l + 1),) if not top else ()) + \
            ((snap(l),) if snapshots and not top else ())
        if l in live:
            frees += (H(l),)
            live.discard(l)
        sweeps.append(Sweep(BACKWARD, l, variant, reads, () if bottom else (G(l),),
                            () if bottom else (G(l),), frees))
    return Schedule(L, tuple(sweeps), prefetch=prefetch, write_behind=prefetch)
