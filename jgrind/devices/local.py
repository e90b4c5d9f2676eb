"""What one process of several builds of `Sharded` from a saved graph: its own rows only.

With the graph in memory, every process normalises, partitions and plans the whole graph and
then builds its own devices' arrays (`jgrind.devices.layout.device_data`). From a saved folder
(`jgrind.datasets.saved_arrays.SavedArrays`) a process reads instead:

- ``indptr`` (``N + 1`` ints), the labels and masks (``N`` values each: evaluation scores
  every node, and the loss weights need the number of training nodes);
- the partition assignment: a saved one (``jgrind partition --out FILE.npy``), or
  `contiguous` ranges cut from ``indptr``; no partitioner that reads edges runs;
- of its devices' rows only: their in-edges (and edge weights) and their features.

Its rows are normalised as the whole graph would be (`jgrind.transforms.gcn_norm_rows` and
the other row-wise forms); GCN's symmetric weights need the degrees of the edges' sources,
which their owners count and every process gathers (``N`` float64). The exchange plan is
built from the readers' side: each process lists, from its own rows' in-edges, the rows it
needs from every owner, and `jax.experimental.multihost_utils.process_allgather` of those
lists (padded to the longest) tells every owner what to send. The result is the same
`ExchangePlan` as `jgrind.plan.exchange.exchange_plan` of the whole normalised graph.

The partitions are placed on devices (`jgrind.plan.placement.place_partitions`) by their
rows and in-edges, both known from ``indptr``: their halos would take every partition's
edges to count, so the placement counts none (with one partition per device, the default,
it only orders them).

The out-of-core engine over several processes (`jgrind.devices.ShardedOutOfCore`) takes the
same `SavedGraph`. With the same partitions (no edges read to cut them) a process places
them by rows and in-edges (`degree_placement`), reads the in-edges of its own partitions'
rows, normalised the same way (`normalized_rows`), and builds those partitions; of every
other partition it holds its owned nodes, its halo and its edge count, which the process
that runs it sends (`own_partitioned`: ``process_allgather`` of halo lists, not of edges), as
the plan, the host shares and the halo exchange need them. Of the features it reads only
its own partitions' rows and the halo rows they read (`FeatureRows`); with `auto` the
planner plans over these partitions and this placement. Only where the partition reads edges
(another partitioner) does it read the whole CSR structure (`saved_structure`: ``indptr``,
``indices``, edge weights).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Optional

import jax
import numpy as np

from jgrind import transforms
from jgrind.datasets.errors import DatasetError
from jgrind.datasets.saved_arrays import SavedArrays, load_assignment
from jgrind.devices.layout import DeviceShapes
from jgrind.graph import _CHECKED_FEATURES, Graph, freeze
from jgrind.partition.partitioned import Partition, PartitionedGraph, partition_graph
from jgrind.plan.exchange import ExchangePlan, device_rows
from jgrind.plan.placement import Placement, Rates, partition_costs, place_partitions

__all__ = ["FeatureRows", "LocalRows", "OtherPartition", "check_homogeneous",
           "degree_placement", "local_assignment", "local_layout", "normalized_rows",
           "own_partitioned", "saved_structure", "SUPPORTED_MODELS"]

# the models whose normalisation has a row-wise form here
SUPPORTED_MODELS = ("gcn", "sage", "gat")


def local_assignment(saved: SavedArrays, partitioner, num_parts: Optional[int],
                     default_parts: int) -> np.ndarray:
    """``[N]`` int32 partition of every node, without reading an edge: a saved assignment
    (`jgrind.datasets.saved_arrays.saved_assignment`) or `contiguous` ranges balanced by
    ``1 + in-degree`` (from ``indptr``: the saved graph's degrees, before normalisation)."""
    from jgrind.partition.partitioners import contiguous
    path = getattr(partitioner, "path", None)
    if path is not None:
        assignment = load_assignment(path, saved.num_nodes)
        parts = int(assignment.max(initial=-1)) + 1
        if num_parts is not None and int(num_parts) != parts:
            raise ValueError(f"the partition assignment {path} has {parts} partitions, not "
                             f"{num_parts}: set --parts {parts}, or leave it out")
        return assignment
    if getattr(partitioner, "__wrapped__", partitioner) is not contiguous:
        name = getattr(partitioner, "__name__", repr(partitioner))
        raise ValueError(f"partitioner {name}: a process that reads only its own rows cannot "
                         "run a partitioner that reads the whole graph; use contiguous, or a "
                         "saved assignment (`jgrind partition ... --out FILE.npy`, then "
                         "--partitioner FILE.npy)")
    degrees = _InDegrees(saved.num_nodes, np.diff(saved.indptr))
    return partitioner(degrees, int(default_parts if num_parts is None else num_parts))


@dataclasses.dataclass(frozen=True)
class _InDegrees:
    """What `contiguous` reads of a graph."""

    num_nodes: int
    degrees: np.ndarray

    def in_degree(self) -> np.ndarray:
        return self.degrees


@dataclasses.dataclass(frozen=True)
class _PartitionSize:
    """What `jgrind.plan.placement.partition_costs` reads of a partition."""

    num_owned: int
    num_halo: int
    num_edges: int


class _RowsOf:
    """An ``[N, ...]`` array of which only some rows are held: indexed by global ids."""

    def __init__(self, data: np.ndarray, rows: np.ndarray, num_nodes: int):
        self.data, self.shape, self.dtype = data, (num_nodes, *data.shape[1:]), data.dtype
        self._position = np.full(num_nodes, -1, np.int64)
        self._position[rows] = np.arange(rows.size)

    def __getitem__(self, rows):
        position = self._position[rows]
        if np.any(position < 0):
            raise IndexError("rows this process did not read")
        return self.data[position]


@dataclasses.dataclass(frozen=True)
class LocalRows:
    """The normalised graph as `jgrind.devices.layout.device_data` reads it, holding this
    process's rows only: ``indptr`` is ``[N + 1]`` with the other rows empty, ``indices`` and
    ``edge_weight`` this process's rows' normalised in-edges, ``features`` its rows."""

    indptr: np.ndarray
    indices: np.ndarray
    edge_weight: Optional[np.ndarray]
    features: _RowsOf
    labels: np.ndarray
    num_features: int
    edge_type: None = None
    num_relations: int = 1


def local_layout(saved: SavedArrays, model, devices: list, assignment: np.ndarray,
                 labels: np.ndarray, rates: Optional[Rates] = None):
    """``(placement, exchange plan, device shapes, LocalRows)`` of this process's devices
    (those of ``devices`` whose ``process_index`` is this process's); ``labels``: ``[N]``
    every node's (the `SavedGraph`'s)."""
    if model.name not in SUPPORTED_MODELS:
        raise ValueError(f"the {model.name} model: a process that reads only its own rows "
                         f"normalises them for {', '.join(SUPPORTED_MODELS)} only")
    n, k = saved.num_nodes, len(devices)
    me = jax.process_index()
    process_of = np.array([d.process_index for d in devices])
    mine = [d for d in range(k) if process_of[d] == me]
    if not mine:
        raise ValueError(f"process {me} drives none of the devices {devices}; every process "
                         "must hold some of the mesh")

    placement = degree_placement(saved, model, assignment, k, rates)
    device_of = placement.device_of[assignment].astype(np.int32)
    rows, local_index = device_rows(device_of, k)

    # this process's rows, their in-edges read and normalised
    my_rows = np.sort(np.concatenate([rows[d] for d in mine]))
    indptr, indices, weight = normalized_rows(saved, model, my_rows,
                                              _process_rows(rows, process_of))

    # the exchange plan: readers list what they need, owners learn it by a collective
    plan = _exchange_plan(device_of, rows, local_index, mine, my_rows, indptr, indices,
                          process_of)
    row_edges = np.diff(indptr)
    device_edges = np.zeros(k, np.int64)  # normalised in-edges per device, each its owner's
    for d in mine:
        device_edges[d] = int(row_edges[np.searchsorted(my_rows, rows[d])].sum())
    device_edges = _allgather(device_edges).sum(axis=0)
    shapes = DeviceShapes(rows=plan.max_rows + 1, slot_rows=plan.slot_rows,
                          edges=max(int(device_edges.max(initial=0)), 1), num_devices=k)

    global_indptr = np.zeros(n + 1, np.int64)
    per_node = np.zeros(n, np.int64)
    per_node[my_rows] = row_edges
    np.cumsum(per_node, out=global_indptr[1:])
    del per_node
    features = saved.node_rows("features", my_rows).astype(np.float32, copy=False)
    local = LocalRows(indptr=global_indptr, indices=indices.astype(np.int64, copy=False),
                      edge_weight=weight, features=_RowsOf(features, my_rows, n),
                      labels=labels, num_features=saved.num_features)
    return placement, plan, shapes, local


def check_homogeneous(saved: SavedArrays) -> None:
    """ValueError, in one line, for a saved graph with typed edges: a process reads only its
    own rows of homogeneous graphs."""
    if saved.has("edge_type"):
        raise ValueError(f"{saved.folder} has typed edges; a process that reads only its "
                         "own rows supports homogeneous graphs")


def degree_placement(saved: SavedArrays, model, assignment: np.ndarray, num_devices: int,
                     rates: Optional[Rates] = None) -> Placement:
    """The `Placement` of ``assignment``'s partitions on ``num_devices`` devices by their rows
    and in-edges, both known from ``indptr`` (normalised: +1 for a self loop where the model
    adds one); their halos would take every partition's edges to count, so it counts none."""
    in_degree = np.diff(saved.indptr)
    loops = 1 if model.name in ("gcn", "gat") else 0
    parts = int(assignment.max(initial=-1)) + 1
    owned = np.bincount(assignment, minlength=parts)
    edges = np.bincount(assignment, weights=in_degree, minlength=parts).astype(np.int64) \
        + loops * owned
    sizes = [_PartitionSize(int(o), 0, int(e)) for o, e in zip(owned, edges)]
    seconds, nbytes = partition_costs(_Partitions(sizes), model, saved.num_features, rates)
    return Placement(num_devices=int(num_devices),
                     device_of=place_partitions(seconds, nbytes, num_devices),
                     seconds=seconds, nbytes=nbytes)


def normalized_rows(saved: SavedArrays, model, my_rows: np.ndarray, every: list) -> tuple:
    """``(indptr [len(my_rows) + 1], indices, edge_weight or None)``: the saved in-edges of
    this process's rows ``my_rows`` (ascending), normalised as ``model.normalize`` normalises
    the whole graph (`jgrind.transforms`' row-wise forms). ``every``: each process's rows,
    ascending; GCN's symmetric weights need the degrees of the edges' sources, which their
    owners count and every process gathers (``N`` float64, a collective)."""
    n = saved.num_nodes
    check_homogeneous(saved)
    indptr, indices, weight, _ = saved.edges_of(my_rows)
    if model.name == "sage":
        indptr, indices, weight = transforms.rows_without_self_loops(
            my_rows, indptr, indices, weight, n)
        weight = transforms.mean_norm_rows(indptr, weight)
    elif model.name == "gat":
        indptr, indices, weight = transforms.rows_with_self_loops(
            my_rows, indptr, indices, None, num_nodes=n)
    else:
        indptr, indices, weight = transforms.rows_with_self_loops(
            my_rows, indptr, indices, weight, num_nodes=n)
        degree = _gather_rows(transforms.row_degrees(indptr, weight), my_rows, every, n)
        weight = transforms.gcn_norm_rows(my_rows, indptr, indices, weight, degree)
        del degree
    return indptr, indices, weight


@dataclasses.dataclass(frozen=True)
class _Partitions:
    partitions: list


def saved_structure(graph) -> Graph:
    """The `Graph` of `SavedGraph` ``graph``'s whole CSR structure (``indptr``, ``indices``,
    edge weights, read into memory) with its labels and masks, for the out-of-core engine
    over several processes where the partition reads edges (a partitioner that reads them):
    every process then cuts and places the same partitions. Its features are the
    `SavedGraph`'s untouched zero pages, never the values: the engine reads those through
    `FeatureRows`."""
    saved = graph.saved
    check_homogeneous(saved)
    token = _CHECKED_FEATURES.set(graph.features)  # zeros: nothing to scan
    try:
        return Graph(indptr=saved.indptr, indices=saved.whole("indices"),
                     features=graph.features, labels=graph.labels,
                     train_mask=graph.train_mask, val_mask=graph.val_mask,
                     test_mask=graph.test_mask, num_classes=graph.num_classes,
                     name=graph.name, edge_weight=saved.whole("edge_weight")
                     if saved.has("edge_weight") else None)
    finally:
        _CHECKED_FEATURES.reset(token)


class _OwnRowsGraph(Graph):
    """The normalised graph as one process of several holds it (`own_partitioned`): every
    node's labels and masks, the in-edges of its own partitions' rows only (the other rows
    empty), and ``num_edges`` the whole normalised graph's, which the plan prices."""

    @property
    def num_edges(self) -> int:
        return getattr(self, "whole_edges", int(self.indices.size))


@dataclasses.dataclass(frozen=True, eq=False)
class OtherPartition(Partition):
    """A partition another process runs, as this one knows it: its owned nodes (from the
    assignment) and its halo (from its owner, `own_partitioned`), with no local CSR;
    ``num_edges`` is its owner's count of its normalised in-edges. Everything the plan, the
    placement and the halo exchange read of a partition that is not run here."""

    edge_count: int = 0

    @property
    def num_edges(self) -> int:
        return self.edge_count


def own_partitioned(graph, model, assignment: np.ndarray,
                    process_of_part: np.ndarray) -> PartitionedGraph:
    """The `PartitionedGraph` of `SavedGraph` ``graph``'s normalised graph cut by
    ``assignment``, as one process of several builds it for the out-of-core engine
    (`jgrind.devices.ShardedOutOfCore`) reading only its own rows: the partitions it runs
    (``process_of_part``, ``[P]``) built from their rows' in-edges (`normalized_rows`), and
    every other partition an `OtherPartition`, its halo and edge count sent by the process
    that runs it (`jax.experimental.multihost_utils.process_allgather`). Never reads another
    process's rows' edges; every process ends with the same halos, sizes and plan inputs as
    `jgrind.partition.partition_graph` of the whole normalised graph gives."""
    saved = graph.saved
    n = saved.num_nodes
    parts = int(process_of_part.size)
    me = jax.process_index()
    count = max(int(process_of_part.max(initial=0)) + 1, jax.process_count())
    process_of_node = np.asarray(process_of_part, np.int64)[assignment]
    every = [np.flatnonzero(process_of_node == q) for q in range(count)]
    my_rows = every[me]
    indptr, indices, weight = normalized_rows(saved, model, my_rows, every)
    per_node = np.zeros(n, np.int64)
    per_node[my_rows] = np.diff(indptr)
    whole_indptr = np.zeros(n + 1, np.int64)
    np.cumsum(per_node, out=whole_indptr[1:])
    del per_node
    whole_edges = int(_allgather(np.array([indices.size], np.int64)).sum())
    token = _CHECKED_FEATURES.set(graph.features)  # zeros: nothing to scan
    try:
        structure = _OwnRowsGraph(
            indptr=whole_indptr, indices=indices, features=graph.features,
            labels=graph.labels, train_mask=graph.train_mask, val_mask=graph.val_mask,
            test_mask=graph.test_mask, num_classes=graph.num_classes, name=graph.name,
            edge_weight=weight)
    finally:
        _CHECKED_FEATURES.reset(token)
    object.__setattr__(structure, "whole_edges", whole_edges)
    del indptr, indices, weight
    # the other processes' partitions are empty here (their rows hold no edges)
    local = partition_graph(structure, assignment, num_parts=parts)
    own = np.asarray(process_of_part) == me
    # every partition's halo (owner, row in owner) and edge count, from the process running it
    halo_sizes = np.array([p.num_halo if own[p.index] else 0 for p in local], np.int64)
    edges = np.array([p.num_edges if own[p.index] else 0 for p in local], np.int64)
    mine = [np.stack([np.asarray(p.halo_owner, np.int64), np.asarray(p.halo_row, np.int64)])
            for p in local if own[p.index]]
    halo_sizes, edges = _allgather(np.stack([halo_sizes, edges])).sum(axis=0)
    lengths = [int(halo_sizes[np.asarray(process_of_part) == q].sum()) for q in range(count)]
    width = max(lengths, default=0)
    padded = np.zeros((2, width), np.int64)
    flat = np.concatenate(mine + [np.zeros((2, 0), np.int64)], axis=1)
    padded[:, :flat.shape[1]] = flat
    gathered = _allgather(padded)  # [processes, 2, width]
    order = local.order
    partitions = list(local.partitions)
    for q in range(count):
        if q == me:
            continue
        at = 0
        for p in np.flatnonzero(np.asarray(process_of_part) == q):
            size = int(halo_sizes[p])
            owner = gathered[q, 0, at:at + size].astype(np.int32)
            row = gathered[q, 1, at:at + size].astype(np.int32)
            at += size
            stub = local.partitions[p]
            partitions[p] = OtherPartition(
                index=int(p), owned=stub.owned,
                halo=freeze(order[local.offsets[owner] + row]), halo_owner=freeze(owner),
                halo_row=freeze(row), indptr=stub.indptr, indices=stub.indices,
                weight=stub.weight, edge_count=int(edges[p]))
    return dataclasses.replace(local, partitions=tuple(partitions))


class FeatureRows:
    """``rows -> [len(rows), F]`` float32: the features of nodes ``rows`` (ascending global
    ids) read from `SavedArrays` ``saved`` (`SavedArrays.node_rows`: the file memory-mapped
    for the read, its other rows never touched), checked finite as loading the whole graph
    checks them. ``saved.read["features"]`` counts the rows read."""

    def __init__(self, saved: SavedArrays):
        self.saved = saved

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        values = self.saved.node_rows("features", rows).astype(np.float32, copy=False)
        finite = np.isfinite(values).all(axis=1)
        if not finite.all():
            bad = rows[~finite]
            raise DatasetError(f"{self.saved.folder / 'features.npy'}: features contain NaN "
                               f"or inf in {bad.size} of the rows read (first: node "
                               f"{int(bad[0])}); impute or drop them and save the graph again")
        return values


def _allgather(a: np.ndarray) -> np.ndarray:
    """``[P, ...]``: every process's ``a`` (a JAX collective; ``a`` itself in one process)."""
    if jax.process_count() == 1:
        return np.asarray(a)[None]
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(np.asarray(a)))


def _process_rows(rows: tuple, process_of: np.ndarray) -> list:
    """Every process's rows (of its devices), ascending."""
    count = max(int(process_of.max(initial=0)) + 1, jax.process_count())
    return [np.sort(np.concatenate([rows[d] for d in np.flatnonzero(process_of == p)]
                                   or [np.zeros(0, np.int64)])) for p in range(count)]


def _gather_rows(values: np.ndarray, my_rows: np.ndarray, every: list,
                 n: int) -> np.ndarray:
    """``[N]``: every process's ``values`` of its own rows (ascending; ``every``: each
    process's rows), put in node order."""
    width = max((r.size for r in every), default=0)
    padded = np.zeros(width, values.dtype)
    padded[:my_rows.size] = values
    gathered = _allgather(padded)
    out = np.zeros(n, values.dtype)
    for p, r in enumerate(every):
        out[r] = gathered[p, :r.size]
    return out


def _exchange_plan(device_of, rows, local_index, mine, my_rows, indptr, indices,
                   process_of) -> ExchangePlan:
    k = len(rows)
    needs = {}  # (owner, reader) -> the owner's local rows the reader needs
    counts = np.zeros((k, k), np.int64)
    for r in mine:
        at = np.searchsorted(my_rows, rows[r])
        starts, ends = indptr[at], indptr[at + 1]
        deg = ends - starts
        edge = np.repeat(starts - np.cumsum(deg) + deg, deg) + np.arange(int(deg.sum()))
        src = indices[edge]
        owner = device_of[src]
        for o in range(k):
            if o != r:
                needs[o, r] = np.unique(local_index[src[owner == o]])
                counts[o, r] = needs[o, r].size
    counts = _allgather(counts).sum(axis=0)
    slots = int(counts.max(initial=0))
    lists = np.zeros((k, k, slots), np.int32 if local_index.size < 2**31 else np.int64)
    for (o, r), needed in needs.items():
        lists[o, r, :needed.size] = needed
    gathered = _allgather(lists)  # [P, owner, reader, slots]: readers' own columns filled
    sends = tuple(tuple(gathered[process_of[r], o, r, :counts[o, r]].astype(np.int64)
                        if o != r else np.zeros(0, np.int64) for r in range(k))
                  for o in range(k))
    return ExchangePlan(num_devices=k, device_of=device_of, rows=rows, local_index=local_index,
                        sends=sends, counts=counts)


def fingerprint(saved: SavedArrays, assignment: np.ndarray) -> str:
    """What every process must agree on: the saved graph's description (its ``graph.json``)
    and the assignment."""
    digest = hashlib.sha256(np.ascontiguousarray(assignment).tobytes()).hexdigest()
    return f"{sorted(saved.meta.items())!r}\n{digest}"


def local_graph(cfg):
    """The `SavedGraph` of ``cfg``'s dataset when this run's processes each read only their
    own rows, else None (the whole graph is loaded, as with one process). That path is taken
    when this process is one of several (`jgrind.devices.processes.start`) training on
    devices, the dataset is a saved folder (``npy:FOLDER``) and the partition needs no edges
    (``contiguous``, or a saved assignment ``FILE.npy``); not with ``check_in_memory`` or
    ``row_normalize`` (both read the whole graph), a device budget without a policy (the
    choice of executor reads every edge) or a model other than gcn, sage or gat. With a
    policy (out of core, `jgrind.devices.ShardedOutOfCore`) a process reads the in-edges of
    its own partitions' rows (with ``--policy auto`` too: it plans over those partitions, at
    the count ``--parts`` or the assignment gives) and, of the features, its partitions' rows
    and their halo rows. Prints which path it took."""
    from jgrind.datasets.saved_arrays import SavedGraph
    from jgrind.devices import processes
    joined = processes.current()
    if joined is None or joined.num_processes < 2 or not cfg.devices:
        return None
    prefix, _, folder = cfg.dataset.partition(":")
    missing = [why for why, wrong in (
        ("--dataset npy:FOLDER (a saved graph)", prefix.lower() != "npy" or not folder),
        ("--partitioner contiguous or a saved assignment FILE.npy",
         cfg.partitioner != "contiguous" and not cfg.partitioner.endswith(".npy")),
        (f"a {', '.join(SUPPORTED_MODELS)} model", cfg.model not in SUPPORTED_MODELS),
        ("no check_in_memory", cfg.check_in_memory),
        ("no row_normalize", cfg.row_normalize),
        # a device budget alone: `jgrind.devices.choose` weighs the two executors on the
        # whole graph's edges
        ("a --policy beside --device-budget", cfg.device_budget and not (
            cfg.policy not in ("", "in_memory") or cfg.store or cfg.host_budget))) if wrong]
    if missing:
        print(f"jgrind: every process loads the whole graph (each would read only its own "
              f"rows with {'; '.join(missing)})", flush=True)
        return None
    print(f"jgrind: process {joined.process_id} reads only its own rows of {folder} "
          f"(partitions: {cfg.partitioner})", flush=True)
    return SavedGraph.open(folder)
