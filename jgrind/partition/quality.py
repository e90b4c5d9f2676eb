"""How good a partitioning is, and what it cost: edge cut, balance, halo sizes, time, memory.

`quality` summarises a `PartitionedGraph`; `measure` runs a partitioner and records its wall
time and peak memory. ``jgrind partition`` prints ``quality(pg, measurement).format()``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Callable, Optional, Union

import numpy as np

from jgrind.graph import Graph
from jgrind.partition.partitioned import PartitionedGraph

__all__ = ["PartitionQuality", "Measurement", "quality", "measure"]


@dataclasses.dataclass(frozen=True)
class Measurement:
    """A partitioner run: its output, wall time, and peak memory above the starting RSS.

    ``peak_memory_method`` says how the peak was taken: ``"VmHWM"`` (Linux: the kernel's
    resident-set high-water mark, reset before the run through ``/proc/self/clear_refs``; exact,
    includes memory allocated by C/C++ code such as scipy or METIS) or ``"rss-sampling"``
    (psutil polling the RSS every few milliseconds from a thread; can miss short spikes).
    Freed heap memory is handed back to the OS (glibc ``malloc_trim``) before the run, so
    reused allocations count; memory the allocator still keeps can make the figure an
    underestimate.
    """

    assignment: np.ndarray
    partitioner: str
    seconds: float
    peak_memory_bytes: int
    peak_memory_method: str


def _status_kib(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _release_free_heap() -> None:
    """Hand freed heap memory back to the OS (glibc ``malloc_trim``), so that a later
    allocation reusing it shows in the RSS again. Best effort: a no-op elsewhere."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS counter of this process (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kib("VmHWM") is not None
    except OSError:
        return False


class _RssSampler:
    def __init__(self, interval: float = 0.002):
        import psutil
        self._proc = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def measure(partitioner: Union[str, Callable[..., np.ndarray]], graph: Graph, num_parts: int,
            **kwargs) -> Measurement:
    """Run ``partitioner(graph, num_parts, **kwargs)`` (a callable or a name in
    `PARTITIONERS`) and record its wall time and peak memory above the RSS at the start.

    Peak memory is the process RSS high-water mark (``VmHWM``, reset just before the run) on
    Linux, else the peak of psutil RSS samples; see `Measurement`. It is process-wide, so run
    one measurement at a time.
    """
    from jgrind.partition.partitioners import PARTITIONERS
    if isinstance(partitioner, str):
        if partitioner not in PARTITIONERS:
            raise ValueError(f"unknown partitioner {partitioner!r}; choose one of "
                             f"{sorted(PARTITIONERS)}")
        name, fn = partitioner, PARTITIONERS[partitioner]
    else:
        fn = partitioner
        name = getattr(fn, "__name__", repr(fn))
    import gc
    gc.collect()
    _release_free_heap()
    if os.name == "posix" and _reset_hwm():
        base = _status_kib("VmRSS")
        t0 = time.perf_counter()
        out = fn(graph, num_parts, **kwargs)
        seconds = time.perf_counter() - t0
        peak, method = _status_kib("VmHWM"), "VmHWM"
    else:
        with _RssSampler() as sampler:
            base = sampler.peak
            t0 = time.perf_counter()
            out = fn(graph, num_parts, **kwargs)
            seconds = time.perf_counter() - t0
        peak, method = sampler.peak, "rss-sampling"
    return Measurement(assignment=np.asarray(out), partitioner=name, seconds=seconds,
                       peak_memory_bytes=max(0, int(peak) - int(base)),
                       peak_memory_method=method)


@dataclasses.dataclass(frozen=True)
class PartitionQuality:
    """Summary of a partitioning (see `quality`).

    Edge counts are over the graph's directed CSR entries (an undirected edge stored in both
    directions counts twice, so fractions are unaffected); an edge is *cut* when its two
    endpoints lie in different partitions, which is exactly an entry of a partition's local CSR
    that reads a halo column. Halo/owned ratios are over non-empty partitions.
    """

    graph_name: str
    num_parts: int
    num_nodes: int
    num_edges: int
    edge_cut: int
    edge_cut_fraction: float
    owned_min: int
    owned_mean: float
    owned_max: int
    imbalance: float            # owned_max / owned_mean
    empty_parts: int
    edges_min: int              # local CSR entries per partition
    edges_max: int
    edge_imbalance: float       # edges_max / mean edges per partition
    halo_ratio_mean: float      # mean over partitions of n_halo / n_own
    halo_ratio_max: float
    total_halo: int             # sum of n_halo: rows a regather reads from other partitions
    halo_replication: float     # total_halo / N
    num_shapes: int             # distinct padded (n_out, n_in, nnz) bucket triples
    partitioner: Optional[str] = None
    seconds: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    peak_memory_method: Optional[str] = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def format(self) -> str:
        """A readable multi-line report."""
        lines = [
            f"partitioning of {self.graph_name}: {self.num_nodes:,} nodes, "
            f"{self.num_edges:,} edges, {self.num_parts} partitions"
            + (f" ({self.partitioner})" if self.partitioner else ""),
            f"  edge cut        {self.edge_cut:,} edges ({100 * self.edge_cut_fraction:.2f}%)",
            f"  owned nodes     min {self.owned_min:,} / mean {self.owned_mean:,.1f} / max "
            f"{self.owned_max:,}  (imbalance {self.imbalance:.3f}"
            + (f", {self.empty_parts} empty" if self.empty_parts else "") + ")",
            f"  local edges     min {self.edges_min:,} / max {self.edges_max:,}  "
            f"(imbalance {self.edge_imbalance:.3f})",
            f"  halo / owned    mean {self.halo_ratio_mean:.3f} / max {self.halo_ratio_max:.3f}",
            f"  halo rows       {self.total_halo:,} in all ({self.halo_replication:.3f} per node)",
            f"  padded shapes   {self.num_shapes} distinct",
        ]
        if self.seconds is not None:
            lines.append(f"  time            {self.seconds:.3f} s")
        if self.peak_memory_bytes is not None:
            how = f" ({self.peak_memory_method})" if self.peak_memory_method else ""
            lines.append(f"  peak memory     {self.peak_memory_bytes / 2**20:,.1f} MiB above "
                         f"start{how}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def quality(pg: PartitionedGraph, measurement: Optional[Measurement] = None, *,
            seconds: Optional[float] = None, peak_memory_bytes: Optional[int] = None,
            partitioner: Optional[str] = None) -> PartitionQuality:
    """Summarise ``pg``; time and memory come from ``measurement`` (see `measure`) or the
    keyword arguments. O(P) beyond one pass over the partitions' CSR indices."""
    parts = pg.partitions
    owned = np.array([p.num_owned for p in parts], np.int64)
    halo = np.array([p.num_halo for p in parts], np.int64)
    edges = np.array([p.num_edges for p in parts], np.int64)
    cut = int(sum(int(np.count_nonzero(p.indices >= p.num_owned)) for p in parts))
    n_edges = pg.graph.num_edges
    nonempty = owned > 0
    ratio = halo[nonempty] / owned[nonempty]
    method = None
    if measurement is not None:
        seconds = measurement.seconds if seconds is None else seconds
        peak_memory_bytes = (measurement.peak_memory_bytes if peak_memory_bytes is None
                             else peak_memory_bytes)
        partitioner = measurement.partitioner if partitioner is None else partitioner
        method = measurement.peak_memory_method
    mean_edges = edges.mean()
    return PartitionQuality(
        graph_name=pg.graph.name, num_parts=pg.num_parts, num_nodes=pg.num_nodes,
        num_edges=n_edges, edge_cut=cut, edge_cut_fraction=cut / n_edges if n_edges else 0.0,
        owned_min=int(owned.min()), owned_mean=float(owned.mean()), owned_max=int(owned.max()),
        imbalance=float(owned.max() / owned.mean()), empty_parts=int((~nonempty).sum()),
        edges_min=int(edges.min()), edges_max=int(edges.max()),
        edge_imbalance=float(edges.max() / mean_edges) if mean_edges > 0 else 1.0,
        halo_ratio_mean=float(ratio.mean()) if ratio.size else 0.0,
        halo_ratio_max=float(ratio.max()) if ratio.size else 0.0,
        total_halo=int(halo.sum()), halo_replication=float(halo.sum() / pg.num_nodes),
        num_shapes=len(set(pg.shape_groups().values())), partitioner=partitioner, seconds=seconds,
        peak_memory_bytes=peak_memory_bytes, peak_memory_method=method)
