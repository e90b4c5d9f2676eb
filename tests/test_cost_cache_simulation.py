"""The cost model's simulation of the host cache in front of the SSD tier
(`jgrind.plan.cost.halo_cache_reads`) gives, partition by partition, the same loads, hits and
spans as the straightforward owner-by-owner simulation of the engine's rule kept here
(`reference_halo_cache_reads`, the model's implementation before it was vectorised), on random
workloads and capacities from none to everything."""

from typing import Optional

import numpy as np
import pytest

from jgrind.plan import cost
from jgrind.plan.cost import Workload

WORDS = 16


def reference_halo_cache_reads(w: Workload, words: int, in_ssd: np.ndarray, row_bytes: int,
                               capacity: int, events: Optional[dict] = None) -> tuple:
    """The engine's cache (`jgrind.engine.tiers.cached_ssd`), owner by owner: a gather pins
    the blocks of its route that the cache holds and takes its owners in index order, each
    from the cache, else loaded whole while the pinned blocks leave room (evicting the least
    recently used others), else read as spans. ``events``: counts "evicted" blocks, if given."""
    events = {} if events is None else events
    block = w.owned * row_bytes
    calls_of, rows_of = w.ssd_calls[words], w.ssd_rows[words]
    P = w.num_parts
    loads, loaded = np.zeros(P), np.zeros(P)
    calls, span = np.zeros(P), np.zeros(P)
    taken, missed = np.zeros(P), np.zeros(P)
    size = [int(b) for b in block]
    cached: dict = {}  # block -> None, least recently used first
    held = 0  # bytes of the cached blocks
    for p in range(P):
        if w.owned[p] == 0:
            continue
        owners = [int(q) for q in np.flatnonzero((w.halo[p] > 0) & in_ssd) if q != p]
        route = set(owners) | ({p} if in_ssd[p] else set())
        pinned = sum(size[q] for q in route if q in cached)

        def use(q: int) -> str:
            nonlocal held, pinned
            if q in cached:
                cached[q] = cached.pop(q)  # used: most recent
                return "hit"
            if pinned + size[q] > capacity:
                return "spans"
            while held + size[q] > capacity:  # evict the least recently used unpinned
                old = next(b for b in cached if b not in route)
                held -= size[old]
                del cached[old]
                events["evicted"] = events.get("evicted", 0) + 1
            cached[q] = None
            held += size[q]
            pinned += size[q]
            return "loaded"

        if in_ssd[p]:
            use(p)
        spanned = []
        for q in owners:
            served = use(q)
            if served == "loaded":
                loads[p] += size[q]
                loaded[p] += 1
            elif served == "spans":
                spanned.append(q)
        calls[p] = calls_of[p, spanned].sum()
        span[p] = rows_of[p, spanned].sum() * row_bytes
        taken[p], missed[p] = len(owners) - len(spanned), len(spanned)
    return loads, loaded, calls, span, taken, missed


def random_workload(rng, num_parts: int, density: float) -> Workload:
    """A workload of ``num_parts`` partitions of uneven sizes (some empty), each with halo
    rows from a random ``density`` of the others."""
    owned = rng.integers(1, 60, num_parts)
    owned[rng.random(num_parts) < 0.1] = 0  # inactive partitions own nothing
    halo = np.where(rng.random((num_parts, num_parts)) < density,
                    rng.integers(1, 30, (num_parts, num_parts)), 0)
    halo[:, owned == 0] = 0  # no rows come from an empty block
    np.fill_diagonal(halo, 0)
    calls = np.where(halo > 0, rng.integers(1, 4, halo.shape), 0).astype(np.int32)
    span_rows = halo + np.where(halo > 0, rng.integers(0, 20, halo.shape), 0)
    one = np.ones(num_parts, np.int64)
    return Workload(widths=(WORDS, WORDS), layers=(None,), owned=owned.astype(np.int64),
                    inputs=owned + halo.sum(1), edges=one, pad_out=owned, pad_in=one,
                    pad_edges=one, halo=halo.astype(np.int64), ssd_calls={WORDS: calls},
                    ssd_rows={WORDS: span_rows.astype(np.int64)}, needs_edges=False,
                    needs_adjacency=True, num_nodes=int(owned.sum()),
                    num_edges=int(halo.sum()))


def capacities(w: Workload, in_ssd: np.ndarray, row_bytes: int) -> list[int]:
    """None, less than any block, one or a few blocks, part of the layer, all of it but a
    byte, all of it, more."""
    sizes = np.sort(w.owned[in_ssd & (w.owned > 0)] * row_bytes)
    if sizes.size == 0:
        return [0, 1 << 20]
    total = int(sizes.sum())
    return [0, int(sizes[0]) - 1, int(sizes[-1]), int(sizes[-3:].sum()), total // 4,
            total // 2, total - 1, total, 2 * total]


def assert_same(w: Workload, in_ssd: np.ndarray, row_bytes: int, capacity: int,
                events: Optional[dict] = None) -> tuple:
    got = cost._halo_cache_reads.__wrapped__(w, WORDS, in_ssd.tobytes(), row_bytes, capacity)
    want = reference_halo_cache_reads(w, WORDS, in_ssd, row_bytes, capacity, events)
    names = ("loaded bytes", "blocks loaded", "span calls", "span bytes", "taken", "missed")
    for name, a, b in zip(names, got, want):
        assert np.array_equal(a, b), (name, capacity, np.flatnonzero(a != b)[:5])
    return want


@pytest.mark.parametrize("seed", range(6))
def test_fast_simulation_is_the_reference(seed):
    """Every partition's loads, hits and spans, exactly, for every capacity; and the
    capacities in between do load, evict and span (so a simulation that skipped any of them
    would differ)."""
    rng = np.random.default_rng(seed)
    w = random_workload(rng, num_parts=[7, 40, 90][seed % 3], density=[0.2, 0.5, 0.9][seed % 3])
    row_bytes = 4 * WORDS
    seen = {"loads": 0, "spans": 0, "evictions": 0}
    for share in (0.3, 0.7, 1.0):
        in_ssd = rng.random(w.num_parts) < share
        for capacity in capacities(w, in_ssd, row_bytes):
            events = {}
            loads, loaded, _, span, taken, missed = assert_same(w, in_ssd, row_bytes, capacity,
                                                                events)
            seen["loads"] += loaded.sum() > 0
            seen["spans"] += missed.sum() > 0 and taken.sum() > 0
            seen["evictions"] += events.get("evicted", 0) > 0
    assert all(seen.values()), seen


def test_edge_capacities():
    """No room for any block: every owner is read as spans; room for every block: each is
    loaded once, on first use, and never spanned."""
    rng = np.random.default_rng(11)
    w = random_workload(rng, num_parts=30, density=0.6)
    in_ssd = rng.random(w.num_parts) < 0.8
    row_bytes = 4 * WORDS
    small = int((w.owned[in_ssd & (w.owned > 0)] * row_bytes).min()) - 1
    loads, loaded, calls, span, taken, missed = assert_same(w, in_ssd, row_bytes, small)
    assert loads.sum() == 0 and taken.sum() == 0 and missed.sum() > 0
    owners = (w.halo > 0) & in_ssd
    assert np.array_equal(calls, np.where(owners, w.ssd_calls[WORDS], 0).sum(1)
                          * (w.owned > 0))
    total = int((w.owned[in_ssd] * row_bytes).sum())
    loads, loaded, calls, span, taken, missed = assert_same(w, in_ssd, row_bytes, total)
    assert missed.sum() == 0 and calls.sum() == 0
    assert loaded.sum() == np.count_nonzero(_first_used_by_others(w, in_ssd))


def _first_used_by_others(w: Workload, in_ssd: np.ndarray) -> np.ndarray:
    """``[P]`` whether block q's first use in a sweep is as another partition's halo owner
    (not as the partition's own block): the blocks an ample cache loads for halos."""
    first = {}
    for p in np.flatnonzero(w.owned > 0):
        if in_ssd[p]:
            first.setdefault(int(p), "own")
        for q in np.flatnonzero((w.halo[p] > 0) & in_ssd):
            first.setdefault(int(q), "halo")
    return np.array([first.get(q) == "halo" for q in range(w.num_parts)])


def test_on_a_built_workload():
    """The same on a partitioned graph's workload (`Workload.build`), at its stored widths."""
    from helpers import community_graph
    from jgrind import models
    from jgrind.partition import partition_graph
    graph = community_graph(num_nodes=3000, num_features=16)
    model = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=2)
    parts = 24
    pg = partition_graph(model.normalize(graph), np.arange(graph.num_nodes) % parts,
                         num_parts=parts)
    w = Workload.build(pg, model)
    rng = np.random.default_rng(3)
    for _ in range(3):
        in_ssd = rng.random(parts) < 0.6
        for capacity in capacities(w, in_ssd, 4 * WORDS):
            assert_same(w, in_ssd, 4 * WORDS, capacity)


def reference_halo_spans(parts, P: int, gaps) -> tuple:
    """`Workload.build`'s halo and span tables, partition by partition (its loop before it was
    vectorised)."""
    halo = np.zeros((P, P), np.int64)
    calls = {g: np.zeros((P, P), np.int32) for g in gaps}
    span_rows = {g: np.zeros((P, P), np.int64) for g in gaps}
    for part in parts:
        owner = np.asarray(part.halo_owner, np.int64)
        if owner.size == 0:
            continue
        row = np.asarray(part.halo_row, np.int64)
        halo[part.index] = np.bincount(owner, minlength=P)
        order = np.lexsort((row, owner))
        o, r = owner[order], row[order]
        for g in gaps:
            starts = np.ones(o.size, bool)
            starts[1:] = (o[1:] != o[:-1]) | (r[1:] - r[:-1] > g + 1)
            first = np.flatnonzero(starts)
            last = np.append(first[1:], o.size) - 1
            calls[g][part.index] = np.bincount(o[first], minlength=P)
            span_rows[g][part.index] = np.bincount(o[first], r[last] - r[first] + 1,
                                                   minlength=P).astype(np.int64)
    return halo, calls, span_rows


@pytest.mark.parametrize("shuffled", [False, True])
def test_halo_spans_are_the_per_partition_counts(shuffled):
    """`Workload.build`'s halo rows, span calls and span rows, worked out for all partitions
    at once, are the per-partition loop's, exactly; also for halos not in (owner, row) order
    and for partitions with no halo."""
    import types
    rng = np.random.default_rng(5)
    P, gaps = 12, (0, 1, 3, 40)
    parts = []
    for p in rng.permutation(P):
        n = 0 if p % 5 == 0 else int(rng.integers(1, 300))
        owner = rng.choice([q for q in range(P) if q != p], n)
        row = rng.choice(500, n, replace=False)  # unique rows: (owner, row) pairs unique
        order = rng.permutation(n) if shuffled else np.lexsort((row, owner))
        parts.append(types.SimpleNamespace(index=int(p), num_owned=500,
                                           halo_owner=owner[order].astype(np.int32),
                                           halo_row=row[order].astype(np.int32)))
    got, want = cost._halo_spans(parts, P, gaps), reference_halo_spans(parts, P, gaps)
    assert np.array_equal(got[0], want[0]) and got[0].dtype == want[0].dtype
    for g in gaps:
        for table in (1, 2):
            assert np.array_equal(got[table][g], want[table][g]), (table, g)
            assert got[table][g].dtype == want[table][g].dtype
    assert not np.array_equal(want[1][0], want[1][40])  # the gaps make different spans
