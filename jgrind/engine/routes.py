"""Where every row of a partition's gathered input comes from, and where its gradient goes.

A partition's gather reads its own block of ``H_l`` and its halo rows, each from the tier of
the row's owner block; its scatter-add writes the same rows of ``G_l`` back. Which tier, and
which row of that tier's array or file, depends only on the table's *layout* (the tier of
every block) and on the partition, and both stay fixed for a run: every layer whose blocks
share their fates shares one layout, and a gradient table is laid out the same way every
epoch. So the store works the routes out once per (layout, partition) and keeps them
(`RouteCache`), instead of recomputing them from the halo on every call: that bookkeeping
(selecting rows by tier, computing source rows, sorting file rows) cost more than moving the
rows themselves when rows are narrow (~100 ns per 8-float row, against ~5 for the copy).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

# the tier codes of `jgrind.plan.fates` that hold rows, by the names of their tiers
from jgrind.plan.fates import D as DEVICE, S as SSD


@dataclasses.dataclass(frozen=True)
class Layout:
    """A table's block placement: ``tier[b]``, the tier code of every block, and ``slot[b]``,
    its first row among that tier's rows (the tier holds its blocks in table order: an array's
    rows, or an SSD file's)."""

    tier: np.ndarray
    slot: np.ndarray

    @property
    def key(self) -> bytes:
        return self.tier.tobytes()


@dataclasses.dataclass(frozen=True)
class TierRows:
    """One tier's share of a partition's halo rows.

    ``dst``: positions in the gathered input (or in the input gradient); ``src``: the tier's
    rows (SSD: rows of the file, ascending); ``segments``: ``(start, stop, owner)`` runs of one
    owner block; ``own``: how many leading rows are the partition's own block, contiguous from
    ``src[0]`` (a scatter-add's route in the block's tier, SSD's sorted rows aside; else 0).
    8 bytes per row (int32 indices where they fit), as much as the partition's own halo
    arrays, per distinct layout."""

    code: int
    dst: np.ndarray
    src: np.ndarray
    segments: tuple
    own: int = 0

    @property
    def size(self) -> int:
        return int(self.dst.size)


@dataclasses.dataclass(frozen=True)
class Route:
    """A partition's own block and its halo rows grouped by tier, for one table layout."""

    block: int
    own_code: int
    own_start: int
    own_rows: int
    halo: tuple               # TierRows per tier that holds halo rows, in tier order
    #                           (with_own: the own rows too, first within their tier)
    blocks: tuple             # (code, blocks) per tier read: own block and halo owners, sorted
    only_code: Optional[int]  # the one tier holding every row, or None
    halo_owner: np.ndarray    # the arrays the route was made from (identity checked)

    def tier(self, code: int) -> Optional[TierRows]:
        for t in self.halo:
            if t.code == code:
                return t
        return None

    def blocks_in(self, code: int) -> tuple:
        """The blocks of tier ``code`` this route reads (the tier may hold them at hand)."""
        for c, blocks in self.blocks:
            if c == code:
                return blocks
        return ()

    @property
    def ssd_blocks(self) -> tuple:
        return self.blocks_in(SSD)

    @property
    def all_device(self) -> bool:
        return self.only_code == DEVICE


def make_route(layout: Layout, block: int, own_rows: int, halo_owner: np.ndarray,
               halo_row: np.ndarray, with_own: bool = False) -> Route:
    """The route of ``block``'s halo rows (gathers: the own block is read whole), or with
    ``with_own`` of its own rows and halo rows together, at positions ``0 .. own_rows +
    halo - 1`` (scatter-adds: a tier's rows go in one call)."""
    owners = np.asarray(halo_owner, np.int64)
    rows = np.asarray(halo_row, np.int64)
    first = own_rows
    if with_own:
        owners = np.concatenate([np.full(own_rows, block, np.int64), owners])
        rows = np.concatenate([np.arange(own_rows, dtype=np.int64), rows])
        first = 0
    codes = layout.tier[owners]
    own_code = int(layout.tier[block])
    halo = []
    for code in np.unique(codes):
        sel = np.flatnonzero(codes == code)
        o, r = owners[sel], rows[sel]
        src = layout.slot[o] + r
        own = own_rows if with_own and code == own_code else 0
        if code == SSD:
            order = np.argsort(src, kind="stable")  # spans of the file want ascending rows
            sel, o, r, src = sel[order], o[order], r[order], src[order]
            own = 0
        cuts = np.flatnonzero(np.diff(o)) + 1
        starts = np.concatenate([[0], cuts])
        stops = np.concatenate([cuts, [o.size]])
        segments = tuple((int(a), int(b), int(o[a])) for a, b in zip(starts, stops))
        halo.append(TierRows(int(code), _compact(first + sel), _compact(src), segments, own))
    read = {}  # tier code -> blocks read
    for b in np.unique(owners):
        read.setdefault(int(layout.tier[b]), set()).add(int(b))
    read.setdefault(own_code, set()).add(int(block))
    codes_read = {own_code} | {t.code for t in halo}
    return Route(block=int(block), own_code=own_code, own_start=int(layout.slot[block]),
                 own_rows=int(own_rows), halo=tuple(halo),
                 blocks=tuple((c, tuple(sorted(read[c]))) for c in sorted(read)),
                 only_code=own_code if len(codes_read) == 1 else None, halo_owner=halo_owner)


def _compact(index: np.ndarray) -> np.ndarray:
    """``index`` as int32 when it fits (it does below 2^31 rows per tier and per partition):
    half the memory, and the native row kernels take int32 indices as they are."""
    if index.size == 0 or int(index.max()) < 2**31:
        return index.astype(np.int32)
    return index.astype(np.int64)


class RouteCache:
    """Routes per (layout, block, with_own), made on first use. A block's halo must be the
    same arrays on every call (the engine passes its partition's); other arrays make a fresh
    route."""

    def __init__(self):
        self._routes: dict = {}

    @property
    def nbytes(self) -> int:
        """Bytes of the routes' index arrays (for memory reports)."""
        return sum(t.dst.nbytes + t.src.nbytes for r in self._routes.values() for t in r.halo)

    def get(self, layout: Layout, block: int, own_rows: int, halo_owner: np.ndarray,
            halo_row: np.ndarray, with_own: bool = False) -> Route:
        key = (layout.key, int(block), bool(with_own))
        route = self._routes.get(key)
        if route is None or route.halo_owner is not halo_owner:
            route = make_route(layout, block, own_rows, halo_owner, halo_row, with_own)
            self._routes[key] = route
        return route
