"""Storage dtypes: how a block of float32 rows is kept in the host and SSD tiers.

Computation is float32. A codec converts a block when the store writes it to a tier that is
not device memory, and converts it back when the block is read. Each codec is a frozen
dataclass (hashable, comparable), so a policy carries its choice as a value
(`jgrind.plan.fates.Storage`).

The stored form of a ``[rows, width]`` block is ``[rows, words(width)]`` float32 *words*: each
row's bytes, padded to a multiple of 4. The tiers move those words as they move float32 rows
(native row copies, gathers, checksums, the host cache, `jgrind.engine.ssd.SSDFile`) without
looking inside; only a codec reads or writes their bytes. A row of all-zero words decodes to
zeros in every codec, so a row the SSD tier reads as zeros (not yet written this epoch) is a
zero row in every dtype.

=========  =============  ============================================================
codec      bytes per row  error per element, value ``x`` of a row with largest ``m``
=========  =============  ============================================================
float32    4 w            none (the identity: the default)
bfloat16   2 w            ``|x| * 2**-8`` at most (8 significant bits, nearest even)
float16    2 w            ``|x| * 2**-11`` at most for ``2**-14 <= |x| <= 65504``; smaller
                          values lose bits (subnormal), larger ones overflow to inf
int8       w + 4          ``m / 254`` at most (nearest), below ``m / 127`` (stochastic)
=========  =============  ============================================================

(``w`` rounded up to whole words.) int8 is symmetric with one float32 scale per row,
``m / 127``; an all-zero row has scale 0 and decodes to zeros. Stochastic rounding rounds
up with probability equal to the fraction dropped, so a decoded value is ``x`` on average
(unbiased); its random numbers are a hash of ``seed`` and each element's row and column
(`uniforms`), so a run that makes the same calls rounds the same, and the device's encoder
(`jgrind.hostio.device_codecs`), which computes the same hash in the same uint32 arithmetic,
rounds every element as the host does.

Every codec keeps the sign of a nonzero value: one that would round to zero (under half an int8
step, or below float16's or bfloat16's smallest subnormal) is stored as the smallest magnitude
of its sign instead, an error of up to one step (`_keep_signs`). The backward sweep takes a
ReLU layer's derivative from the sign of its stored output, and on Cora a 2-layer SAGE's
gradient error with int8 went from 0.19 to 0.0035 of the gradient's largest entry when small
outputs stopped being zeroed. (Under one step stochastic rounding is then no longer unbiased.)

Non-finite values: bfloat16 and float16 keep NaN and inf per element (float16 makes finite
values over 65504 inf). int8 makes every value of a row that holds a NaN or inf NaN (its scale
is NaN). Either way a non-finite value stays non-finite, as training in float32 would carry it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Protocol, Sequence, runtime_checkable

import ml_dtypes
import numpy as np

# Rows a codec converts at a time: its temporaries (a few of them, each this many rows) stay in
# the CPU's caches instead of streaming whole blocks through memory once per operation.
CHUNK_BYTES = 1 << 20


@runtime_checkable
class Codec(Protocol):
    """A storage dtype (see the module's table).

    Attributes:
      name: as the CLI and the plan print it (``float32``, ``bfloat16``, ``float16``,
        ``int8``, ``int8-stochastic``).
      lossy: whether a round trip may change a value.
    """

    name: str
    lossy: bool

    def words(self, width: int) -> int:
        """float32 words of one stored row of ``width`` values."""

    def encoded_nbytes(self, rows: int, width: int) -> int:
        """Bytes of a stored ``[rows, width]`` block."""

    def encode(self, block: np.ndarray, out: Optional[np.ndarray] = None,
               seed: Sequence[int] = ()) -> np.ndarray:
        """The stored words of float32 ``block`` (``[rows, width]``), into ``out`` when given
        (``[rows, words(width)]`` float32). ``seed`` seeds stochastic rounding."""

    def decode(self, stored: np.ndarray, into: np.ndarray) -> np.ndarray:
        """``into[...]`` = the float32 values of ``stored`` (``[rows, words]``); returns
        ``into`` (``[rows, width]``)."""


def _chunks(rows: int, width: int):
    step = max(1, CHUNK_BYTES // max(4 * width, 1))
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def _out(out: Optional[np.ndarray], rows: int, words: int) -> np.ndarray:
    if out is None:
        return np.empty((rows, words), np.float32)
    if out.shape != (rows, words) or out.dtype != np.float32:
        raise ValueError(f"stored words of shape {(rows, words)} float32, got {out.shape} "
                         f"{out.dtype}")
    return out


@dataclasses.dataclass(frozen=True)
class Float32:
    """The identity: values kept as they are (the exact default)."""

    name = "float32"
    lossy = False

    def words(self, width: int) -> int:
        return int(width)

    def encoded_nbytes(self, rows: int, width: int) -> int:
        return 4 * int(rows) * int(width)

    def encode(self, block: np.ndarray, out: Optional[np.ndarray] = None,
               seed: Sequence[int] = ()) -> np.ndarray:
        if out is None:
            return block
        np.copyto(out, block)
        return out

    def decode(self, stored: np.ndarray, into: np.ndarray) -> np.ndarray:
        if stored is not into:
            np.copyto(into, stored)
        return into


@dataclasses.dataclass(frozen=True)
class _Half:
    """A 16-bit float format: two values a word, rounded to nearest even by the cast."""

    def words(self, width: int) -> int:
        return (int(width) + 1) // 2

    def encoded_nbytes(self, rows: int, width: int) -> int:
        return 4 * int(rows) * self.words(width)

    def encode(self, block: np.ndarray, out: Optional[np.ndarray] = None,
               seed: Sequence[int] = ()) -> np.ndarray:
        rows, width = block.shape
        out = _out(out, rows, self.words(width))
        halves = out.view(self.dtype)
        if width % 2:
            halves[:, width] = 0
        with np.errstate(over="ignore"):  # float16 past 65504: inf, as documented
            for a, b in _chunks(rows, width):
                part = halves[a:b, :width]
                part[...] = block[a:b]  # the cast: nearest even, NaN and inf kept
                # zero in either sign: the bits other than the sign bit are 0
                zero = (part.view(np.uint16) & np.uint16(0x7FFF)) == 0
                _keep_signs(part, block[a:b], self.smallest, zero)
        return out

    def decode(self, stored: np.ndarray, into: np.ndarray) -> np.ndarray:
        width = into.shape[1]
        halves = stored.view(self.dtype)
        for a, b in _chunks(into.shape[0], width):
            into[a:b] = halves[a:b, :width]
        return into


@dataclasses.dataclass(frozen=True)
class BFloat16(_Half):
    """bfloat16: float32's range, 8 significant bits."""

    name = "bfloat16"
    lossy = True
    dtype = np.dtype(ml_dtypes.bfloat16)
    smallest = ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal


@dataclasses.dataclass(frozen=True)
class Float16(_Half):
    """IEEE half precision: 11 significant bits, finite up to 65504."""

    name = "float16"
    lossy = True
    dtype = np.dtype(np.float16)
    smallest = np.finfo(np.float16).smallest_subnormal


@dataclasses.dataclass(frozen=True)
class Int8:
    """Symmetric int8 with one float32 scale per row (``max |x| / 127``), the scale in the
    row's last word. ``stochastic``: round up with probability equal to the fraction dropped
    (unbiased), from random numbers of ``encode``'s ``seed`` (`uniforms`); else to nearest.

    A row whose largest magnitude is under ``127 / float32's max`` (about 4e-37) is multiplied
    by `TINY_LIFT` (exact: a power of two) before ``127 / largest``, which would overflow."""

    stochastic: bool = False
    lossy = True

    @property
    def name(self) -> str:
        return "int8-stochastic" if self.stochastic else "int8"

    def words(self, width: int) -> int:
        return (int(width) + 3) // 4 + 1

    def encoded_nbytes(self, rows: int, width: int) -> int:
        return 4 * int(rows) * self.words(width)

    def encode(self, block: np.ndarray, out: Optional[np.ndarray] = None,
               seed: Sequence[int] = ()) -> np.ndarray:
        rows, width = block.shape
        words = self.words(width)
        out = _out(out, rows, words)
        codes = out[:, :words - 1].view(np.int8)  # [rows, 4 * (words - 1)]
        if codes.shape[1] > width:
            codes[:, width:] = 0
        key = seed_key(seed) if self.stochastic else None
        for a, b in _chunks(rows, width):
            x = block[a:b]
            largest = np.max(np.abs(x), axis=1) if width else np.zeros(b - a, np.float32)
            scale = largest / np.float32(127)
            finite = np.isfinite(scale)
            # all-zero rows: scale 0, codes 0; non-finite rows: scale NaN, codes 0
            with np.errstate(over="ignore"):  # rows of tiny values: redone in float64 below
                inverse = np.divide(np.float32(127), largest,
                                    out=np.zeros_like(largest), where=finite & (largest > 0))
            with np.errstate(invalid="ignore"):  # inf * 0: zeroed or redone next
                t = x * inverse[:, None]
            if not finite.all():
                t[~finite] = 0
            tiny = np.isinf(inverse)  # largest below 127 / float32's max (about 4e-37)
            if tiny.any():  # lifted by a power of two first, as `device_codecs` does
                lifted = np.float32(127) / (largest[tiny] * TINY_LIFT)
                t[tiny] = (x[tiny] * TINY_LIFT) * lifted[:, None]
            if key is None:
                np.rint(t, out=t)
            else:
                t += uniforms(key, np.arange(a, b, dtype=np.uint32)[:, None],
                              np.arange(width, dtype=np.uint32)[None, :])
                np.floor(t, out=t)
            _keep_signs(t, x, 1)
            if key is not None:  # floor(127 + u) may reach 128; nearest rounding stays within
                np.clip(t, -127, 127, out=t)
            codes[a:b, :width] = t
            out[a:b, -1] = np.where(finite, scale, np.float32(np.nan))
        return out

    def decode(self, stored: np.ndarray, into: np.ndarray) -> np.ndarray:
        width = into.shape[1]
        words = stored.shape[1]
        codes = stored[:, :words - 1].view(np.int8)
        for a, b in _chunks(into.shape[0], width):
            np.multiply(codes[a:b, :width], stored[a:b, -1:], out=into[a:b])
        return into


# A row of int8 whose largest magnitude is so small that ``127 / largest`` overflows is scaled
# by this first (exact); float32 arithmetic throughout, as on the device (no float64 there).
TINY_LIFT = np.float32(2.0 ** 64)

# murmur3's 32-bit finaliser constants, and the golden ratio's: the hash of `uniforms`
_MIX1, _MIX2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)
_GOLDEN = np.uint32(0x9E3779B9)


def _mix32(h):
    """murmur3's finaliser: every bit of ``h`` (uint32, NumPy or JAX) moves every output bit.
    uint32 products wrap in both, so they compute the same bits."""
    h = h ^ (h >> 16)
    h = h * _MIX1
    h = h ^ (h >> 13)
    h = h * _MIX2
    return h ^ (h >> 16)


def _mix32_int(h: int) -> int:
    """`_mix32` of a Python int's low 32 bits (as a one-element array: array products wrap
    silently, scalar ones warn)."""
    return int(_mix32(np.array([h & 0xFFFFFFFF], np.uint32))[0])


def seed_key(seed: Sequence[int]) -> np.ndarray:
    """The two uint32 words stochastic rounding hashes with (`uniforms`), from ``seed``'s
    integers (each taken modulo 2**32)."""
    k0, k1 = 0x243F6A88, 0x85A308D3  # pi's digits: any nonzero start
    for s in seed:
        k0 = _mix32_int(k0 ^ (int(s) & 0xFFFFFFFF))
        k1 = _mix32_int(k1 + k0 + 0x9E3779B9)
    return np.array([k0, k1], np.uint32)


def uniforms(key, rows, cols):
    """Uniform float32 numbers in ``[0, 1)`` (multiples of 2**-24), one per element of the
    broadcast of ``rows`` (``[r, 1]``) and ``cols`` (``[1, w]``), both uint32: a hash of the
    key (`seed_key`) and the element's row and column in its block. NumPy and JAX arrays
    alike: the host's codec and the device's draw the very same numbers, element by element,
    whatever rows they convert at a time."""
    row = _mix32(rows * _GOLDEN ^ key[0])
    bits = _mix32(row ^ (cols * _MIX1 + key[1]))
    return (bits >> 8).astype(np.float32) * np.float32(2.0 ** -24)


def _keep_signs(coded: np.ndarray, values: np.ndarray, smallest,
                zero: Optional[np.ndarray] = None) -> None:
    """Make every element of ``coded`` that rounded to zero from a nonzero value of ``values``
    the format's ``smallest`` magnitude with the value's sign, in place.

    The backward sweep takes a ReLU layer's derivative from the sign of its stored output
    (`jgrind.models.conv.derivative_from_output`): a small positive output rounded to zero
    would switch the unit off there and drop its whole gradient, an error of the gradient's
    size rather than of the format's precision."""
    lost = coded == 0 if zero is None else zero
    if not lost.any():
        return
    lost &= values != 0
    if lost.any():
        coded[lost] = np.where(values[lost] > 0, smallest, -smallest)


FLOAT32 = Float32()


def float32() -> Float32:
    """Values kept exactly (the default)."""
    return FLOAT32


def bfloat16() -> BFloat16:
    """Half the bytes, 8 significant bits, float32's range."""
    return BFloat16()


def float16() -> Float16:
    """Half the bytes, 11 significant bits, finite up to 65504."""
    return Float16()


def int8(stochastic: bool = False) -> Int8:
    """A quarter of the bytes (plus a float32 scale per row); nearest or stochastic rounding."""
    return Int8(bool(stochastic))


# the names the CLI's store_dtype settings and `by_name` accept
NAMES = {"float32": float32, "bfloat16": bfloat16, "float16": float16, "int8": int8,
         "int8-stochastic": lambda: int8(stochastic=True)}


def by_name(name: str) -> Codec:
    """The codec called ``name`` (`NAMES`); ValueError naming the choices otherwise."""
    key = name.strip().lower().replace("_", "-")
    if key not in NAMES:
        raise ValueError(f"unknown storage dtype {name!r}; use one of {', '.join(NAMES)}")
    return NAMES[key]()


def conversion_rates(rows: int = 65536, width: int = 128, repeats: int = 3) -> dict:
    """``{name: (encode, decode)}`` for every lossy codec of `NAMES`: float32 bytes converted
    per second, the fastest of ``repeats``, on a ``[rows, width]`` block of normal values (32 MiB
    by default: larger than the CPU's caches, as the store's blocks are). The hardware profile
    keeps them (`jgrind.plan.hardware.Profile.codec_bw`) and the cost model prices each stored
    block's conversions by them: they differ by codec and machine (on the 2-core test machine
    bfloat16 encoded at about half the host copy's rate and float16 at a tenth), so no fixed
    share of the copy rate stands in for them."""
    import time

    block = np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32)
    values = np.empty_like(block)
    rates = {}
    for name, make in NAMES.items():
        codec = make()
        if not codec.lossy:
            continue
        stored = np.empty((rows, codec.words(width)), np.float32)
        encode = decode = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            codec.encode(block, out=stored, seed=(0,))
            middle = time.perf_counter()
            codec.decode(stored, values)
            end = time.perf_counter()
            encode, decode = min(encode, middle - start), min(decode, end - middle)
        rates[name] = (block.nbytes / max(encode, 1e-9), block.nbytes / max(decode, 1e-9))
    return rates


def to_stored(codec: Codec, values: np.ndarray, seed: Sequence[int] = (),
              out: Optional[np.ndarray] = None) -> np.ndarray:
    """A step output's rows (host memory) in their stored form, encoded by NumPy: how a block
    is encoded on its way to a host or SSD tier where the device does not encode it (a codec
    `jgrind.hostio.device_codecs` does not know, or conversion on the device switched off,
    `jgrind.engine.tiers.coded`). The coded tiers otherwise encode the step output on the
    device, to the same words, and copy only those to the host."""
    return codec.encode(np.ascontiguousarray(values, np.float32), out=out, seed=seed)
