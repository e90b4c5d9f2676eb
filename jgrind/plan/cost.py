"""The cost model: predicted epoch time and memory per tier of a fate assignment.

It prices the epoch `jgrind.engine.OutOfCore` runs, the assignment's
`jgrind.plan.schedule.Schedule`, sweep by sweep, and every data movement and kernel with the
rates of a measured `jgrind.plan.profile.Profile`. Each price is worked out per partition
(`step_parts`, `gather_parts`, ...); a sweep's figure is their sum, and the prediction keeps
the parts, in the schedule's order, for the plan's chart:

* **compute** of a partition step: sparse products (``nnz * width`` at the profile's rate for
  an input of that size, `spmm_rate_at`), dense
  transforms (``2 m k n / matmul_flops``) and the sweep's fixed cost per step (the profile's
  ``sweep_step``: the pipeline's hand-offs, puts, dispatch and waits); a backward step reruns
  the forward inside ``jax.vjp`` and adds the transposed products (3x the forward, 2x for the
  first layer, which needs no input gradient);
* **I/O** of a sweep: the gathers of ``H_l`` (own rows and halo rows, from the tier of each
  row's owner block), the writes of ``H_{l+1}``, the reads of ``G_{l+1}`` and the scatter-adds
  into ``G_l``, each at the bandwidth of the tiers involved (device <-> host, host copies and
  gathers, SSD reads and writes plus a latency per read call);
* **overlap**: the engine gathers the next partition and writes the last one on background
  threads, so a sweep takes ``c + io - overlap * min(c, io)``: ``max(c, io)`` with perfect
  hiding (overlap = 1), ``c + io`` with none (overlap = 0). The overlap factor is measured.
  The two threads also run beside each other: ``io = r + w - parallel * min(r, w)`` for the
  sweep's reads ``r`` and writes ``w`` (the profile's `io_parallel`, measured too), and no
  longer than the host's cores need for them. Where the steps run on the host's cores too
  (the CPU backend), the kernels take every core while they run, and the rest (the engine's
  own work for the steps ``e``, the reads and the writes) shares the cores around them:
  ``c + max(e, r, w, (e + r + w) / cores)`` (`HostCores`). The reader's and the writer's
  threads also spend their own seconds per step in the store's calls, besides their bytes
  (the profile's ``machinery_loader`` and ``machinery_writer``): their threads' terms are
  ``r + r_own`` and ``w + w_own`` (`Sweep.reader_own`).

Every I/O term is linear in the tier indicators of the blocks (except the all-on-device fast
paths, which the planner handles with one binary per tensor), which is what lets the planner
solve for fates exactly (`jgrind.plan.planner`).

Memory follows the store's accounts: activation tables live the whole epoch, gradient tables
two at a time (``G_{l+1}`` is read while ``G_l`` is accumulated), recomputed layers in a host
transient, and the host cache holds SSD blocks within what is left of the host budget.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
from typing import Optional, Sequence

import jax
import numpy as np

from jgrind.models.conv import derivative_from_output
from jgrind.models.gat import GATConv
from jgrind.models.model import gcn
from jgrind.executed.moved_dropout import drops_input, unwrap
from jgrind.executed.split import as_executed
from jgrind.hostio import codecs
from jgrind.partition import shape_groups
from jgrind.plan.fates import (ACTIVATION, AGGREGATION, CODES, EXACT, FATES, GRADIENT, D, Fate,
                               H, R, S, Storage)
from jgrind.plan.inventory import aggregation_widths, forward_work, layer_widths
from jgrind.plan.schedule import ACTIVATIONS, GRADIENTS, Schedule, epoch_schedule

ITEMSIZE = 4                      # float32 activations and gradients

# Elementwise and input-row traffic of a backward step, in multiples of its forward's (its
# products are counted one by one, see `Products`). Fitted to serial profiles of four planner
# configurations (`tools/profile_ops.py --config C --policy host`, no-ssd, wide, device-tight,
# host-tight; CPU-2, 2026-11-22 night): the measured step less its priced products came to
# 1.2-1.9x the forward's traffic for a regathering backward step, 0.75-1.2x without the input
# gradient (layer 0), and 2.8-3.9x for the top step (forward, loss and backward over its
# input rows, whose halo makes them many).
BACKWARD_PASSES = 1.5
PARAMS_ONLY_PASSES = 1.0          # layer 0: no input gradient
TOP_PASSES = 3.0
ELEMENTWISE_PASSES = 6.0          # bias, activation, dropout, residual, norm: bytes touched
# Passes over the *input* rows (halo included) per forward step: dropout or norm reads and writes
# them, and the consumer reads them again (in backward: the input gradient is written, masked
# and zero-padded the same way). With many small partitions the halo is several times the owned
# rows, and this term dominates narrow layers (`tools/profile_ops.py` shows it: a 256 -> 8 top
# step over 128 small partitions takes several times what its products alone cost).
INPUT_PASSES = 2.0
# The same for a layer whose dropout runs in the layer below (`jgrind.executed.moved_dropout`):
# nothing drops or masks its input rows; the products read them (priced on their own) and the
# backward writes and zero-pads their gradient.
UNDROPPED_INPUT_PASSES = 1.0


# Device bytes of a partition step beyond its arguments and results: XLA's temporaries
# (`jax.jit(step).lower(...).compile().memory_analysis().temp_size_in_bytes`), bounded by
# `Workload.step_temp_bytes` in multiples of row bytes. On the CPU backend, over every step
# variant of GCN, SAGE (kept aggregations too), GCN with LayerNorm and residual, and GAT on
# R-MAT graphs: a copy of the input rows where the layer drops them itself, or where its
# backward transposes a kept aggregation into them (`INPUT_TEMP_COPIES`; four with LayerNorm
# or a residual: the
# normalised rows and their statistics, forward and backward), plus the output rows at the
# input, aggregation and output widths (the aggregation, the pre-activation and their
# cotangents); for GAT also `EDGE_TEMP_PASSES` over the per-edge features and attention
# (gathered rows, weights and their cotangents: 4.3x at most, measured).
INPUT_TEMP_COPIES = 1
NORMED_INPUT_TEMP_COPIES = 4
EDGE_TEMP_PASSES = 5.0
# Device copies of the parameters during an epoch: the parameters, the summed gradient, two
# optimizer moments (Adam), and one for the update.
PARAMETER_COPIES = 5
# Bytes per output row of the top step's class ids (int32) and loss weights (float32)
LABEL_ROW_BYTES = 8


def input_passes(layer) -> float:
    """`INPUT_PASSES` for a layer that drops its own input rows, else `UNDROPPED_INPUT_PASSES`."""
    return INPUT_PASSES if drops_input(layer) else UNDROPPED_INPUT_PASSES

# SSD row reads and scatter-adds merge rows less than this many bytes apart into one read call
# (`jgrind.engine.ssd`): reading a gap shorter than this costs less than a second call. The
# span loops run natively (`jgrind/_kernels/spans.cc`), where a call from the page cache costs
# its system call, ~1-4 us here. `python tools/bench_span_gap.py` on the 1M-node R-MAT graph's
# halos (8 partitions, 2026-11-23, docs/results-history.md, section 4): a sweep of 256-wide halo
# reads took 0.69 s at a 128 KiB gap, 0.41 s at 16 KiB, 0.39 s at 8 KiB and 0.52 s at 4 KiB;
# read-add-writes 1.02-1.18 s from 128 to 16 KiB and slower below (a page-cache write call
# costs more).
# The Python loops this replaced cost ~10 us a call, which had made 128 KiB the best gap.
# From a cold disk (`--cold`: every partition's reads miss the page cache, as when the store's
# files outgrow the RAM left for it) no gap between 16 and 128 KiB won everywhere on CPU-2's
# virtual disk (~50 us a 4 KiB read, 0.3-2 GB/s): with 8 partitions 16 KiB was the slowest
# (6.9 s a 256-wide sweep against 4.0-5.1 s), with 32 the fastest (19.2 s against 23-25 s),
# because fewer but denser halos make calls the cost and many sparse ones make bytes the cost.
# So the gap stays tuned for the page cache (docs/results-history.md, section 4).
COALESCE_BYTES = 16 << 10
# The SSD tier moves row spans through one per-thread scratch buffer in pieces of at most this
# (`jgrind.engine.ssd`), and `jgrind profile` times the page cache in pieces of this size, so
# the rates the model charges are the ones the engine gets. Larger pieces fall out of the CPU
# caches between the read and the take or add: on CPU-2, page-cache reads ran at 20.9 GB/s in
# 1 MiB pieces and 8.3 GB/s in 4 MiB ones, read-add-writes at 9.1 and 5.1 GB/s
# (`tools/bench_page_cache.py`, docs/results-history.md, section 7).
SPAN_PIECE_BYTES = 1 << 20


def format_bytes(n: float) -> str:
    """Bytes in the largest unit that keeps three significant digits readable."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} bytes"


def format_minimum(n: int) -> str:
    """A minimum budget as `format_bytes` writes it, rounded up: the figure as written, read
    back (`jgrind.config.parse_bytes`, which truncates to whole bytes), is at least ``n``."""
    n = int(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            hundredths = -(-n * 100 // size)
            while int(hundredths / 100 * size) < n:  # float rounding on the way back
                hundredths += 1
            return f"{hundredths / 100:.2f} {unit}"
    return f"{n} bytes"


# -- the workload: shapes of every partition, nothing allocated -----------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """Per-partition sizes of a partitioned graph and the model's layer widths.

    Attributes:
      widths: ``w_0 .. w_L``: the width of ``H_l`` (the input of layer l) and of the output.
      layers: the model's layers (their kind decides the kernels a step runs).
      owned, inputs, edges: ``[P]`` rows owned, rows gathered (owned + halo), in-edges.
      pad_out, pad_in, pad_edges: ``[P]`` the padded shapes the jitted steps run on.
      halo: ``[P, P]`` halo rows of partition p owned by partition q.
      ssd_calls, ssd_rows: ``{words: [P, P]}`` read calls and rows read (gaps included) when
        partition p's halo rows in q's block come from SSD in rows of ``words`` 4-byte words
        (see `COALESCE_BYTES`): a float32 row's words are its width, a stored row's its
        codec's `words` (the SSD tier coalesces at the stored width). Every layer's width in
        every storage dtype of `jgrind.hostio.codecs.NAMES` has its tables, each worked out
        the first time it is read (`SpanTables`).
      needs_edges, needs_adjacency: which block pieces the layers read.
      masks: backward steps of ReLU layers read a bit mask of their output instead of
        recomputing it (`jgrind.engine.steps`); the masks count towards the working set.
      aggregated: ``{l: width}`` of the aggregation ``Z_l`` a layer can keep
        (`jgrind.plan.inventory.aggregation_widths`).
      loss_row_bytes: device bytes per output row of the top step beyond its output, for
        multi-label targets: the row's T targets and the loss's two per-target tensors (the
        loss and its cotangent).
      num_params: the model's parameter count (`PARAMETER_COPIES` of them stay on the device).
      storage: the storage dtype of each kind of tensor in the host and SSD tiers
        (`jgrind.plan.fates.Storage`): their blocks are priced at its bytes
        (`stored_bytes`), device blocks and recomputed transients at float32's.
      relations: R of a graph whose edges carry relations (the normalised graph's edge
        types), 0 without: a block's adjacency then has a row per output and relation, and
        its edge lists a relation per edge (`jgrind.models.block`).
      label_row_bytes: bytes per padded output row of the top step's labels and loss
        weights, sent to the device with its input (`jgrind.engine.steps.PaddedPartition`).
      device_of: ``[P]`` the device (an index) of every partition when the run places them on
        several devices (`jgrind.plan.placement`): the device tier is then held per device,
        each device's own partitions' device blocks and its own working set
        (`device_working_sets`, `memory`); None: one device holds them all.
      spans: the `HaloSpans` behind ``ssd_calls`` and ``ssd_rows``, whose spans over a file of
        every block scale them (`ssd_spans_in`); None (a workload made by hand): the tables
        as they are.
    """

    widths: tuple
    layers: tuple
    owned: np.ndarray
    inputs: np.ndarray
    edges: np.ndarray
    pad_out: np.ndarray
    pad_in: np.ndarray
    pad_edges: np.ndarray
    halo: np.ndarray
    ssd_calls: dict
    ssd_rows: dict
    needs_edges: bool
    needs_adjacency: bool
    num_nodes: int
    num_edges: int
    masks: bool = True
    aggregated: dict = dataclasses.field(default_factory=dict)
    loss_row_bytes: int = 0
    num_params: int = 0
    storage: Storage = EXACT
    relations: int = 0
    label_row_bytes: int = LABEL_ROW_BYTES
    device_of: Optional[np.ndarray] = None
    spans: Optional["HaloSpans"] = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def num_parts(self) -> int:
        return int(self.owned.size)

    @property
    def num_devices(self) -> int:
        """The devices the partitions are placed on (1 without `device_of`)."""
        if self.device_of is None:
            return 1
        return int(np.max(self.device_of, initial=0)) + 1

    def on_devices(self, device_of: Optional[np.ndarray]) -> "Workload":
        """This workload with its partitions placed on devices (``device_of``, ``[P]``);
        None: on one device."""
        if device_of is not None:
            device_of = np.asarray(device_of, np.int64)
            if device_of.shape != self.owned.shape:
                raise ValueError(f"device_of names {device_of.size} partitions; the workload "
                                 f"has {self.num_parts}")
        return dataclasses.replace(self, device_of=device_of)

    def device_working_sets(self) -> np.ndarray:
        """``[K]`` the `working_set` of every device: the largest step of its partitions,
        the output masks and node-wise blocks of its partitions, and its copies of the
        parameters. One device: ``[working_set()]``."""
        return self._device_working_sets

    @functools.cached_property
    def _device_working_sets(self) -> np.ndarray:
        if self.device_of is None:
            return np.array([self.working_set()], np.int64)
        return np.array([dataclasses.replace(
            self, owned=np.where(self.device_of == d, self.owned, 0), device_of=None
        ).working_set() for d in range(self.num_devices)], np.int64)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @classmethod
    def whole(cls, model, num_features: int, num_nodes: int, num_edges: int) -> "Workload":
        """``num_nodes`` rows with ``num_edges`` in-edges as one partition with no halo: the
        fast path's shapes (a whole graph, or one device's rows and halo slots)."""
        one = lambda v: np.array([v], np.int64)  # noqa: E731
        n, e = int(num_nodes), int(num_edges)
        return cls(widths=tuple(layer_widths(model, num_features)), layers=tuple(model.layers),
                   owned=one(n), inputs=one(n), edges=one(e), pad_out=one(n), pad_in=one(n),
                   pad_edges=one(e), halo=np.zeros((1, 1), np.int64), ssd_calls={},
                   ssd_rows={}, needs_edges=model.needs_edges,
                   needs_adjacency=model.needs_adjacency, num_nodes=n, num_edges=e)

    @classmethod
    def build(cls, pg, model, max_shapes: int = 3) -> "Workload":
        """From a `PartitionedGraph` (of the normalised graph) and a `GNN`, whose layers are
        taken as the engine runs them (`jgrind.executed.split.as_executed`)."""
        model = as_executed(model)[0]
        parts = pg.partitions
        P = len(parts)
        shapes = shape_groups(parts, max_shapes)
        widths = layer_widths(model, pg.graph.num_features)
        # rows of every width in every storage dtype, in 4-byte words (float32's: the width)
        row_words = sorted({make().words(w) for w in widths[:-1] for make in
                            codecs.NAMES.values()})
        spans = HaloSpans(parts, P)
        shape = lambda p, i: shapes.get(p.index, (0, 0, 0))[i]  # noqa: E731
        return cls(
            widths=tuple(widths),
            layers=tuple(model.layers),
            owned=np.array([p.num_owned for p in parts], np.int64),
            inputs=np.array([p.num_inputs for p in parts], np.int64),
            edges=np.array([p.num_edges for p in parts], np.int64),
            pad_out=np.array([shape(p, 0) for p in parts], np.int64),
            pad_in=np.array([shape(p, 1) for p in parts], np.int64),
            pad_edges=np.array([shape(p, 2) for p in parts], np.int64),
            halo=spans.halo, ssd_calls=SpanTables(spans, row_words, 0),
            ssd_rows=SpanTables(spans, row_words, 1), spans=spans,
            needs_edges=model.needs_edges,
            needs_adjacency=model.needs_adjacency, num_nodes=pg.graph.num_nodes,
            num_edges=pg.graph.num_edges, aggregated=aggregation_widths(model),
            loss_row_bytes=loss_row_bytes(pg.graph.labels), num_params=parameter_count(model),
            relations=pg.graph.num_relations if pg.graph.edge_type is not None else 0,
            label_row_bytes=label_row_bytes(pg.graph.labels))

    # -- sizes ------------------------------------------------------------------------------
    def block_bytes(self, layer: int) -> np.ndarray:
        """``[P]`` bytes of every partition's block of ``H_layer`` / ``G_layer`` (read-only:
        made once per workload, the planner asks for them millions of times)."""
        return self._block_bytes[layer]

    @functools.cached_property
    def _block_bytes(self) -> tuple:
        out = tuple(self.owned * width * ITEMSIZE for width in self.widths)
        for array in out:
            array.setflags(write=False)
        return out

    def stored_bytes(self, name: str, layer: int) -> np.ndarray:
        """``[P]`` bytes of every partition's block of tensor ``name`` (ACTIVATION, GRADIENT,
        AGGREGATION) at ``layer`` in the host or SSD tier: in its storage dtype
        (`jgrind.hostio.codecs`), float32's `block_bytes` by default."""
        width = self.aggregated.get(layer, 0) if name == AGGREGATION else self.widths[layer]
        codec = self.storage.codec(name)
        if not codec.lossy:
            return self.aggregation_bytes(layer) if name == AGGREGATION \
                else self.block_bytes(layer)
        return self.owned * (4 * codec.words(width))

    def tier_bytes(self, layer: int, codes: np.ndarray, name: str = ACTIVATION) -> list[int]:
        """Bytes of layer ``layer``'s blocks of ``name`` in each tier, indexed by tier code
        (D, H, S, R), for the blocks' codes ``codes``: host and SSD blocks in their storage
        dtype (`stored_bytes`), the others float32."""
        full = self.aggregation_bytes(layer) if name == AGGREGATION else self.block_bytes(layer)
        weights = np.where((codes == H) | (codes == S), self.stored_bytes(name, layer), full)
        return [int(b) for b in np.bincount(codes, weights=weights, minlength=4)]

    def halo_rows_in(self, members: np.ndarray) -> np.ndarray:
        """``[P]`` int64: the halo rows of every partition owned by blocks ``members`` (``[P]``
        bool), ``halo @ members``. With no member or every block a member, the planner's
        uniform tiers, it is zero or the halo's row sums, with no product."""
        return _summed(self._halo_floats, members, self._halo_totals)

    def owners_outside(self, members: np.ndarray) -> np.ndarray:
        """``[P]`` int64: how many of every partition's halo owners are not ``members``."""
        return _summed(self._has_halo, ~members, self._owner_counts)

    def ssd_spans_in(self, words: int, members: np.ndarray, with_own: bool = False) -> tuple:
        """``([P] read calls, [P] rows read)`` of `ssd_calls` and `ssd_rows` summed over the
        owner blocks ``members``, as `halo_rows_in`; ``with_own``: a scatter-add's, whose own
        rows in a member block are moved with its halo rows.

        The tables count each owner block's spans apart; a file of several blocks runs spans
        on across their boundaries and cuts long ones into pieces (`HaloSpans.file_spans`).
        So the halo's counts are scaled by what the file of every block makes against what
        the owners' tables sum to, over all partitions: a gather sweep's totals are then exact
        with every block on SSD (the planner's uniform tiers), and stay linear in the blocks'
        tiers and alike for alike blocks, as the planner's program needs them; a scatter-add's
        too, but where pieces cut a span that its own block joins."""
        members = np.asarray(members, bool)
        calls, rows = self._pair_spans_in(words, members)
        if with_own:
            calls = calls + members
            rows = rows + np.where(self.owned > 0, self.owned * members, 0)
        if self.spans is None or not members.any():
            return calls, rows
        call_scale, row_scale = self._file_scales(words, with_own)
        return calls * call_scale, rows * row_scale

    def _file_scales(self, words: int, with_own: bool) -> tuple:
        """``(calls, rows)``: the file's over the owner tables' sums, over every partition
        with every block a member (1 where the tables count none)."""
        key = (words, with_own)
        if key not in self._scales:
            every = np.ones(self.num_parts, bool)
            calls, rows = self._pair_spans_in(words, every)
            row = words * ITEMSIZE
            file_calls, file_rows, own_calls, own_rows = self.spans.file_totals(
                max(1, COALESCE_BYTES // row), max(1, SPAN_PIECE_BYTES // row))
            if with_own:
                calls, rows = calls + every, rows + self.owned
                file_calls, file_rows = file_calls + own_calls, file_rows + own_rows
            self._scales[key] = tuple(f / float(t.sum()) if t.sum() else 1.0
                                      for f, t in ((file_calls, calls), (file_rows, rows)))
        return self._scales[key]

    @functools.cached_property
    def _scales(self) -> dict:
        return {}

    def _pair_spans_in(self, words: int, members: np.ndarray) -> tuple:
        if words not in self._ssd_totals:
            tables = (self.ssd_calls[words], self.ssd_rows[words])
            self._ssd_totals[words] = [(t.astype(np.float64), _frozen(t.sum(1, dtype=np.int64)))
                                       for t in tables]
        (calls, calls_total), (rows, rows_total) = self._ssd_totals[words]
        return _summed(calls, members, calls_total), _summed(rows, members, rows_total)

    @functools.cached_property
    def _halo_totals(self) -> np.ndarray:
        return _frozen(self.halo.sum(1, dtype=np.int64))

    @functools.cached_property
    def _halo_floats(self) -> np.ndarray:
        return self.halo.astype(np.float64)

    @functools.cached_property
    def _has_halo(self) -> np.ndarray:
        return (self.halo > 0).astype(np.float64)

    @functools.cached_property
    def _owner_counts(self) -> np.ndarray:
        return _frozen((self.halo > 0).sum(1, dtype=np.int64))

    @functools.cached_property
    def _ssd_totals(self) -> dict:
        return {}

    def ssd_owner_lists(self, in_ssd: np.ndarray) -> tuple:
        """``(indptr [P + 1], owners)``: the halo owners of every partition among blocks
        ``in_ssd`` (``[P]`` bool), in index order, partition p's at
        ``owners[indptr[p]:indptr[p + 1]]`` (a CSR of ``halo > 0``, masked)."""
        ptr, owners = self._halo_owners
        keep = in_ssd[owners]
        return np.concatenate(([0], np.cumsum(keep)))[ptr], owners[keep]

    @functools.cached_property
    def _halo_owners(self) -> tuple:
        """``(indptr, owners)`` of `ssd_owner_lists` over every block."""
        p, q = np.nonzero(self.halo > 0)  # row by row, owners ascending
        other = p != q  # (no partition is its own halo's owner; the simulation skips it)
        p, q = p[other], q[other]
        counts = np.bincount(p, minlength=self.num_parts)
        return np.concatenate(([0], np.cumsum(counts))), q

    def aggregation_bytes(self, layer: int) -> np.ndarray:
        """``[P]`` bytes of every partition's block of ``Z_layer`` (0 without one)."""
        return self.owned * self.aggregated.get(layer, 0) * ITEMSIZE

    def structure_bytes(self) -> np.ndarray:
        """``[P]`` device bytes of every padded block structure, as `jgrind.models.block`
        makes it: the input ids; the CSR (a row pointer per output row, or per output row and
        relation for a graph with relations) and its transpose (a row pointer per input row),
        each with a column and a weight per edge; the edge lists attention reads (source and
        target, and the relation with relations). All 4-byte entries."""
        nbytes = ITEMSIZE * self.pad_in
        if self.needs_adjacency:
            rows = self.pad_out * max(self.relations, 1)
            nbytes = nbytes + ITEMSIZE * (rows + 1 + self.pad_in + 1 + 4 * self.pad_edges)
        if self.needs_edges:
            nbytes = nbytes + ITEMSIZE * (3 if self.relations else 2) * self.pad_edges
        return nbytes

    def local(self, layer: int) -> bool:
        """Whether ``layer`` is node-wise (reads no neighbours): the engine then reads each
        partition's own block of its input instead of gathering a halo, and writes its input
        gradient as a block instead of scatter-adding it."""
        return not getattr(self.layers[layer], "aggregates", True)

    def step_inputs(self, layer: int) -> np.ndarray:
        """``[P]`` padded input rows of ``layer``'s steps: the padded outputs for a node-wise
        layer, else owned plus halo."""
        return self.pad_out if self.local(layer) else self.pad_in

    def masked(self, layer: int) -> bool:
        """Whether layer ``layer``'s backward steps run from its output mask (no recompute of
        the output): masks on, a ReLU-like layer without residual, and not the top layer."""
        return (self.masks and layer < self.num_layers - 1
                and derivative_from_output(self.layers[layer]) is not None)

    def mask_bytes(self) -> int:
        """Peak bytes of output masks held at once: during layer l's backward sweep the masks
        of ``H_{l+1}`` (read) and of ``H_l`` (made for the sweep below), one bit per value of
        every padded output row."""
        rows = int(np.sum(np.where(self.owned > 0, self.pad_out, 0)))
        per = [rows * ((self.widths[l] + 7) // 8) if l >= 1 and self.masked(l - 1) else 0
               for l in range(self.num_layers + 1)]
        return max(per[l + 1] + per[l] for l in range(self.num_layers))

    def without_masks(self) -> "Workload":
        return dataclasses.replace(self, masks=False)

    def working_set(self) -> int:
        """Device bytes the engine holds beside its stored blocks, at the peak of any step
        (`_step_bytes`), plus the output masks (`mask_bytes`), the node-wise layers' blocks
        (`local_structure_bytes`) and the parameters (`PARAMETER_COPIES`)."""
        return self._working_set

    @functools.cached_property
    def _working_set(self) -> int:
        return (self._step_bytes() + self.mask_bytes() + self.local_structure_bytes()
                + PARAMETER_COPIES * ITEMSIZE * self.num_params)

    def local_structure_bytes(self) -> int:
        """Device bytes of the blocks node-wise layers run on (their padded output rows' ids),
        which the engine keeps on the device for every partition."""
        if not any(self.local(l) for l in range(self.num_layers)):
            return 0
        return int(ITEMSIZE * np.sum(np.where(self.owned > 0, self.pad_out, 0)))

    def step_temp_bytes(self, layer: int) -> np.ndarray:
        """``[P]`` bound on XLA's temporaries in a step of ``layer`` (see
        `INPUT_TEMP_COPIES`)."""
        f_in, f_out = self.widths[layer], self.widths[layer + 1]
        inner = unwrap(self.layers[layer])
        options = getattr(inner, "options", None)
        if options is not None and (options.layer_norm or options.residual):
            copies = NORMED_INPUT_TEMP_COPIES
        elif drops_input(self.layers[layer]):
            copies = INPUT_TEMP_COPIES
        else:
            copies = 0
        aggregation = self.aggregated.get(layer, f_in)
        temp = ITEMSIZE * (copies * self.step_inputs(layer) * f_in
                           + self.pad_out * (f_in + aggregation + f_out))
        if isinstance(inner, GATConv):
            per_edge = inner.heads * inner.out_channels + inner.heads
            temp = temp + EDGE_TEMP_PASSES * ITEMSIZE * self.pad_edges * per_edge
        relations = getattr(inner, "num_relations", 0)
        heads = getattr(inner, "heads", 0)
        if relations and not heads:  # R-GCN: every output row's aggregate per relation,
            # [out, R, in], and its cotangent in the backward step
            temp = temp + 2 * ITEMSIZE * relations * self.pad_out * f_in
        elif relations:  # RGAT: every relation's x W_r on every input row, and its
            # cotangent in the backward step
            temp = temp + 2 * ITEMSIZE * relations * self.step_inputs(layer) * f_out
            if heads:  # RGAT's attention scores per edge, as GAT's
                temp = temp + EDGE_TEMP_PASSES * ITEMSIZE * self.pad_edges * (f_out + heads)
        return temp.astype(np.int64)

    def _step_bytes(self) -> int:
        """The most device bytes a partition step of any layer holds at once (the arrays the
        engine has alive while it runs, `jgrind.engine.pipeline`):

        * its inputs and the next partition's, loaded while it runs: the gathered rows; in
          backward also the output gradient (or the kept aggregation instead of the rows); the
          top step's labels and loss weights;
        * its outputs, and the previous partition's, which the writer thread is still
          storing: the output rows (and the kept aggregation) in forward, the input gradient,
          shaped like the gathered rows, in backward;
        * XLA's temporaries (`step_temp_bytes`), and the block structure of the step and of
          the step before it (sent to the device when each is dispatched, freed when the step
          ends).

        Each term is its largest over the partitions: the partitions of a sweep alternate
        between padded shapes."""
        def most(nbytes) -> int:
            return int(np.max(np.where(self.owned > 0, nbytes, 0), initial=0))

        worst, top = 0, self.num_layers - 1
        structure = most(self.structure_bytes())
        for l in range(self.num_layers):
            f_in, f_out = self.widths[l], self.widths[l + 1]
            rows = ITEMSIZE * self.step_inputs(l) * f_in
            out_rows = ITEMSIZE * self.pad_out * f_out
            kept = ITEMSIZE * self.pad_out * self.aggregated.get(l, 0)
            temp = most(self.step_temp_bytes(l))
            if l < top:
                forward = 2 * most(rows) + 2 * most(out_rows + kept)
                gradient = 2 * most(rows) if l >= 1 else 0
                regather = 2 * most(rows + out_rows) + gradient + temp
                # from a kept aggregation: it replaces the rows as input, and the transpose
                # of the aggregation writes into a copy of them
                from_kept = 2 * most(kept + out_rows) + gradient + temp \
                    + INPUT_TEMP_COPIES * most(rows) if l in self.aggregated else 0
                worst = max(worst, forward + temp, regather, from_kept)
            else:  # forward, the loss and backward in one step
                labels = 2 * most(self.pad_out * LABEL_ROW_BYTES) \
                    + most(self.pad_out * self.loss_row_bytes)
                worst = max(worst, 4 * most(rows) + labels + temp)
        return worst + 2 * structure


def _frozen(array: np.ndarray) -> np.ndarray:
    """``array``, made read-only: it is memoised and handed out to every caller."""
    array.setflags(write=False)
    return array


class HaloSpans:
    """Every partition's halo rows by owner block, sorted, ready to be cut into the spans
    `jgrind.engine.ssd` reads them in, gaps of up to ``gap`` rows merged (`tables`). All
    partitions' rows at once. ``halo``: ``[P, P]`` halo rows of partition p owned by q."""

    def __init__(self, parts, P: int):
        # for `file_spans`, which reads the halos again when asked, and the rows of every
        # block by partition index (the file's layout); no other partition data
        self._halos = [(p.index, p.halo_owner, p.halo_row) for p in parts]
        self._owned = np.zeros(P, np.int64)
        self._owned[[p.index for p in parts]] = [p.num_owned for p in parts]
        self._rows: dict = {}     # with_own -> `_file_rows`
        self._spans: dict = {}    # (gap, piece, with_own) -> `file_spans`
        self._totals: dict = {}   # (gap, piece) -> `file_totals`
        sizes = [int(np.size(part.halo_owner)) for part in parts]
        n = sum(sizes)
        # (partition, owner) pairs as one index into the [P, P] tables
        pair = np.repeat(np.array([part.index for part in parts], np.int64), sizes) * P
        if n:
            pair += np.concatenate([np.asarray(part.halo_owner, np.int64) for part in parts])
            row = np.concatenate([np.asarray(part.halo_row, np.int64) for part in parts])
        else:
            row = np.zeros(0, np.int64)
        self.P = P
        self.halo = np.bincount(pair, minlength=P * P).astype(np.int64).reshape(P, P)
        same = pair[1:] == pair[:-1]
        if not np.all((pair[1:] > pair[:-1]) | (same & (row[1:] > row[:-1]))):
            order = np.lexsort((row, pair))  # (partitioning makes halos in this order already)
            pair, row = pair[order], row[order]
            same = pair[1:] == pair[:-1]
        # one span per pair from its first row to its last, broken wherever consecutive rows
        # lie more than ``gap + 1`` apart: a break adds a call and skips the rows between
        firsts = np.flatnonzero(np.concatenate(([True], ~same))[:n])
        lasts = np.append(firsts[1:], n)[:firsts.size] - 1
        self._pairs = (self.halo > 0).reshape(-1).astype(np.int64)
        self._extent = np.bincount(pair[firsts], row[lasts] - row[firsts] + 1,
                                   minlength=P * P).astype(np.int64)
        step = row[1:] - row[:-1]
        inner = np.flatnonzero(same & (step > 1))
        self._breaks, self._apart = pair[inner], step[inner]
        self._tables: dict = {}
        # every (partition, owner) pair's first and last halo row, for `file_totals`
        self._bounds = (pair[firsts], row[firsts], row[lasts])

    def tables(self, gap: int) -> tuple:
        """``(calls [P, P], rows [P, P])``: the read calls and rows read (gaps included) of
        partition p's halo rows in q's block, gaps of up to ``gap`` rows merged."""
        if gap not in self._tables:
            P, cut = self.P, self._apart > gap + 1
            calls = self._pairs + np.bincount(self._breaks[cut], minlength=P * P)
            skipped = np.bincount(self._breaks[cut], self._apart[cut] - 1,
                                  minlength=P * P).astype(np.int64)
            self._tables[gap] = (calls.astype(np.int32).reshape(P, P),
                                 (self._extent - skipped).reshape(P, P))
        return self._tables[gap]

    def file_spans(self, gap: int, piece: int, with_own: bool) -> tuple:
        """``([P] calls, [P] rows)``: the read calls and rows read (gaps included) of every
        partition's halo rows (``with_own``: and its own block's, as a scatter-add moves them)
        when every block is in the layer's SSD file, in block order: rows of adjacent blocks
        less than ``gap + 1`` rows apart run on in one span, and every span is read in pieces
        of at most ``piece`` rows as the native span loops cut them (`_file_spans`). `tables`
        counts each owner block apart, which is exact for a file of one block and counts too
        many calls where blocks are narrower than the gap (the top layer's few classes:
        65,541 priced against 1,309 made, docs/results-history.md, section 7)."""
        key = (gap, piece, with_own)
        if key not in self._spans:
            if with_own not in self._rows:
                self._rows[with_own] = _file_rows(self._halos, self._owned, with_own)
            self._spans[key] = tuple(_frozen(a) for a in _file_spans(
                *self._rows[with_own], self.P, gap, piece))
        return self._spans[key]

    def file_totals(self, gap: int, piece: int) -> tuple:
        """``(calls, rows, own calls, own rows)``: `file_spans` of the halo rows summed over
        the partitions, and what the own blocks add to them in a scatter-add. Worked out from
        the owner pairs' `tables` and their first and last rows (a span runs on from one
        owner's block into the next where the last's last row and the next's first lie
        close), and the halo's row by row (`file_spans`) only where a run of such spans could
        outgrow a piece; an own block's joins to its neighbours are counted as if no piece
        cut them."""
        if (gap, piece) not in self._totals:
            self._totals[gap, piece] = self._pair_totals(gap, piece)
        return self._totals[gap, piece]

    @functools.cached_property
    def _pair_rows(self) -> tuple:
        """``(lo, hi, who, same, apart)`` of every owner pair in file order: its first and
        last row in the file, its partition, whether the next pair is the same partition's,
        and the rows from its last to the next pair's first."""
        ids, first, last = self._bounds
        block_start = np.concatenate(([0], np.cumsum(self._owned)))[ids % self.P]
        lo, hi, who = first + block_start, last + block_start, ids // self.P
        return lo, hi, who, who[1:] == who[:-1], lo[1:] - hi[:-1]

    def _pair_totals(self, gap: int, piece: int) -> tuple:
        P, owned = self.P, self._owned
        offset = np.concatenate(([0], np.cumsum(owned)))
        mine = np.flatnonzero(owned)
        ids = self._bounds[0]
        if not ids.size:
            return 0, 0, int(mine.size), int(owned.sum())
        lo, hi, who, same, apart = self._pair_rows
        joined = same & (apart <= gap + 1)
        runs = np.flatnonzero(np.concatenate(([True], ~joined)))  # owners joined end to end
        run_ends = np.append(runs[1:], ids.size) - 1
        if np.any(hi[run_ends] - lo[runs] + 1 > piece):  # a run that pieces may cut
            calls, rows = (int(t.sum()) for t in self.file_spans(gap, piece, False))
        else:
            calls_of, rows_of = (t.reshape(-1) for t in self.tables(gap))
            calls = int(calls_of[ids].sum()) - int(joined.sum())
            rows = int(rows_of[ids].sum()) + int(np.sum((apart - 1)[joined]))
        # each own block, between its partition's owners below and above it: joined to
        # either where they lie close, and no longer a gap where they were joined across it
        at = np.searchsorted(ids, mine * P + mine)   # the first owner above it, if any
        below, above = np.maximum(at - 1, 0), np.minimum(at, ids.size - 1)
        has_below = (at > 0) & (who[below] == mine)
        has_above = (at < ids.size) & (who[above] == mine)
        start, end = offset[mine], offset[mine] + owned[mine] - 1
        to_below = has_below & (start - hi[below] <= gap + 1)
        to_above = has_above & (lo[above] - end <= gap + 1)
        across = np.zeros(mine.size, bool)  # the two joined across it
        parted = 0
        if apart.size:
            pair = np.minimum(below, apart.size - 1)
            across = has_below & has_above & joined[pair]
            parted = int(np.sum((apart[pair] - 1)[across]))
        own_calls = int(mine.size - to_below.sum() - to_above.sum() + across.sum())
        own_rows = int(owned.sum() + np.sum((start - hi[below] - 1)[to_below])
                       + np.sum((lo[above] - end - 1)[to_above])) - parted
        return calls, rows, own_calls, own_rows


class SpanTables(collections.abc.Mapping):
    """``{words: [P, P]}``: `Workload.ssd_calls` (``which`` 0) or `Workload.ssd_rows` (1) for
    rows of each of ``row_words`` 4-byte words (gaps of `COALESCE_BYTES`), each table worked
    out from ``spans`` (`HaloSpans`) the first time it is asked for: a plan reads the tables
    of its storage dtypes' widths only."""

    def __init__(self, spans: HaloSpans, row_words: Sequence[int], which: int):
        self._spans, self._words, self._which = spans, tuple(row_words), which

    def __getitem__(self, words: int) -> np.ndarray:
        if words not in self._words:
            raise KeyError(words)
        return self._spans.tables(COALESCE_BYTES // (words * ITEMSIZE))[self._which]

    def __iter__(self):
        return iter(self._words)

    def __len__(self) -> int:
        return len(self._words)


def _file_rows(halos: list, owned: np.ndarray, with_own: bool) -> tuple:
    """``(who, start, end)``: every row range a partition wants of a layer's SSD file holding
    every block in block order, sorted by partition and start: a halo row is one row, the own
    block (``with_own``) all of its rows. ``halos``: ``(index, halo_owner, halo_row)`` of every
    partition; ``owned``: ``[P]`` rows of every block."""
    offset = np.concatenate(([0], np.cumsum(owned)))
    sizes = [int(np.size(halo_owner)) for _, halo_owner, _ in halos]
    who = np.repeat(np.array([index for index, _, _ in halos], np.int64), sizes)
    if sum(sizes):
        start = np.concatenate([offset[np.asarray(halo_owner, np.int64)]
                                + np.asarray(halo_row, np.int64)
                                for _, halo_owner, halo_row in halos])
    else:
        start = np.zeros(0, np.int64)
    stride = int(offset[-1]) + 1
    key = who * stride + start
    if key.size and not np.all(key[1:] > key[:-1]):  # (partitioning makes them sorted)
        order = np.argsort(key, kind="stable")
        who, start, key = who[order], start[order], key[order]
    end = start + 1
    if with_own:  # each own block among its partition's halo rows
        mine = np.flatnonzero(owned)
        at = np.searchsorted(key, mine * stride + offset[mine])
        who, start = np.insert(who, at, mine), np.insert(start, at, offset[mine])
        end = np.insert(end, at, offset[mine] + owned[mine])
    return who, start, end


def _file_spans(who: np.ndarray, start: np.ndarray, end: np.ndarray, P: int, gap: int,
                piece: int) -> tuple:
    """`HaloSpans.file_spans` of the ranges of `_file_rows`: a span breaks where the next range
    starts more than ``gap`` rows after the last ended. As the native span loops do
    (`jgrind/_kernels/spans.cc`), a span longer than ``piece`` rows is read from its first row
    in pieces of rows less than ``piece`` past the piece's first, the next piece starting at
    the next row wanted."""
    calls, rows = np.zeros(P, np.int64), np.zeros(P, np.int64)
    if not who.size:
        return calls, rows
    new = np.ones(who.size, bool)
    new[1:] = (who[1:] != who[:-1]) | (start[1:] - end[:-1] > gap)
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:], who.size) - 1
    lo, hi, owner = start[firsts], end[lasts], who[firsts]
    short = hi - lo <= piece
    calls += np.bincount(owner[short], minlength=P)
    rows += np.bincount(owner[short], (hi - lo)[short], minlength=P).astype(np.int64)
    # long spans, a piece of each at a time, on keys ordered across partitions
    first, last = firsts[~short], lasts[~short]
    stride = int(end.max()) + piece + 1
    key_start, key_end = who * stride + start, who * stride + end
    at, base = start[first], who[first] * stride
    while first.size:
        stop = at + piece  # rows at or past it start the next piece
        # the span's last range begun before it (a later span of the partition may follow)
        inside = np.minimum(np.searchsorted(key_start, base + stop, side="left") - 1, last)
        calls += np.bincount(who[first], minlength=P)
        rows += np.bincount(who[first], np.minimum(end[inside], stop) - at,
                            minlength=P).astype(np.int64)
        nxt = np.searchsorted(key_end, base + stop, side="right")  # first range ending past
        more = nxt <= last
        first, last, base, stop, nxt = first[more], last[more], base[more], stop[more], nxt[more]
        at = np.maximum(start[nxt], stop)
    return calls, rows


def _halo_spans(parts, P: int, gaps: Sequence[int]) -> tuple:
    """``(halo, {gap: calls}, {gap: rows})`` of `HaloSpans`, every table worked out."""
    spans = HaloSpans(parts, P)
    return (spans.halo, {g: spans.tables(g)[0] for g in gaps},
            {g: spans.tables(g)[1] for g in gaps})


def _summed(table: np.ndarray, members: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """``table @ members`` as int64 (``table``: ``[P, P]`` integer counts held as float64,
    ``members``: ``[P]`` bool): every row's sum over the member columns, where ``totals`` are
    the rows' sums over all columns. The product runs in float64 (BLAS, several times
    NumPy's integer product), exact: its partial sums are integers below 2**53."""
    if not members.any():
        return np.zeros(table.shape[0], np.int64)
    if members.all():
        return totals
    return (table @ members.astype(np.float64)).astype(np.int64)


def parameter_count(model) -> int:
    """The number of parameters of ``model`` (from shapes; nothing is initialised)."""
    shapes = jax.eval_shape(model.init, jax.random.key(0))
    return int(sum(np.prod(leaf.shape, dtype=np.int64) for leaf in jax.tree.leaves(shapes)))


def label_row_bytes(labels: np.ndarray) -> int:
    """Bytes per padded output row of the top step's labels (``[N]`` class ids or ``[N, T]``
    targets, in their own dtype) and its float32 loss weight."""
    return int(labels.dtype.itemsize * np.prod(labels.shape[1:], dtype=np.int64)) + ITEMSIZE


def loss_row_bytes(labels: np.ndarray) -> int:
    """Device bytes per node of the loss beyond the logits: for multi-label targets ``[N, T]``
    the targets and two per-target float tensors (the loss and its cotangent); 0 for class
    ids (they fit in the slack of the output's estimate)."""
    if labels.ndim != 2:
        return 0
    return int(labels.shape[1]) * (labels.itemsize + 2 * ITEMSIZE)


# -- seconds per partition -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Priced:
    """One operation's seconds over a sweep (a step, a gather, a write...), per partition.

    ``terms``: ``[P]`` arrays, indexed by partition, whose sum is each partition's share;
    ``once``: seconds spent once in the sweep (a layer's SSD file read whole into the host
    cache), paid by the first partition in the engine's order among ``needs`` (``[P]``
    bool). ``to_device``, ``to_host``: the bytes it hands to the device and reads back on the
    host over the sweep, as the store counts them (`jgrind.engine.store.Accounts`)."""

    terms: tuple
    once: float = 0.0
    needs: Optional[np.ndarray] = None
    to_device: int = 0
    to_host: int = 0

    def total(self) -> float:
        """The sweep's seconds, summed term by term (the figures the planner compares)."""
        return float(sum(np.sum(t) for t in self.terms)) + self.once

    def parts(self, order: Optional[Sequence[int]] = None) -> np.ndarray:
        """``[P]`` seconds per partition, indexed by partition: they sum to `total` up to
        rounding. ``order``: the partitions in the order they run (default: index order)."""
        out = np.array(functools.reduce(np.add, self.terms), np.float64)
        if self.once:
            order = range(out.size) if order is None else order
            payer = next((p for p in order if self.needs[p]), order[0])
            out[payer] += self.once
        return out


# -- compute ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Products:
    """Seconds of a layer step's sparse and dense products (arrays over partitions), by role.

    * ``forward``: the products of the forward pass;
    * ``masked``: the part of ``forward`` a backward step from the output mask skips (XLA drops
      the products after the last one the weight gradient needs);
    * ``weight_grad``: the transposed products every backward step runs (the weight gradient,
      and the cotangents of intermediates on its way);
    * ``input_grad``: those that only the input gradient needs.

    A backward step that regathers and recomputes runs ``forward - masked`` (when masked)
    ``+ weight_grad (+ input_grad)``; a whole-graph step, whose autodiff keeps the forward's
    intermediates, runs ``forward + weight_grad (+ input_grad)``. Counting them one by one
    matters: for ``(A X) W`` the weight gradient needs no second sparse product (``A^T``
    only serves the input gradient), for ``A (X W)`` it does, so a flat "backward = 3
    forwards" prices a sparse product too many in every backward step of the first."""

    forward: np.ndarray
    masked: np.ndarray
    weight_grad: np.ndarray
    input_grad: np.ndarray


def spmm_rate_at(profile, input_bytes):
    """The sparse product's rate (nonzeros x width per second) on an input of ``input_bytes``
    (an array over partitions, or a number): the profile's cached rate up to the size it was
    measured at, its out-of-cache rate from the larger size on, and between the two
    geometric in the bytes (on CPU-2, measured with tools/probe_spmm.py on square matrices,
    the rate falls from ~6-10 G/s at 5 MB through ~4-5 at 13 MB and ~3-4 at 26 MB to ~2 at
    51 MB, which the geometric mean of the two ends follows within the probe's own spread;
    partition-shaped blocks, whose input rows are read about twice, fall less: ~5 G/s at
    33 MB, where this gives ~2.8). The product reads
    its input's rows in the adjacency's random order: a partition step's rows and halo often
    fit in the caches, a whole graph's do not. A profile without the cached figure (made by
    hand, or a `jgrind.plan.placement.Rates`) prices every size at ``spmm_rate``."""
    slow = profile.spmm_rate
    cached = getattr(profile, "spmm_cached_rate", 0.0)
    small, large = getattr(profile, "spmm_cached_bytes", 0), getattr(profile, "spmm_bytes", 0)
    if not cached or not 0 < small < large:
        return slow + 0.0 * np.asarray(input_bytes, dtype=np.float64)
    # a cached figure below the out-of-cache one is the machine's noise, not its caches
    fast = max(cached, slow)
    share = np.clip((np.log(np.maximum(np.asarray(input_bytes, dtype=np.float64), 1.0))
                     - np.log(small)) / (np.log(large) - np.log(small)), 0.0, 1.0)
    return np.exp((1.0 - share) * np.log(fast) + share * np.log(slow))


def spmm_seconds(nnz, width: int, input_rows, profile):
    """Seconds of ``A @ x`` with ``nnz`` stored entries on an ``input_rows x width`` input."""
    return nnz * float(width) / spmm_rate_at(profile, input_rows * float(width) * ITEMSIZE)


def _matmul(profile):
    """``rows x a @ a x b`` seconds at the profile's matmul rate."""
    return lambda rows, a, b: 2.0 * rows * a * b / profile.matmul_flops


def _weight_grad(profile):
    """Seconds of a weight gradient ``x^T g`` (``x``: rows x a, ``g``: rows x b): the matmul
    rate, or the contraction rate over the rows when that is slower (a narrow output)."""
    mm = _matmul(profile)
    return lambda rows, a, b: np.maximum(mm(rows, a, b),
                                         ITEMSIZE * rows * (a + b) / profile.contraction_bw)


def layer_products(layer, w_in: int, w_out: int, n_out, n_in, nnz, profile) -> Products:
    """The `Products` of one step of ``layer`` on partitions of the given padded shapes."""
    wg = _weight_grad(profile)
    # a product's input: the gathered rows and halo forward, the output rows' cotangent in
    # the transposed product
    sp = lambda width: spmm_seconds(nnz, width, n_in, profile)            # noqa: E731
    sp_t = lambda width: spmm_seconds(nnz, width, n_out, profile)         # noqa: E731
    layer = unwrap(layer)  # a layer running its consumer's dropout: the same products
    kind = type(layer).__name__
    # the forward's sparse width and dense flops, shared with the inventory's recompute price
    sparse_width, dense_flops = forward_work(layer, w_in, w_out, n_out, n_in)
    dense = dense_flops / profile.matmul_flops
    first = w_in <= w_out  # the sparse product runs before the matmul, on the narrower side
    if kind in ("GCNConv", "SAGEConv"):
        # SAGE adds a root transform of the owned rows: one more matmul in every role
        root_grad = wg(n_out, w_in, w_out) if kind == "SAGEConv" else 0.0
        if first:   # act((A X) W [+ X_own R]): dW needs A X, not a second sparse product
            return Products(forward=sp(sparse_width) + dense, masked=dense,
                            weight_grad=wg(n_out, w_in, w_out) + root_grad,
                            input_grad=dense + sp_t(sparse_width))
        # act(A (X W) [+ X_own R]): dW = X^T (A^T g) needs the transposed sparse product
        forward = dense + sp(sparse_width)
        return Products(forward=forward, masked=forward,
                        weight_grad=wg(n_in, w_in, w_out) + root_grad + sp_t(w_out),
                        input_grad=dense)
    if kind == "Propagate":  # the aggregation half of a split GCN layer: A U + b, no weight
        forward = sp(sparse_width)
        return Products(forward=forward, masked=forward, weight_grad=0.0 * forward,
                        input_grad=sp_t(sparse_width))
    if kind == "RGCNConv":
        # one sparse product over the relation rows at the input width gives [out, R, in],
        # then each output row's aggregates times the relation weights, and the
        # self-connection on the owned rows (`jgrind.models.rgcn`): dW needs the aggregates,
        # not a second sparse product
        relations = float(layer.num_relations)
        if layer.num_bases:  # the relations' aggregates combined per basis, then x V_b
            grad = wg(n_out, layer.num_bases * w_in, w_out)
        else:  # block-diagonal weights: 1/K of the dense products
            share = 1.0 / layer.num_blocks if layer.num_blocks else 1.0
            grad = share * wg(n_out, relations * w_in, w_out)
        if layer.self_loop:
            grad = grad + wg(n_out, w_in, w_out)
        return Products(forward=sp(sparse_width) + dense, masked=dense, weight_grad=grad,
                        input_grad=dense + sp_t(sparse_width))
    if kind in ("RGATConv", "GATConv"):
        # x W on every input row (RGAT: every relation's), then per edge: scores, softmax
        # and a weighted gather-sum; the edge work runs as XLA gathers/segment sums, priced
        # as memory traffic. Its backward needs the projected features again (no mask
        # saving) and reruns all of it.
        edge_bytes = nnz * (3.0 * w_out + 8.0 * getattr(layer, "heads", 1)) * ITEMSIZE
        forward = dense + edge_bytes / profile.gather_bw
        return Products(forward=forward, masked=0.0 * forward, weight_grad=forward,
                        input_grad=forward)
    if getattr(layer, "aggregates", True):
        return Products(forward=sp(sparse_width) + dense, masked=dense,
                        weight_grad=wg(n_out, w_in, w_out),
                        input_grad=dense + sp_t(sparse_width))
    return Products(forward=dense, masked=dense, weight_grad=wg(n_out, w_in, w_out),
                    input_grad=dense)


def memory_seconds(w_in: int, w_out: int, n_out, n_in, profile,
                   input_passes: float = INPUT_PASSES) -> np.ndarray:
    """Elementwise traffic of one forward step: on the outputs (bias, activation) and on the
    input rows, halo included (dropout or a norm reads and writes them; in backward the
    input gradient is written, masked and zero-padded the same way). ``input_passes``: 0 for
    the fast path, whose single jitted program fuses them into the products."""
    return (ELEMENTWISE_PASSES * n_out * w_out * ITEMSIZE / profile.copy_bw
            + input_passes * n_in * w_in * ITEMSIZE / profile.copy_bw)


def layer_seconds(layer, w_in: int, w_out: int, n_out, n_in, nnz, profile,
                  input_passes: float = INPUT_PASSES) -> np.ndarray:
    """Forward seconds of one layer step (arrays over partitions), excluding dispatch latency."""
    return (layer_products(layer, w_in, w_out, n_out, n_in, nnz, profile).forward
            + memory_seconds(w_in, w_out, n_out, n_in, profile, input_passes))


def backward_seconds(layer, w_in: int, w_out: int, n_out, n_in, nnz, profile, *,
                     input_grad: bool, masked: bool, recompute: bool = True,
                     memory_passes: Optional[float] = None,
                     input_passes: float = INPUT_PASSES) -> np.ndarray:
    """Seconds of one backward step (arrays over partitions), excluding dispatch latency:
    the forward recomputed inside `jax.vjp` (``recompute``; less what an output mask skips),
    then the transposed products (`Products`), plus ``memory_passes`` times the forward's
    elementwise traffic (default `BACKWARD_PASSES`, or `PARAMS_ONLY_PASSES` without the input
    gradient). Without ``recompute`` (a whole-graph step) no forward products."""
    p = layer_products(layer, w_in, w_out, n_out, n_in, nnz, profile)
    t = p.weight_grad + (p.input_grad if input_grad else 0.0)
    if recompute:
        t = t + p.forward - (p.masked if masked else 0.0)
    if memory_passes is None:
        memory_passes = BACKWARD_PASSES if input_grad else PARAMS_ONLY_PASSES
    return t + memory_passes * memory_seconds(w_in, w_out, n_out, n_in, profile, input_passes)


def kept_seconds(layer, w_in: int, w_out: int, n_out, n_in, nnz, profile, *,
                 input_grad: bool, masked: bool,
                 input_passes: float = INPUT_PASSES) -> np.ndarray:
    """Seconds of a backward step from a kept aggregation (`jgrind.engine.steps`): the update's
    weight gradient (and ``dz``, and the pre-activation again without a mask), then the
    transposed sparse product into the input rows; no regathered input, no forward product."""
    mm = _matmul(profile)(n_out, w_in, w_out)
    wg = _weight_grad(profile)(n_out, w_in, w_out)
    if type(unwrap(layer)).__name__ == "SAGEConv":
        mm, wg = 2 * mm, 2 * wg  # root and neighbour weights
    t = wg + (0.0 if masked else mm) \
        + ELEMENTWISE_PASSES * n_out * w_out * ITEMSIZE / profile.copy_bw
    if input_grad:
        t = t + mm + spmm_seconds(nnz, w_in, n_out, profile) \
            + input_passes * n_in * w_in * ITEMSIZE / profile.copy_bw
    return t


def step_seconds(w: Workload, profile, layer: int, kind: str,
                 masked: Optional[bool] = None) -> float:
    """Compute seconds of one sweep of ``layer`` over every partition: kind is "forward",
    "backward" (with input gradient), "params" (weight gradient only), "top" (the fused
    top layer: forward, loss and backward), or "kept backward" / "kept params" (from a kept
    aggregation). Backward steps from an output mask skip `Products.masked`; ``masked``
    overrides `Workload.masked` (the layer above makes no masks when it keeps its own
    aggregation: it does not regather this layer's output)."""
    return _step(w, profile, layer, kind, masked).total()


def step_parts(w: Workload, profile, layer: int, kind: str,
               masked: Optional[bool] = None) -> np.ndarray:
    """``[P]`` compute seconds of every partition's step in a sweep of ``layer`` (indexed by
    partition; `step_seconds` is their sum)."""
    return _step(w, profile, layer, kind, masked).parts()


def _step(w: Workload, profile, layer: int, kind: str,
          masked: Optional[bool] = None) -> _Priced:
    """`step_seconds`, per partition."""
    shape = (w.widths[layer], w.widths[layer + 1], w.pad_out, w.step_inputs(layer),
             w.pad_edges, profile)
    masked = w.masked(layer) if masked is None else masked and w.masked(layer)
    passes = input_passes(w.layers[layer])
    if kind.startswith("kept"):
        t = kept_seconds(w.layers[layer], *shape, input_grad=kind == "kept backward",
                         masked=masked, input_passes=passes)
    elif kind == "forward":
        t = layer_seconds(w.layers[layer], *shape, input_passes=passes)
    else:  # the top step runs its forward, the loss and its backward: unmasked
        top = kind == "top"
        t = backward_seconds(w.layers[layer], *shape, input_grad=kind != "params",
                             masked=masked and not top,
                             memory_passes=TOP_PASSES if top else None, input_passes=passes)
    active = w.owned > 0
    # the engine's own cost per step: inside the compute as the trivial pipeline's where the
    # engine's was not measured, else the sweep's lower bound (`sweep_machinery`)
    fixed = 0.0 if measured_machinery(profile) else profile.sweep_step
    return _Priced((np.where(active, t + fixed, 0.0),))


def measured_machinery(profile) -> bool:
    """Whether ``profile`` has the engine's own cost per step (`jgrind.engine.machinery`)."""
    return getattr(profile, "machinery_forward", 0.0) > 0.0


def machinery_kind(w: Workload, kind: str, layer: int) -> str:
    """The engine's kind of step of a sweep (``kind``: forward, recompute or backward) of
    ``layer``, as `jgrind.engine.machinery` measures them."""
    if kind != "backward":
        return "forward"
    if layer == w.num_layers - 1:
        return "top"
    return "backward" if layer >= 1 else "params"


def step_machinery(w: Workload, profile, kind: str, layer: int, kept: bool = False) -> float:
    """The profile's seconds per step of a sweep (``kind`` of ``layer``, `machinery_kind`);
    ``kept``: the layer keeps its aggregation (a forward that stores it, a backward that reads
    it; a recomputing forward does neither), priced by the profile's kept-step figure where
    it has one."""
    name = machinery_kind(w, kind, layer)
    if kept and kind != "recompute" and name != "top":
        figure = getattr(profile, f"machinery_kept_{name}", 0.0)
        if figure > 0.0:
            return figure
    return getattr(profile, f"machinery_{name}")


def sweep_machinery(w: Workload, profile, kind: str, layer: int,
                    ssd_calls: np.ndarray, mixed_calls: int = 0,
                    kept: bool = False) -> np.ndarray:
    """``[P]`` the engine's own seconds for every partition's step of a sweep: the profile's
    per step of its kind (`step_machinery`; ``kept``: the layer keeps its aggregation), per
    call on an SSD block (``ssd_calls[p]``: the sweep's tables whose block ``p`` is on SSD),
    and per halo call on a table split between the device and other tiers (``mixed_calls``,
    `mixed_halo_call`); zeros where the profile did not measure them."""
    if not measured_machinery(profile):
        return np.zeros(w.num_parts)
    step = step_machinery(w, profile, kind, layer, kept)
    mixed = getattr(profile, "machinery_device_mix", 0.0) * mixed_calls
    return np.where(w.owned > 0, step + profile.machinery_ssd_call * ssd_calls + mixed, 0.0)


def thread_own(w: Workload, profile, kind: str, layer: int) -> tuple[float, float]:
    """``(reader, writer)``: the loader's and the writer's own seconds for a sweep's steps
    (``kind`` of ``layer``) besides their bytes, the profile's per step (``machinery_loader``,
    ``machinery_writer``) times the steps; the first layer's backward stores nothing. Zeros
    where the profile did not measure them."""
    steps = int(np.count_nonzero(w.owned > 0))
    reader = getattr(profile, "machinery_loader", 0.0) * steps
    writes = kind != "backward" or layer >= 1
    writer = getattr(profile, "machinery_writer", 0.0) * steps if writes else 0.0
    return float(reader), float(writer)


def mixed_halo_call(w: Workload, layer: int, codes: np.ndarray) -> bool:
    """Whether a gather of ``H_layer`` (or a scatter-add into ``G_layer``) reads halo rows from
    a table with some blocks on the device and some off it: the device tier's takes (adds)
    are then read back (sent) beside the host rows, each waiting for the device's queue, in
    every step whose halo touches a device block. Priced per step of the sweep as if every
    halo did (on the graphs the planner is measured on, nearly every partition reads from
    nearly every other), so the planner's program holds it with one binary per table."""
    if w.local(layer):
        return False
    on_device = np.asarray(codes) == D
    return bool(on_device.any() and not on_device.all())


def backward_kind(w: Workload, layer: int, kept: bool) -> str:
    if layer == w.num_layers - 1:
        return "top"
    return ("kept " if kept else "") + ("backward" if layer >= 1 else "params")


def least_device_budget(w: Workload, device_tables: int) -> int:
    """The smallest device budget that holds ``device_tables`` bytes of blocks beside the
    working set the engine runs with at that budget: with output masks when they fit
    (`fit_masks` keeps them whenever the working set with them is within the budget), so a
    budget raised to this figure is not then found short by the masks it lets in."""
    with_masks = dataclasses.replace(w, masks=True)
    need = device_tables + fullest_working_set(with_masks.without_masks())
    if fullest_working_set(with_masks) <= need:
        need = device_tables + fullest_working_set(with_masks)
    return need


def fullest_working_set(w: Workload) -> int:
    """The largest device's working set (`Workload.device_working_sets`; one device: its
    `Workload.working_set`)."""
    if w.device_of is None:
        return w.working_set()
    return int(w.device_working_sets().max(initial=0))


def fit_masks(w: Workload, device_budget: Optional[int]) -> Workload:
    """``w`` without output masks when the working set with them exceeds the device budget:
    the engine then recomputes instead (`jgrind.engine.OutOfCore` decides the same way)."""
    if w.masks and device_budget is not None and fullest_working_set(w) > device_budget:
        return w.without_masks()  # (and if even that does not fit, its minimum is the one to report)
    return w


# -- I/O -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CacheModel:
    """How SSD reads behave: ``capacity`` bytes of host cache in front of the SSD tier.

    The engine caches whole blocks while they fit. When every SSD block read between two writes
    fits, a block costs one SSD read per write and later reads are host copies. When it does
    not, a gather loads its halo owners' whole blocks while they fit beside the blocks it
    holds and reads the other owners' rows as spans (`halo_cache_reads`). With no room for one
    block, rows are read directly. ``hit_rate``: capacity over the SSD bytes the cache would
    need to hold everything (no longer used by the gathers' price).
    """

    capacity: int = 0
    holds_everything: bool = False
    hit_rate: float = 0.0


def _uncached_copy(own, cache: CacheModel, profile):
    """Seconds to copy own blocks of ``own`` bytes read from SSD into the step input: a block
    the cache keeps is read on its own and copied; one it cannot keep is read straight into
    the step input (`jgrind.engine.store.Table._ssd_block`), with no copy."""
    return np.where(own <= cache.capacity, own / profile.copy_bw, 0.0)


def device_call_seconds(profile) -> float:
    """Seconds of one device-tier call beyond its bytes (a block write, a row take, a row add:
    `jgrind.engine.tiers.device`): the profile's `device_call`, or its step latency where
    that was not measured (profiles before version 20, profiles made by hand)."""
    return float(getattr(profile, "device_call", 0.0) or profile.step_latency)


def to_device_seconds(nbytes, profile):
    """Seconds to move buffers of ``nbytes`` each to the device. The profile has the rate at
    two sizes (it depends on size: on the CPU backend a large buffer lands in freshly mapped
    pages); between them the rate is interpolated in log-log, outside them it is held."""
    big, small = profile.to_device_bw, getattr(profile, "to_device_small_bw", None)
    if small is None:
        return nbytes / big
    lo, hi = float(profile.to_device_small_bytes), float(profile.to_device_bytes)
    n = np.maximum(np.asarray(nbytes, np.float64), 1.0)
    share = np.clip((np.log(n) - np.log(lo)) / max(np.log(hi) - np.log(lo), 1e-9), 0.0, 1.0)
    rate = np.exp(np.log(small) + share * (np.log(big) - np.log(small)))
    return nbytes / rate


def _coded(w: Workload, profile, name: str, width: int) -> tuple[int, float, float]:
    """``(stored row bytes, encode, decode)`` of a ``width``-wide row of tensor ``name`` in the
    host and SSD tiers: its storage dtype's bytes (`jgrind.hostio.codecs`), moved in place of
    float32's, and the seconds per float32 byte of converting it on the host (0 for float32,
    moved as it is). The rates are the profile's (`codec_bw`, measured); a profile without
    them prices a conversion as a host copy. The host converts only a scatter-add's rows and
    a gather's coded rows that join rows of another tier (`jgrind.engine.tiers.coded`);
    writes and reads for a step convert on the device (`device_conversion_seconds`)."""
    codec = w.storage.codec(name)
    if not codec.lossy:
        return width * ITEMSIZE, 0.0, 0.0
    encode, decode = (getattr(profile, "codec_bw", None) or {}).get(
        codec.name, (profile.copy_bw, profile.copy_bw))
    return 4 * codec.words(width), 1.0 / encode, 1.0 / decode


def _converted(w: Workload, name: str, codes: np.ndarray) -> np.ndarray:
    """``[P]`` whether each block (tier codes ``codes``) of tensor ``name`` is kept in a lossy
    storage dtype: host and SSD blocks then hold stored words, which the store encodes from
    the step output on the device and sends to a step as they are, to be decoded there
    (`jgrind.engine.tiers.coded`)."""
    lossy = w.storage.codec(name).lossy
    return ((codes == H) | (codes == S)) & lossy


def device_conversion_seconds(rows, row: int, stored_row: int, profile):
    """Seconds of converting ``rows`` rows between float32 (``row`` bytes) and their stored
    form (``stored_row`` bytes) on the device (`jgrind.hostio.device_codecs`): one
    elementwise pass over both, at the rate the model charges the device's elementwise
    passes (`memory_seconds`: the profile's ``copy_bw``). It is charged in the read or
    write that needs it, not in the step's compute: the thread that sends a step input or
    stores an output waits for the conversion before it hands the rows on (on a GPU, a pass
    at the device's memory bandwidth, small beside the link's time for the same rows)."""
    return rows * float(row + stored_row) / profile.copy_bw


def _routes_within(w: Workload, members: np.ndarray) -> np.ndarray:
    """``[P]`` whether every row a partition gathers (its own block's and its halo's) lies in
    blocks ``members`` (``[P]`` bool): the store's route then uses only those tiers."""
    return members & (w.owners_outside(members) == 0)


def ssd_span_reads(w: Workload, words: int, in_ssd: np.ndarray,
                   with_own: bool = False) -> tuple:
    """``([P] read calls, [P] rows read)`` of every partition's halo rows in the SSD blocks
    ``in_ssd`` (``[P]`` bool), read as coalesced spans (`COALESCE_BYTES`) of rows ``words``
    4-byte words wide (the stored width: `Workload.ssd_calls`); ``with_own``: with its own
    rows in an SSD block, as a scatter-add moves them (`Workload.ssd_spans_in`)."""
    return w.ssd_spans_in(words, in_ssd, with_own)


def _ssd_read(nbytes, calls, profile):
    return nbytes / profile.ssd_read_bw + calls * (profile.ssd_latency
                                                   + profile.read_call_overhead)


def gather_seconds(w: Workload, profile, layer: int, codes: np.ndarray,
                   cache: CacheModel = CacheModel(), reread: bool = False,
                   fast: bool = True) -> float:
    """Seconds to gather ``H_layer`` (own + halo rows, padded) for every partition.

    ``codes[p]`` is the tier of block p. ``reread``: the blocks were already read once since
    they were written (a cache that holds everything then serves them from host RAM).
    ``fast=False`` prices device rows as in a mixed layer even when all are on the device.
    A node-wise layer reads only each partition's own block (`Workload.local`).
    """
    return _gather(w, profile, layer, codes, cache, reread, fast).total()


def gather_parts(w: Workload, profile, layer: int, codes: np.ndarray,
                 cache: CacheModel = CacheModel(), reread: bool = False, fast: bool = True,
                 order: Optional[Sequence[int]] = None) -> np.ndarray:
    """``[P]`` seconds of every partition's gather of ``H_layer``, indexed by partition. A
    layer's SSD file read whole into the host cache is charged to the first partition in
    ``order`` (the engine's, default index order) that reads rows from it."""
    return _gather(w, profile, layer, codes, cache, reread, fast).parts(order)


def _gather(w: Workload, profile, layer: int, codes: np.ndarray,
            cache: CacheModel = CacheModel(), reread: bool = False,
            fast: bool = True) -> _Priced:
    """`gather_seconds`, per partition."""
    if w.local(layer):  # recomputed blocks are read as host ones; SSD blocks are checked
        return _read_block(w, profile, layer, codes, cache, verified=True, name=ACTIVATION)
    row = w.widths[layer] * ITEMSIZE
    active = w.owned > 0
    if fast and np.all(codes == D):  # one device-side take per partition
        return _Priced((np.where(active, w.pad_in * row / profile.gather_bw, 0.0),))
    # host and SSD rows are kept in their storage dtype (``srow`` bytes). A partition whose
    # rows all come from such blocks gets their stored words, sent as they are and decoded
    # on the device (`coded_route`); one whose rows also come from the device or a
    # recomputed layer gets float32 rows, its coded rows decoded on the host. A partition
    # whose rows are all on the device takes them there and sends nothing (`to_device`);
    # its seconds are priced as a mixed gather's, so that a float32 layer's price stays
    # linear in its blocks' tiers, as the planner's program needs it
    srow, _, decode = _coded(w, profile, ACTIVATION, w.widths[layer])
    coded_route = active & _routes_within(w, _converted(w, ACTIVATION, codes))
    on_device = active & _routes_within(w, codes == D)
    sent_row = np.where(coded_route, srow, row)
    buffer = np.where(active, w.pad_in * sent_row, 0)
    seconds = np.where(active, to_device_seconds(buffer, profile)  # the buffer
                       + (w.pad_in - w.inputs) * sent_row / profile.copy_bw, 0.0)  # padding
    seconds += np.where(coded_route, device_conversion_seconds(w.pad_in, row, srow, profile),
                        0.0)
    ssd_hits = cache.holds_everything and reread
    ssd_blocks = cache.capacity > 0 and not cache.holds_everything
    in_file = np.where(codes == S, w.owned, 0) * srow  # the layer's SSD file, block by block
    file_bytes = float(in_file.sum())
    whole_file = not ssd_hits and 0 < file_bytes <= cache.capacity
    whole_read = (_ssd_read(file_bytes, int(np.count_nonzero(in_file)), profile)
                  + file_bytes / profile.checksum_bw) if whole_file else 0.0
    for code in (D, H, S, R):
        mine = active & (codes == code)
        halo_rows = w.halo_rows_in(codes == code)                      # [P] rows from tier
        coded = code in (H, S)  # moved as stored words
        own = w.owned * (srow if coded else row)
        halo_bytes = halo_rows * (srow if coded else row)
        if coded and decode:  # decoded on the host into a float32 step input
            seconds += np.where(coded_route, 0.0,
                                (np.where(mine, w.owned, 0) + halo_rows) * row * decode)
        if code == D:  # jitted takes on the device (index lists padded to a power of two,
            # 1.5x on average), copied to the host buffer
            seconds += np.where(mine, own * (1.0 / profile.gather_bw + 1.0 / profile.to_host_bw)
                                + device_call_seconds(profile), 0.0)
            seconds += halo_bytes * (1.5 / profile.gather_bw + 1.0 / profile.to_host_bw) \
                + np.where(halo_rows > 0, device_call_seconds(profile), 0.0)
        elif code in (H, R) or ssd_hits or whole_file:  # from host arrays, cached SSD
            # blocks, or the layer's SSD file read once into the host cache (`whole_read`,
            # `jgrind.engine.store.Table._whole_file`)
            seconds += np.where(mine, own / profile.copy_bw, 0.0)
            seconds += halo_bytes / profile.gather_bw + halo_rows * profile.gather_row_seconds
        else:
            seconds += np.where(mine, _ssd_read(own, 1, profile)
                                + _uncached_copy(own, cache, profile)
                                + own / profile.checksum_bw, 0.0)  # the block's checksum
            in_ssd = codes == S
            if ssd_blocks:  # owners' blocks loaded into the cache while they fit beside
                # the ones the gather holds, the other owners' rows read as spans; every
                # owner is served on its own, from its cached block or looked up in vain
                loads, loaded, calls, span, taken, missed = halo_cache_reads(
                    w, srow // ITEMSIZE, in_ssd, srow, cache.capacity)
                seconds += _ssd_read(loads, loaded, profile) + loads / profile.checksum_bw \
                    + _ssd_read(span, calls, profile) + halo_bytes / profile.gather_bw \
                    + taken * getattr(profile, "cached_take", 0.0) \
                    + missed * getattr(profile, "cache_lookup", 0.0)
            else:
                calls, span_rows = ssd_span_reads(w, srow // ITEMSIZE, in_ssd)
                seconds += _ssd_read(span_rows * srow, calls, profile) \
                    + halo_bytes / profile.gather_bw
    to_device = int(np.sum(np.where(on_device, 0, buffer)))
    if not whole_file:
        return _Priced((seconds,), to_device=to_device)
    # every partition that reads rows of the file could be the one that loads it
    readers = active & ((codes == S) | (w.halo_rows_in(codes == S) > 0))
    return _Priced((seconds,), whole_read, readers, to_device=to_device)


def halo_cache_reads(w: Workload, words: int, in_ssd: np.ndarray, row_bytes: int,
                     capacity: int) -> tuple:
    """``[P]`` arrays ``(loaded bytes, blocks loaded, span calls, span bytes, owners taken
    from the cache, owners read as spans)`` of the halo rows a gather sweep reads from SSD
    (blocks ``in_ssd``, rows of ``words`` 4-byte words: ``row_bytes`` stored bytes) through a
    host cache of ``capacity`` bytes that cannot hold the layer: the engine's own rule
    (`jgrind.engine.tiers.cached_ssd`), followed partition by partition in index order. A
    gather pins every block of its route that the cache holds; it takes its owners in index
    order, each from the cache, else loaded whole into it while the pinned blocks leave room
    (evicting the least recently used others), else read as coalesced spans
    (`Workload.ssd_calls`). So the cache keeps the lowest owners' blocks from one partition to
    the next, and the rest are spans.

    Each owner is served by a call of its own: a row take from its cached block (or loaded
    one), or a lookup that finds it absent (`jgrind.plan.hardware.Profile.cached_take`,
    ``cache_lookup``). On the planner benchmark's `host-tight` plan (256 partitions) a gather
    sweep serves ~17k owners so, 11k of them from cached blocks; unpriced, at ~30 us each
    under load, they were most of forward 0's miss.

    (It was priced as every halo owner's whole block loaded, times the cache's miss rate: on
    the planner benchmark's `ssd` configuration, a quarter of its size, 3.1 GB for a sweep
    that read 1.0 GB in spans and a few loads; the SSD plans were over-predicted.)"""
    return _halo_cache_reads(w, int(words), in_ssd.tobytes(), int(row_bytes), int(capacity))


@functools.lru_cache(maxsize=256)
def _halo_cache_reads(w: Workload, words: int, in_ssd: bytes, row_bytes: int,
                      capacity: int) -> tuple:
    in_ssd = np.frombuffer(in_ssd, bool)
    P = w.num_parts
    if not in_ssd.any():  # no halo rows from SSD
        return tuple(_frozen(np.zeros(P)) for _ in range(6))
    size = w.owned * row_bytes
    ptr, owners = w.ssd_owner_lists(in_ssd)
    active = w.owned > 0
    # The engine's rule, worked out partition by partition with array operations over its
    # route (tests/test_cost_cache_simulation.py holds it owner by owner): a gather pins the
    # blocks of its route the cache holds, so those are its hits and no eviction touches
    # them; each other block of the route, in order, is loaded if it fits beside the pinned
    # ones (pinning it too), else read as spans; room is made by evicting the least recently
    # used blocks outside the route, oldest first; and the route's cached blocks end up the
    # most recently used, in route order.
    served = np.zeros(owners.size, bool)  # each (partition, owner): from the cache...
    loaded = np.zeros(owners.size, bool)  # ...and among those, loaded into it
    in_cache = np.zeros(P, bool)
    stamp = np.zeros(P, np.int64)  # when each block was last used (largest: most recent)
    now, held = 0, 0
    everything = int(size[in_ssd].sum()) <= capacity  # nothing is ever evicted or spanned
    starts, own = ptr.tolist(), in_ssd.tolist()
    for p in np.flatnonzero(active & (np.diff(ptr) + in_ssd > 0)).tolist():
        a, b = starts[p], starts[p + 1]
        route = np.concatenate(([p], owners[a:b])) if own[p] else owners[a:b]
        hit = in_cache[route]
        if everything:
            load = ~hit
        else:
            sizes = size[route]
            load = _loads_beside(sizes, hit, capacity)
            more = int(sizes[load].sum())
            if held + more > capacity:  # evict the least recently used outside the route
                pinned = route[hit]
                in_cache[pinned] = False
                others = in_cache.nonzero()[0]
                in_cache[pinned] = True
                oldest = others[stamp[others].argsort()]
                freed = size[oldest].cumsum()
                gone = int(freed.searchsorted(held + more - capacity)) + 1
                in_cache[oldest[:gone]] = False
                held -= int(freed[gone - 1])
            held += more
        in_cache[route[load]] = True
        stamp[route] = np.arange(now, now + route.size)
        now += route.size
        first = int(own[p])  # the route starts with p's own block (priced apart)
        served[a:b] = hit[first:] | load[first:]
        loaded[a:b] = load[first:]
    # the partitions' counts, summed over their owners (partition p's are the CSR's row p;
    # an inactive partition gathers nothing)
    part = np.repeat(np.arange(P), np.diff(ptr))
    spanned = np.flatnonzero(~served & active[part])
    into = part[spanned]
    cell = into * P + owners[spanned]  # (partition, owner) in the [P, P] tables
    new = np.flatnonzero(loaded)

    def per_part(at, weights=None) -> np.ndarray:
        return np.bincount(at, weights, minlength=P).astype(np.float64)

    out = (per_part(part[new], size[owners[new]]), per_part(part[new]),
           per_part(into, w.ssd_calls[words].reshape(-1)[cell]),
           per_part(into, w.ssd_rows[words].reshape(-1)[cell]) * row_bytes,
           per_part(part[served]), per_part(into))
    for a in out:
        a.setflags(write=False)
    return out


def _loads_beside(sizes: np.ndarray, hit: np.ndarray, capacity: int) -> np.ndarray:
    """Which blocks of a route (``sizes`` bytes each, ``hit``: already cached) a gather loads:
    in route order, each block not cached that fits beside the cached ones and those loaded
    before it. The first run of blocks that fit is one cumulative sum; after the first block
    that does not, only the (few) blocks no larger than the room left can still fit. (Array
    methods rather than NumPy's functions: this runs for every partition of a sweep.)"""
    load = np.zeros(sizes.size, bool)
    miss = (~hit).nonzero()[0]
    s = sizes[miss]
    run = s.cumsum()
    room = capacity - int(sizes.sum()) + (int(run[-1]) if run.size else 0)
    n = int(run.searchsorted(room, side="right"))  # the first n blocks all fit
    load[miss[:n]] = True
    if n < s.size:
        room -= int(run[n - 1]) if n else 0
        later = (s[n + 1:] <= room).nonzero()[0] + n + 1
        for i, nbytes in zip(later.tolist(), s[later].tolist()):
            if nbytes <= room:
                load[miss[i]] = True
                room -= nbytes
    return load


def write_seconds(w: Workload, profile, layer: int, codes: np.ndarray,
                  width: Optional[int] = None, name: Optional[str] = None) -> float:
    """Seconds to store every partition's output rows as its block of ``H_layer`` (or of a
    tensor ``width`` wide, e.g. ``Z_layer``; ``name``: the tensor's kind, which decides its
    storage dtype, by default ACTIVATION, or AGGREGATION when ``width`` is given)."""
    return _write(w, profile, layer, codes, width, name).total()


def write_parts(w: Workload, profile, layer: int, codes: np.ndarray,
                width: Optional[int] = None, name: Optional[str] = None) -> np.ndarray:
    """``[P]`` seconds of every partition's write of its block, indexed by partition
    (`write_seconds` is their sum)."""
    return _write(w, profile, layer, codes, width, name).parts()


def _write(w: Workload, profile, layer: int, codes: np.ndarray,
           width: Optional[int] = None, name: Optional[str] = None) -> _Priced:
    name = name or (ACTIVATION if width is None else AGGREGATION)
    width = w.widths[layer] if width is None else width
    active = w.owned > 0
    row = width * ITEMSIZE
    nbytes = np.where(active, w.owned * row, 0)
    # a block in a lossy dtype is encoded from the (padded) step output on the device and
    # only its stored words cross to the host; other blocks off the device cross as the
    # padded float32 output (`jgrind.engine.sweeps.Sweeps.for_the_store`)
    srow, _, _ = _coded(w, profile, name, width)
    converted = _converted(w, name, codes) & active
    out = np.where(active & (codes != D), w.pad_out * np.where(converted, srow, row), 0)
    stored = np.where(active, w.owned * srow, 0)  # the block's bytes in its tier
    encoding = np.where(converted, device_conversion_seconds(w.pad_out, row, srow, profile),
                        0.0)
    to_host = out / profile.to_host_bw + encoding
    per_tier = {D: nbytes / profile.gather_bw + device_call_seconds(profile),
                H: to_host + stored / profile.copy_bw,
                R: to_host + nbytes / profile.copy_bw,
                S: to_host + stored / profile.ssd_write_bw
                + stored / profile.checksum_bw + profile.ssd_latency}  # + its checksum
    return _Priced(tuple(np.where(codes == c, t, 0.0) for c, t in per_tier.items()),
                   to_host=int(out.sum()))


def read_block_seconds(w: Workload, profile, layer: int, codes: np.ndarray,
                       cache: CacheModel = CacheModel(), width: Optional[int] = None,
                       verified: bool = False, name: Optional[str] = None) -> float:
    """Seconds to read every partition's own block of ``G_layer`` (or of a tensor ``width``
    wide, e.g. ``Z_layer``), padded, onto the device. ``verified``: SSD blocks are checked
    against their checksums (blocks written whole are; gradient blocks, updated row by row, are
    not). ``name``: the tensor's kind, which decides its storage dtype, by default GRADIENT, or
    AGGREGATION when ``width`` is given."""
    return _read_block(w, profile, layer, codes, cache, width, verified, name).total()


def read_block_parts(w: Workload, profile, layer: int, codes: np.ndarray,
                     cache: CacheModel = CacheModel(), width: Optional[int] = None,
                     verified: bool = False, name: Optional[str] = None) -> np.ndarray:
    """``[P]`` seconds of every partition's block read, indexed by partition
    (`read_block_seconds` is their sum)."""
    return _read_block(w, profile, layer, codes, cache, width, verified, name).parts()


def _read_block(w: Workload, profile, layer: int, codes: np.ndarray,
                cache: CacheModel = CacheModel(), width: Optional[int] = None,
                verified: bool = False, name: Optional[str] = None) -> _Priced:
    name = name or (GRADIENT if width is None else AGGREGATION)
    width = w.widths[layer] if width is None else width
    row = width * ITEMSIZE
    active = w.owned > 0
    # a block in a lossy dtype is sent as its stored words and decoded on the device
    # (`jgrind.engine.tiers.coded.StoredRows`); a recomputed layer's block (a node-wise
    # layer's input) is read from its float32 host transient
    srow, _, _ = _coded(w, profile, name, width)
    converted = _converted(w, name, codes) & active
    sent_row = np.where(converted, srow, row)
    own = np.where(active, w.owned * sent_row, 0)
    pad = np.where(active, w.pad_out * sent_row, 0)
    onto_device = to_device_seconds(pad, profile) + (pad - own) / profile.copy_bw \
        + np.where(converted, device_conversion_seconds(w.pad_out, row, srow, profile), 0.0)
    stored = np.where(active, w.owned * srow, 0)
    ssd = (stored / profile.copy_bw if cache.holds_everything
           else _ssd_read(stored, 1, profile) + _uncached_copy(stored, cache, profile)
           + (stored / profile.checksum_bw if verified else 0.0))
    per_tier = {D: np.where(active, w.pad_out * row, 0) / profile.gather_bw
                + device_call_seconds(profile),
                H: own / profile.copy_bw + onto_device,
                R: own / profile.copy_bw + onto_device,
                S: ssd + onto_device}
    sent = np.where(codes == D, 0, pad)
    return _Priced(tuple(np.where(codes == c, t, 0.0) for c, t in per_tier.items()),
                   to_device=int(sent.sum()))


def accumulate_seconds(w: Workload, profile, layer: int, codes: np.ndarray,
                       fast: bool = True) -> float:
    """Seconds to scatter-add every partition's input gradient (own + halo rows) into
    ``G_layer``: a read-modify-write of rows in the tier of each row's owner block. A
    node-wise layer's input gradient has no halo rows: it is written as the block."""
    return _accumulate(w, profile, layer, codes, fast).total()


def accumulate_parts(w: Workload, profile, layer: int, codes: np.ndarray,
                     fast: bool = True) -> np.ndarray:
    """``[P]`` seconds of every partition's scatter-add into ``G_layer``, indexed by
    partition (`accumulate_seconds` is their sum)."""
    return _accumulate(w, profile, layer, codes, fast).parts()


def _accumulate(w: Workload, profile, layer: int, codes: np.ndarray,
                fast: bool = True) -> _Priced:
    if w.local(layer):
        return _write(w, profile, layer, codes, name=GRADIENT)
    row = w.widths[layer] * ITEMSIZE
    # a lossy dtype's rows: read and written back at its bytes, decoded, added and encoded
    # on the host, from the step's float32 input gradient (`jgrind.engine.tiers.coded`)
    srow, encode, decode = _coded(w, profile, GRADIENT, w.widths[layer])
    active = w.owned > 0
    if fast and np.all(codes == D):
        return _Priced((np.where(active, 2 * w.pad_in * row / profile.gather_bw, 0.0),))
    # the padded input gradient crosses to the host in float32 unless all its rows land in
    # device blocks (`jgrind.engine.store.Table.stored_on_host`); priced for every partition,
    # so that the price stays linear in the blocks' tiers (`_gather`)
    out = np.where(active, w.pad_in * row, 0)
    seconds = out / profile.to_host_bw
    out = np.where(_routes_within(w, codes == D), 0, out)
    for code in (D, H, S):
        mine = (codes == code).astype(np.int64)
        rows = w.halo_rows_in(codes == code) + np.where(active, w.owned * mine, 0)
        nbytes = rows * row
        if code == D:
            seconds += to_device_seconds(nbytes, profile) + 3 * nbytes / profile.gather_bw \
                + np.where(rows > 0, device_call_seconds(profile), 0.0)
        elif code == H and decode:  # every row: gathered, converted, added, put back
            seconds += rows * srow * (1.0 / profile.gather_bw + 1.0 / profile.scatter_add_bw) \
                + nbytes * (decode + encode + 1.5 / profile.copy_bw)
        elif code == H:  # own rows: one slice add (3 streams); halo rows: x[idx] += v
            own_rows = np.where(active, w.owned * mine, 0)
            own = own_rows * row
            seconds += 1.5 * own / profile.copy_bw + (nbytes - own) / profile.scatter_add_bw \
                + (rows - own_rows) * profile.scatter_add_row_seconds
        else:
            calls, span_rows = ssd_span_reads(w, srow // ITEMSIZE, codes == S, with_own=True)
            span = span_rows * srow
            seconds += (span / profile.ssd_read_bw + span / profile.ssd_write_bw
                        + calls * (2 * profile.ssd_latency + profile.update_call_overhead)
                        + 2 * nbytes / profile.gather_bw + nbytes * (decode + encode))
    # A kept gradient file writes no zeros of its own (`SSDFile.zero_lazily`), and the spans
    # that the sweep adds to first, with no current row yet, are not read. Every span is
    # priced as read and written, which overestimates the reads: on the 1M-node graph the
    # scatter-adds read back 1.65 GiB per epoch, not 1.88 (docs/results-history.md, section 4,
    # "Rows, not blocks, go current"). Which spans go unread depends on the partitions' order.
    return _Priced((seconds,), to_host=int(out.sum()))


# -- an epoch, sweep by sweep ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Sweep:
    """One pass over all partitions: its compute and I/O seconds and what it moves, in total
    and per partition. The ``part_*`` arrays follow ``partitions``, the order the schedule
    runs them in; each sums to its total up to rounding."""

    label: str              # "forward 0", "recompute 1", "backward 2", ...
    layer: int
    kind: str               # forward | recompute | backward
    compute: float
    reads: float            # gathers and block reads: the engine's prefetch thread
    writes: float           # writes and scatter-adds: its writer thread
    moves: tuple            # human-readable: ("reload H_1 from ssd", "offload H_2 to host")
    partitions: tuple = ()  # partition ids in the order the sweep runs them
    part_compute: np.ndarray = dataclasses.field(default=None, compare=False)  # [P]
    part_reads: np.ndarray = dataclasses.field(default=None, compare=False)    # [P]
    part_writes: np.ndarray = dataclasses.field(default=None, compare=False)   # [P]
    to_device: int = 0      # bytes handed to the device, and read back on the host: what
    to_host: int = 0        # crosses the link on a GPU (`jgrind.engine.store.Accounts`)
    # the engine's own seconds for the sweep's steps (`sweep_machinery`): the sweep takes no
    # less, however little it computes and moves
    machinery: float = 0.0
    # the loader's and the writer's own seconds for the sweep's steps besides their bytes
    # (`thread_own`): part of ``machinery``'s wall time, and of their threads' time too, so
    # that a thread's time is its bytes and these
    reader_own: float = 0.0
    writer_own: float = 0.0

    def io_seconds(self, parallel: float, cores: Optional["HostCores"] = None) -> float:
        """The sweep's I/O time: reads and writes run on two threads, so ``parallel`` (the
        profile's `io_parallel`, measured beside a step as long as both) of the shorter side
        runs beside the longer. ``cores``: the host's cores, which bound it the other way:
        each thread on a core of its own (`HostCores.io_bound`); where the steps share them
        too, that bound is the I/O's time (the share is not read: `HostCores`)."""
        reads, writes = self.reads + self.reader_own, self.writes + self.writer_own
        if cores is not None and cores.compute_on_host:
            return cores.io_bound(reads, writes)
        io = reads + writes - parallel * min(reads, writes)
        if cores is None:
            return io
        return min(io, cores.io_bound(reads, writes))

    def seconds(self, overlap: float, parallel: float,
                cores: Optional["HostCores"] = None) -> float:
        """The sweep's seconds. On an accelerator (or a host of unknown cores) the steps run
        beside the I/O threads, ``overlap`` of the shorter hidden; where the steps run on the
        host's cores too, the three threads share those cores (`HostCores.sweep_seconds`).
        Never less than the engine's own work for the steps (``machinery``): a sweep of small
        steps is bound by their dispatch, hand-offs and table calls."""
        if cores is not None and cores.compute_on_host:
            return cores.sweep_seconds(self.compute, self.reads, self.writes, self.machinery,
                                       self.reader_own, self.writer_own)
        io = self.io_seconds(parallel, cores)
        return max(self.compute + io - overlap * min(self.compute, io), self.machinery)

    def engine_bound(self, cores: Optional["HostCores"] = None) -> float:
        """The least the sweep takes for its steps alone: the engine's own work for them
        (``machinery``) and, where the steps run on the host's cores, their kernels after it
        (`HostCores.sweep_seconds`); on an accelerator the kernels run beside it."""
        if cores is not None and cores.compute_on_host:
            return self.compute + self.machinery
        return self.machinery


@dataclasses.dataclass(frozen=True)
class HostCores:
    """The host cores a sweep's reader and writer threads share, and whether the step's
    compute shares them too (the CPU backend) or runs on an accelerator.

    On the host, a step's kernels take every core while they run (XLA's CPU backend splits
    each op over all of them), and nothing else gets far beside them: the engine's own work
    for the steps (mostly the Python of its three threads, which take turns on the
    interpreter), the reader's gathers and the writer's stores and scatter-adds run in the
    time around the kernels, each on a core of its own at most and all of them together
    spread over the cores. A sweep takes ``c + max(e, r, w, (e + r + w) / cores)``.

    What this rests on (docs/planner.md, "The host's cores"): the engine probe's own
    workload made 128 and 256 features wide ran its sweeps at -9 to +21 % of their kernels
    plus the engine's work, 9-47 % over the larger of the two (`tools/probe_engine_widths.py`);
    deep-sage's scatter-adds into an SSD gradient took 1.11-1.25 s a sweep alone against
    1.255 s priced, and 1.58-1.80 s on the writer thread inside the epoch, where the sweep's
    kernels are priced at 0.3 s (`tools/bench_accumulate.py`). Replayed on the 80 runs
    recorded with their own sweeps (runs AJ-AL, `tools/replay_sweeps.py`, ``alone``): 62
    within 25 %, mean error -0.1 %, largest 41 %, against 55, -7.1 % and 51 % for ``max(c +
    e, r, w, (r + w) / cores + c)``, the form until then, whose I/O ran beside the kernels.
    It reads no measured overlap: the profile's spread 0.22-0.67 over one hour on one
    machine, too noisy to price from."""

    count: int
    compute_on_host: bool

    def sweep_seconds(self, compute: float, reads: float, writes: float,
                      machinery: float = 0.0, reader_own: float = 0.0,
                      writer_own: float = 0.0) -> float:
        """A sweep's seconds when its steps run on these cores (the class's form): its
        kernels ``compute``, then the engine's own work for the steps ``machinery``
        (`Sweep.machinery`), the reads and the writes around them. ``reader_own``,
        ``writer_own``: the I/O threads' own seconds besides their bytes (`thread_own`),
        on their threads; in the cores' share they are ``machinery``'s already (the probe
        that measures it runs those threads too)."""
        return compute + max(machinery, reads + reader_own, writes + writer_own,
                             (machinery + reads + writes) / self.count)

    def io_bound(self, reads: float, writes: float) -> float:
        """The least I/O time the cores allow: each thread on a core of its own, their work
        spread over all the cores."""
        if self.count < 2:
            return reads + writes
        return max(reads, writes, (reads + writes) / self.count)

    @classmethod
    def of(cls, profile) -> Optional["HostCores"]:
        """The profile's machine's cores (None when it does not say)."""
        machine = getattr(profile, "machine", None)
        count = machine.get("cores") if isinstance(machine, dict) else None
        if not count:
            return None
        return cls(int(count), machine.get("backend", "cpu") == "cpu")


def schedule_of(w: Workload, a: "Assignment") -> Schedule:
    """The epoch the engine runs for assignment ``a`` on workload ``w``: what the model
    prices."""
    return epoch_schedule(w.num_layers, recomputed=a.recomputed, kept=a.kept,
                          masked=[l for l in range(w.num_layers) if w.masked(l)])


@dataclasses.dataclass(frozen=True)
class Assignment:
    """Tier codes for every block: ``activations[l]`` and ``gradients[l]`` are ``[P]`` arrays
    (``gradients[0]`` is unused: there is no gradient of the input features).
    ``aggregations``: ``{l: [P] codes}`` of the layers whose aggregation ``Z_l`` is kept (all
    blocks, never R); the other layers regather."""

    activations: tuple
    gradients: tuple
    aggregations: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_fates(cls, fates: dict, num_layers: int, num_parts: int) -> "Assignment":
        def codes(name, l, default=Fate.HOST):
            return np.array([CODES[fates.get((name, l, p), default)]
                             for p in range(num_parts)], np.int8)
        kept = {l: codes(AGGREGATION, l, Fate.RECOMPUTE) for l in range(num_layers)}
        return cls(tuple(codes(ACTIVATION, l) for l in range(num_layers)),
                   tuple(codes(GRADIENT, l) if l else np.full(num_parts, D, np.int8)
                         for l in range(num_layers)),
                   {l: c for l, c in kept.items() if c.size and not np.any(c == R)})

    def fates(self) -> dict:
        out = {}
        for l, codes in enumerate(self.activations):
            out.update({(ACTIVATION, l, p): FATES[int(c)] for p, c in enumerate(codes)})
        for l, codes in enumerate(self.gradients[1:], start=1):
            out.update({(GRADIENT, l, p): FATES[int(c)] for p, c in enumerate(codes)})
        for l, codes in self.aggregations.items():
            out.update({(AGGREGATION, l, p): FATES[int(c)] for p, c in enumerate(codes)})
        return out

    @property
    def recomputed(self) -> frozenset:
        return frozenset(l for l, c in enumerate(self.activations) if np.any(c == R))

    @property
    def kept(self) -> frozenset:
        """Layers whose aggregation is kept."""
        return frozenset(self.aggregations)


@dataclasses.dataclass(frozen=True)
class Memory:
    """Predicted peak bytes per tier, as the store accounts them (device: stored blocks only;
    the working set is reported beside it), and the engine's budget check."""

    device_tables: int
    device_working_set: int
    host_tables: int
    host_transient: int
    host_cache: int
    ssd: int
    ssd_needed: int   # SSD bytes the store reserves up front (free-space check)
    stored_peaks: tuple = (0, 0, 0)  # predicted peak stored bytes (device, host, SSD) over time
    cacheable: int = 0  # host cache bytes that would hold every SSD block read between writes
    # on several devices (`Workload.device_of`), per device: its partitions' device blocks at
    # their peak, and its working set; ``device_tables`` is then their sum (the store's device
    # account), ``device_working_set`` the largest
    device_tables_each: tuple = ()
    device_working_sets: tuple = ()

    @property
    def device(self) -> int:
        """The device bytes the budget holds: blocks and working set; on several devices,
        the fullest device's."""
        if self.device_tables_each:
            return max(self.device_peaks)
        return self.device_tables + self.device_working_set

    @property
    def device_peaks(self) -> tuple:
        """Each device's predicted peak, its blocks and its working set (one device: one)."""
        if not self.device_tables_each:
            return (self.device_tables + self.device_working_set,)
        return tuple(int(t + s) for t, s in zip(self.device_tables_each,
                                                 self.device_working_sets))

    @property
    def host(self) -> int:
        """Host bytes the plan needs (without the cache, which takes what is left)."""
        return self.host_tables + self.host_transient

    @property
    def peak_device(self) -> int:
        """Predicted peak of the store's device account (stored blocks)."""
        return self.stored_peaks[0]

    @property
    def peak_host(self) -> int:
        """Predicted peak of the store's host account: blocks, live transients, cache."""
        return self.stored_peaks[1] + self.host_cache

    @property
    def peak_ssd(self) -> int:
        return self.stored_peaks[2]


def _stored_bytes(w: Workload, a: Assignment, acts=None, grads=None
                  ) -> list[tuple[int, int, int]]:
    """Stored bytes per tier (device, host, SSD) at the start of the epoch and during each sweep
    of its schedule (`schedule_of`): activation blocks all epoch; a gradient table and a
    recomputed layer's transient from the sweep that makes it to the sweep that frees it.
    ``acts``, ``grads``: the layers' `Workload.tier_bytes`, if already worked out."""
    L = w.num_layers
    acts = acts or [w.tier_bytes(l, a.activations[l]) for l in range(L)]
    grads = grads or [w.tier_bytes(l, a.gradients[l], GRADIENT) for l in range(L)]
    kept = kept_bytes(w, a)
    base = [sum(acts[l][c] for l in range(L)) + kept[c] for c in (D, H, S)]
    # a gradient table entirely on SSD keeps its file from epoch to epoch (`Store.drop`, as
    # `memory` charges it): from the second epoch on it is there all epoch
    whole = {l for l in range(1, L) if np.all(a.gradients[l] == S)}
    base[2] += sum(grads[l][S] for l in whole)
    live = {ACTIVATIONS: set(), GRADIENTS: set()}  # recomputed layers' transients; G_l
    out = [tuple(base)]
    for sweep in schedule_of(w, a).sweeps:
        for table in sweep.makes:
            live.get(table.name, set()).add(table.layer)
        now = [base[i] + sum(grads[g][c] for g in live[GRADIENTS] - whole)
               for i, c in enumerate((D, H, S))]
        now[1] += sum(acts[j][R] for j in live[ACTIVATIONS])
        out.append(tuple(now))
        for table in sweep.frees:
            live.get(table.name, set()).discard(table.layer)
    return out


def kept_bytes(w: Workload, a: Assignment) -> list[int]:
    """Bytes of the kept aggregations in each tier, indexed by tier code. The store holds their
    tables for the whole run (each is written in its forward sweep and read in its backward
    one)."""
    total = np.zeros(4)
    for l, codes in a.aggregations.items():
        total += w.tier_bytes(l, codes, AGGREGATION)
    return [int(b) for b in total]


def memory(w: Workload, a: Assignment, cache_capacity: int = 0,
           snapshot_bytes: int = 0) -> Memory:
    """Bytes per tier of assignment ``a`` at its peak, by the engine's own accounting (kept
    aggregations, `kept_bytes`, for the whole epoch)."""
    L = w.num_layers
    acts_by_layer = [w.tier_bytes(l, a.activations[l]) for l in range(L)]
    grads_by_layer = [w.tier_bytes(l, a.gradients[l], GRADIENT) for l in range(L)]
    acts = {c: sum(t[c] for t in acts_by_layer) for c in (D, H, S, R)}
    # gradient layers entirely on SSD keep their files from epoch to epoch (`Store.drop`):
    # charged for the whole run; the others live two at a time
    whole = [l for l in range(1, L) if np.all(a.gradients[l] == S)]
    kept_grads = sum(grads_by_layer[l][S] for l in whole)

    def live(l, c):
        return 0 if l in whole else grads_by_layer[l][c]
    pairs = {c: max([live(l, c) + (live(l + 1, c) if l + 1 < L else 0)
                     for l in range(1, L)] or [0]) for c in (D, H, S)}
    pairs[S] += kept_grads
    transient = max([t[R] for t in acts_by_layer] or [0])
    ssd_grads = sum(grads_by_layer[l][S] for l in range(1, L))
    # the cache holds SSD activation blocks and the gradient layer being read (a gradient layer
    # is read once, in the backward sweep below it, and dropped with its blocks right after)
    cached = acts[S] + max([grads_by_layer[l][S] for l in range(1, L)] or [0])
    kd, kh, ks = kept_bytes(w, a)[:3]
    stored = _stored_bytes(w, a, acts_by_layer, grads_by_layer)
    each, sets, working_set = (), (), w.working_set()
    if w.device_of is not None:
        each = tuple(int(t) for t in device_tables_by_device(w, a))
        sets = tuple(int(b) for b in w.device_working_sets())
        working_set = max(sets, default=0)
    return Memory(device_tables=acts[D] + pairs[D] + kd, device_working_set=working_set,
                  device_tables_each=each, device_working_sets=sets,
                  host_tables=acts[H] + pairs[H] + kh, host_transient=2 * transient,
                  host_cache=min(cache_capacity, cached + ks), ssd=acts[S] + pairs[S] + ks,
                  ssd_needed=acts[S] + ssd_grads + snapshot_bytes + ks,
                  stored_peaks=tuple(max(col) for col in zip(*stored)), cacheable=cached + ks)


def device_tables_by_device(w: Workload, a: Assignment) -> np.ndarray:
    """``[K]`` the device blocks each device holds at its peak (`Workload.device_of`), by
    `memory`'s accounting restricted to its partitions: its activation blocks and kept
    aggregations all epoch, its gradient blocks two layers at a time."""
    L, k = w.num_layers, w.num_devices
    device_of = np.zeros(w.num_parts, np.int64) if w.device_of is None else w.device_of

    def on_device(codes: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        return np.bincount(device_of, np.where(codes == D, nbytes, 0),
                           minlength=k).astype(np.int64)
    acts = sum((on_device(a.activations[l], w.block_bytes(l)) for l in range(L)),
               np.zeros(k, np.int64))
    kept = sum((on_device(codes, w.aggregation_bytes(l))
                for l, codes in a.aggregations.items()), np.zeros(k, np.int64))
    grads = [on_device(a.gradients[l], w.block_bytes(l)) if l else np.zeros(k, np.int64)
             for l in range(L)]
    pairs = np.zeros(k, np.int64)
    for l in range(1, L):
        pairs = np.maximum(pairs, grads[l] + (grads[l + 1] if l + 1 < L else 0))
    return acts + kept + pairs


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The cost model's answer for one assignment."""

    sweeps: tuple
    overlap: float
    memory: Memory
    update_seconds: float
    parallel: float         # share of a sweep's reads and writes that run side by side

    cores: Optional[HostCores] = None  # the host's cores: `Sweep.io_seconds`
    # measured over priced sweeps that a review of a run's epochs found left once its parts
    # were calibrated (`jgrind.plan.replan.calibrate`): time that no part of the form holds
    residual: float = 1.0

    def sweep_seconds(self, sweep: Sweep, overlap: Optional[float] = None) -> float:
        """``sweep``'s seconds, at ``overlap`` instead of the profile's when given."""
        return self.residual * sweep.seconds(self.overlap if overlap is None else overlap,
                                             self.parallel, self.cores)

    def io_seconds(self, sweep: Sweep) -> float:
        return sweep.io_seconds(self.parallel, self.cores)

    @property
    def to_device(self) -> int:
        """Bytes of stored blocks, step inputs and labels the epoch hands to the device, as
        the store counts them (`jgrind.engine.store.Accounts.to_device`), block structures
        aside (kept on the device, or adopted from host memory, after the first epoch)."""
        return sum(s.to_device for s in self.sweeps)

    @property
    def to_host(self) -> int:
        """Bytes of step outputs the epoch reads back on the host (`Accounts.to_host`)."""
        return sum(s.to_host for s in self.sweeps)

    @property
    def epoch_seconds(self) -> float:
        return sum(self.sweep_seconds(s) for s in self.sweeps) + self.update_seconds

    def schedule(self) -> list[dict]:
        """The epoch as Gantt rows, partition by partition: for every sweep, one row per
        partition in each lane it uses ("compute", "reads", "writes"), in the schedule's order,
        and one "epoch" row spanning the sweep. A row has ``sweep`` (the sweep's index),
        ``label``, ``lane``, ``partition`` (None for "epoch"), ``start`` and ``end`` (seconds
        from the epoch's start) and ``what`` (the sweep's kind).

        The model prices a sweep from its totals (`Sweep.seconds`), so the rows place each
        lane's partitions end to end within the sweep's predicted span: reads start with the
        sweep, writes end with it, and compute starts once the reads' share of the I/O it does
        not hide (span less compute, shared between reads and writes in proportion) is over."""
        rows, t = [], 0.0
        for i, s in enumerate(self.sweeps):
            span = self.sweep_seconds(s)
            io = s.reads + s.writes
            lead = max(span - s.compute, 0.0) * s.reads / io if io > 0 else 0.0
            lanes = (("compute", s.part_compute, t + lead), ("reads", s.part_reads, t),
                     ("writes", s.part_writes, t + span - float(np.sum(s.part_writes))))
            for lane, seconds, start in lanes:
                if lane == "writes" and s.writes == 0:
                    continue  # the sweep stores nothing (the bottom layer's backward)
                ends = start + np.cumsum(seconds)
                starts = np.concatenate(([start], ends[:-1]))
                rows += [{"sweep": i, "label": s.label, "lane": lane, "partition": p,
                          "start": float(a), "end": float(b), "what": s.kind}
                         for p, a, b in zip(s.partitions, starts, ends)]
            rows.append({"sweep": i, "label": s.label, "lane": "epoch", "partition": None,
                         "start": t, "end": t + span, "what": s.kind})
            t += span
        return rows

    def timeline(self, w: Workload, a: Assignment) -> list[tuple]:
        """``(seconds, device, host, ssd)`` stored bytes at the start and during every sweep,
        stamped at the sweep's end."""
        stored = _stored_bytes(w, a)
        ends = np.cumsum([0.0] + [self.sweep_seconds(s) for s in self.sweeps])
        return [(float(t), *bytes_) for t, bytes_ in zip(ends, stored)]


def page_cached(profile, m: Memory) -> bool:
    """Whether the OS page cache will hold the SSD tier's files: they fit in the RAM the run
    leaves free (the engine reads and writes through the page cache, so then the SSD tier runs
    at memory speed; past it, at the disk's)."""
    used = m.device_tables + m.device_working_set + m.peak_host
    return m.ssd_needed <= getattr(profile, "host_free", 0) - used


def with_page_cache(profile, cached: bool):
    """``profile`` with its SSD figures replaced by the page cache's when ``cached``."""
    if not cached:
        return profile
    figures = {"ssd_read_bw": profile.cached_read_bw, "ssd_write_bw": profile.cached_write_bw,
               "ssd_latency": profile.cached_latency}
    if dataclasses.is_dataclass(profile):
        return dataclasses.replace(profile, **figures)
    import types
    return types.SimpleNamespace(**{**vars(profile), **figures})


def cache_model(w: Workload, a: Assignment, capacity: int,
                m: Optional[Memory] = None) -> CacheModel:
    """Whether a host cache of ``capacity`` bytes holds every SSD block read between writes
    (``m``: ``memory(w, a)`` if already worked out)."""
    m = memory(w, a) if m is None else m
    need = min(capacity, m.cacheable) if capacity >= m.ssd else m.cacheable
    # the cache holds SSD blocks as stored: in their storage dtype's bytes
    block = max((int(w.stored_bytes(name, l).max(initial=0)) for l in range(w.num_layers)
                 for name in (ACTIVATION, GRADIENT)), default=0)
    if capacity < block:
        return CacheModel(0, False)
    return CacheModel(capacity, need <= capacity, min(1.0, capacity / max(need, 1)))


def predict(w: Workload, a: Assignment, profile, cache_capacity: int = 0,
            num_params: int = 0) -> Prediction:
    """Predicted epoch of assignment ``a`` on workload ``w`` with a host cache of
    ``cache_capacity`` bytes in front of the SSD tier."""
    mem = memory(w, a)
    cache = cache_model(w, a, cache_capacity, mem)
    mem = dataclasses.replace(mem, host_cache=min(cache.capacity, mem.cacheable))
    profile = with_page_cache(profile, page_cached(profile, mem))
    schedule = schedule_of(w, a)
    read_once: set = set()  # activation layers read since written (cache hits afterwards)
    sweeps = tuple(_price_sweep(w, a, profile, cache, sweep, order, read_once)
                   for sweep, order in zip(schedule.sweeps,
                                           partition_orders(schedule, w.num_parts)))
    update = 3.0 * num_params * ITEMSIZE * 4 / profile.copy_bw
    return Prediction(sweeps, float(profile.overlap), mem, update, float(profile.io_parallel),
                      HostCores.of(profile))


@functools.lru_cache(maxsize=64)
def partition_orders(schedule: Schedule, num_parts: int) -> tuple:
    """For every sweep of ``schedule``, its partitions in the order it runs them (`Schedule.steps`
    over the engine's partitions, which it takes in index order): read-only int arrays."""
    orders = [[] for _ in schedule.sweeps]
    for step in schedule.steps(range(num_parts)):
        orders[step.sweep].append(step.partition)
    out = tuple(np.array(order, np.int64) for order in orders)
    for order in out:
        order.setflags(write=False)
    return out


def _tiers_named(codes: np.ndarray) -> str:
    """The tiers of blocks ``codes``, as the moves name them: ``"device+ssd"``."""
    names = {D: "device", H: "host", S: "ssd", R: "recompute"}
    present = np.flatnonzero(np.bincount(codes, minlength=4)).tolist()
    return "+".join(sorted(names[c] for c in present))


def _price_sweep(w: Workload, a: Assignment, profile, cache: CacheModel, sweep,
                 order: np.ndarray, read_once: set) -> Sweep:
    """One sweep of the schedule (a `jgrind.plan.schedule.Sweep`), priced in total and per
    partition. ``order``: its partitions in the order it runs them; ``read_once``: the
    activation layers read since they were written, updated here."""
    kind, l = sweep.kind, sweep.layer
    totals = {"reads": 0.0, "writes": 0.0}
    parts = {"reads": np.zeros(w.num_parts), "writes": np.zeros(w.num_parts)}
    moves = []
    link = {"to_device": 0, "to_host": 0}

    ssd_calls = np.zeros(w.num_parts)  # per partition: its step's calls on SSD blocks
    mixed_calls = 0  # halo calls on tables split between the device and other tiers

    def charge(priced: _Priced, side: str, move: str, codes: np.ndarray) -> None:
        nonlocal ssd_calls
        ssd_calls = ssd_calls + (np.asarray(codes) == S)
        totals[side] += priced.total()
        parts[side] += priced.parts(order)
        moves.append(move)
        link["to_device"] += priced.to_device
        link["to_host"] += priced.to_host

    if kind == "backward" and l in a.kept:  # reads Z_l instead of regathering H_l
        z = a.aggregations[l]
        charge(_read_block(w, profile, l, z, cache, w.aggregated[l], verified=True), "reads",
               f"reload Z_{l} from {_tiers_named(z)}", z)
    else:
        acts_in = a.activations[l]
        charge(_gather(w, profile, l, acts_in, cache, reread=l in read_once), "reads",
               f"gather H_{l} from {_tiers_named(acts_in)}", acts_in)
        mixed_calls += mixed_halo_call(w, l, acts_in)
        read_once.add(l)
    if kind in ("forward", "recompute"):
        out = a.activations[l + 1]
        charge(_write(w, profile, l + 1, out), "writes",
               f"{'recompute' if kind == 'recompute' else 'offload'} H_{l + 1} "
               f"to {_tiers_named(out)}", out)
        read_once.discard(l + 1)
        if kind == "forward" and l in a.kept:
            z = a.aggregations[l]
            charge(_write(w, profile, l, z, w.aggregated[l]), "writes",
                   f"offload Z_{l} to {_tiers_named(z)}", z)
        step = _step(w, profile, l, "forward")
    else:
        if l < w.num_layers - 1:
            g_up = a.gradients[l + 1]
            # G_{l+1} blocks written whole (by a node-wise layer) carry a checksum
            charge(_read_block(w, profile, l + 1, g_up, cache, verified=w.local(l + 1)),
                   "reads", f"reload G_{l + 1} from {_tiers_named(g_up)}", g_up)
        else:  # the top step's labels and loss weights load with its input
            link["to_device"] += int(np.sum(np.where(w.owned > 0, w.pad_out, 0))
                                     * w.label_row_bytes)
        if l >= 1:
            g = a.gradients[l]
            charge(_accumulate(w, profile, l, g), "writes",
                   f"accumulate G_{l} in {_tiers_named(g)}", g)
            mixed_calls += mixed_halo_call(w, l, g)
        # the layer above makes this layer's output masks only if it regathers
        step = _step(w, profile, l, backward_kind(w, l, l in a.kept), masked=l + 1 not in a.kept)
    machinery = sweep_machinery(w, profile, kind, l, ssd_calls, mixed_calls, l in a.kept)
    reader_own, writer_own = thread_own(w, profile, kind, l)
    return Sweep(label=f"{kind} {l}", layer=l, kind=kind, compute=step.total(),
                 moves=tuple(moves), partitions=tuple(order.tolist()),
                 part_compute=step.parts()[order], part_reads=parts["reads"][order],
                 part_writes=parts["writes"][order], **totals, **link,
                 machinery=float(machinery.sum()), reader_own=reader_own,
                 writer_own=writer_own)


# The whole-graph training steps `jgrind profile` times (`Profile.fused_steps`): a GCN with
# these widths on generated graphs of two sizes, dropout 0.5, adam update included.
FUSED_REFERENCE = {"features": 64, "hidden": 128, "classes": 8, "layers": 3, "dropout": 0.5}


def fused_model_seconds(layers, widths: Sequence[int], num_nodes: int, num_edges: int,
                        profile) -> float:
    """The sum of the per-operation prices (`layer_seconds`) of one whole-graph training step:
    forward and backward of every layer, no regathers, no recomputation beyond what autodiff
    saves. One jitted program fuses much of this (elementwise passes into the products, the
    transposed products into one backward), so it is calibrated by `fused_scale`."""
    total = 0.0
    n, e = np.array([float(num_nodes)]), np.array([float(num_edges)])
    for l, layer in enumerate(layers):
        shape = (layer, widths[l], widths[l + 1], n, n, e, profile)
        total += float(layer_seconds(*shape, input_passes=0.0)[0])
        # autodiff's backward: the transposed products, and its own elementwise traffic
        total += float(backward_seconds(*shape, input_grad=l > 0, masked=False,
                                        recompute=False, memory_passes=2.0 if l else 1.0,
                                        input_passes=0.0)[0])
    return total


def fused_scale(profile, activation_floats: float) -> float:
    """Measured over modelled seconds of the profile's reference whole-graph steps: how much
    faster (< 1) or slower one fused program runs than the sum of its operations priced one
    by one. It depends on size (small graphs stay in the caches and reuse heap pages; large
    ones fault fresh pages in every step), so it is interpolated between the reference steps
    in the log of the widest activation's floats (nodes x widest width), and held constant
    outside them. Computed from the measurements each time, so it follows the cost model."""
    ref = FUSED_REFERENCE
    model = gcn(ref["features"], ref["hidden"], ref["classes"], num_layers=ref["layers"],
                dropout=ref["dropout"])
    widths = (ref["features"],) + (ref["hidden"],) * (ref["layers"] - 1) + (ref["classes"],)
    points = sorted((np.log(nodes * max(widths)),
                     np.log(seconds / fused_model_seconds(model.layers, widths, nodes, edges,
                                                          profile)))
                    for nodes, edges, seconds in profile.fused_steps)
    xs, ys = zip(*points)
    return float(np.exp(np.interp(np.log(max(activation_floats, 1.0)), xs, ys)))


def in_memory_seconds(w: Workload, profile) -> float:
    """The fast path: the whole graph in one jitted step, priced as the sum of its operations
    scaled by the measured reference steps (`fused_scale`)."""
    modelled = fused_model_seconds(w.layers, w.widths, w.num_nodes, w.num_edges, profile)
    return modelled * fused_scale(profile, w.num_nodes * max(w.widths)) + profile.step_latency


def uniform(num_parts: int, num_layers: int, activation: Sequence[int],
            gradient: Sequence[int]) -> Assignment:
    """Every block of layer l gets ``activation[l]`` / ``gradient[l]`` (tier codes)."""
    return Assignment(
        tuple(np.full(num_parts, activation[l], np.int8) for l in range(num_layers)),
        tuple(np.full(num_parts, gradient[l] if l else D, np.int8) for l in range(num_layers)))


def in_memory_bytes(num_nodes: int, num_edges: int, num_features: int, widths: Sequence[int],
                    structure_bytes: Optional[int] = None, loss_bytes_per_node: int = 0) -> int:
    """Bytes the in-memory fast path holds at its peak, estimated from shapes: the graph
    structure (and its transpose), the features, and per layer the input activation, its
    gradient and about one more tensor of intermediates the backward pass keeps; plus the
    loss's bytes per node beyond the logits (`loss_row_bytes`)."""
    structure = structure_bytes if structure_bytes is not None else \
        2 * (ITEMSIZE * (num_nodes + 1) + 2 * ITEMSIZE * num_edges)
    activations = ITEMSIZE * num_nodes * sum(widths)
    return int(structure + ITEMSIZE * num_nodes * num_features + 3 * activations
               + num_nodes * loss_bytes_per_node)
