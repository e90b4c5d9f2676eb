"""The storage dtypes' conversions on the device (`jgrind.hostio.codecs`): a step output is
encoded where it was computed, so that only its stored form crosses to the host, and stored
rows sent to the device are decoded there.

Each function is jitted per codec and shape and computes the host codec's numbers bit for bit
(tests/test_codecs_device.py): the same float32 operations in the same order (a cast to the
16-bit format rounds to nearest even in both; int8's scale is ``largest / 127``, its codes
``x * (127 / largest)`` rounded, tiny rows lifted by `jgrind.hostio.codecs.TINY_LIFT`), the
same sign keeping, and for stochastic rounding the same random numbers
(`jgrind.hostio.codecs.uniforms`, a hash in uint32 arithmetic). The stored words travel as
uint32, so no float operation touches their bits (an int8 row's words may read as NaN).

On the CPU backend the device is host memory and the same programs run there.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgrind.hostio.codecs import TINY_LIFT, BFloat16, Codec, Float16, Int8, seed_key, uniforms

# the codecs whose conversions this module computes; a codec of another class (a subclass
# with its own `encode`, say) is converted on the host only
SUPPORTED = (BFloat16, Float16, Int8)


def supports(codec: Codec) -> bool:
    """Whether ``codec``'s conversions run on the device (exactly one of `SUPPORTED`)."""
    return type(codec) in SUPPORTED


@functools.partial(jax.jit, static_argnums=0)
def _encode(codec: Codec, values: jax.Array, key: jax.Array,
            one_twenty_seven: jax.Array) -> jax.Array:
    if isinstance(codec, Int8):
        return _encode_int8(codec.stochastic, values, key, one_twenty_seven)
    return _encode_half(codec, values)


def _nonzero_and_positive(x: jax.Array) -> tuple:
    """``x != 0`` and ``x > 0`` from the bits: XLA's CPU backend treats subnormal operands of
    float comparisons as zero (DAZ); NumPy does not."""
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    nonzero = magnitude != 0
    is_nan = magnitude > np.uint32(0x7F800000)
    return nonzero, nonzero & ~is_nan & (bits >> 31 == 0)


def _to_bfloat16_bits(x: jax.Array) -> jax.Array:
    """float32 -> bfloat16 bits, nearest even, in integer arithmetic (ml_dtypes' rounding;
    a cast would flush float32 subnormals first on XLA's CPU backend); NaN stays a NaN of
    its sign, made quiet."""
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return jnp.where(is_nan, (bits >> 16) | np.uint32(0x40), rounded).astype(jnp.uint16)


def _encode_half(codec: Codec, x: jax.Array) -> jax.Array:
    rows, width = x.shape
    if codec.dtype == jnp.bfloat16:
        bits = _to_bfloat16_bits(x)
    else:
        bits = lax.bitcast_convert_type(x.astype(codec.dtype), jnp.uint16)
    # a nonzero value rounded to zero (either sign) keeps its sign as the smallest magnitude
    # (`jgrind.hostio.codecs._keep_signs`)
    smallest = int(np.array(codec.smallest, codec.dtype).view(np.uint16))
    nonzero, positive = _nonzero_and_positive(x)
    lost = ((bits & np.uint16(0x7FFF)) == 0) & nonzero
    kept = jnp.where(positive, np.uint16(smallest), np.uint16(smallest | 0x8000))
    bits = jnp.where(lost, kept, bits)
    words = codec.words(width)
    if 2 * words > width:
        bits = jnp.pad(bits, ((0, 0), (0, 2 * words - width)))
    return lax.bitcast_convert_type(bits.reshape(rows, words, 2), jnp.uint32)


def _encode_int8(stochastic: bool, x: jax.Array, key: jax.Array,
                 one_twenty_seven: jax.Array) -> jax.Array:
    rows, width = x.shape
    # 127 comes as an argument: XLA would turn a division by the constant into a product with
    # its reciprocal, which rounds differently from NumPy's division
    largest = jnp.max(jnp.abs(x), axis=1) if width else jnp.zeros(rows, jnp.float32)
    scale = largest / one_twenty_seven
    finite = jnp.isfinite(scale)
    usable = finite & (largest > 0)
    inverse = jnp.where(usable, one_twenty_seven / largest, np.float32(0))
    tiny = jnp.isinf(inverse)
    lift = jnp.where(tiny, TINY_LIFT, np.float32(1))
    inverse = jnp.where(tiny, one_twenty_seven / (largest * lift), inverse)
    x_lifted = jnp.where(tiny[:, None], x * lift[:, None], x)
    t = jnp.where(finite[:, None], x_lifted * inverse[:, None], np.float32(0))
    if stochastic:
        u = uniforms(key, jnp.arange(rows, dtype=jnp.uint32)[:, None],
                     jnp.arange(width, dtype=jnp.uint32)[None, :])
        t = jnp.floor(t + u)
    else:
        t = lax.round(t, lax.RoundingMethod.TO_NEAREST_EVEN)
    nonzero, positive = _nonzero_and_positive(x)
    t = jnp.where((t == 0) & nonzero, jnp.where(positive, np.float32(1), np.float32(-1)), t)
    if stochastic:  # floor(127 + u) may reach 128
        t = jnp.clip(t, -127, 127)
    codes = t.astype(jnp.int8)
    code_words = (width + 3) // 4
    if 4 * code_words > width:
        codes = jnp.pad(codes, ((0, 0), (0, 4 * code_words - width)))
    packed = lax.bitcast_convert_type(codes.reshape(rows, code_words, 4), jnp.uint32)
    scale = jnp.where(finite, scale, np.float32(np.nan))
    scale_word = lax.bitcast_convert_type(scale, jnp.uint32)[:, None]
    return jnp.concatenate([packed, scale_word], axis=1)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _decode(codec: Codec, words: jax.Array, width: int) -> jax.Array:
    rows = words.shape[0]
    if isinstance(codec, Int8):
        codes = lax.bitcast_convert_type(words[:, :-1], jnp.int8).reshape(rows, -1)[:, :width]
        scale = lax.bitcast_convert_type(words[:, -1:], jnp.float32)
        return codes.astype(jnp.float32) * scale
    bits = lax.bitcast_convert_type(words, jnp.uint16).reshape(rows, -1)[:, :width]
    return lax.bitcast_convert_type(bits, codec.dtype).astype(jnp.float32)


_ONE_TWENTY_SEVEN = np.float32(127)


def encode(codec: Codec, values, seed=()) -> jax.Array:
    """The stored words of ``values`` (``[rows, width]`` float32, a device array or NumPy rows,
    which are put on the device first) as a ``[rows, codec.words(width)]`` uint32 device
    array: `Codec.encode`'s words, bit for bit. ``seed`` seeds stochastic rounding."""
    key = seed_key(seed) if getattr(codec, "stochastic", False) else np.zeros(2, np.uint32)
    # meant transfers (NumPy rows, the key)
    values, key, one_twenty_seven = jax.device_put((values, key, _ONE_TWENTY_SEVEN))
    return _encode(codec, values, key, one_twenty_seven)


def decode(codec: Codec, words, width: int) -> jax.Array:
    """The float32 values (``[rows, width]``, a device array) of stored ``words`` (``[rows,
    codec.words(width)]``, uint32 or float32 words, on the device or NumPy, put first)."""
    if isinstance(words, np.ndarray):
        words = words.view(np.uint32)
    words = jax.device_put(words)
    if words.dtype != jnp.uint32:
        words = lax.bitcast_convert_type(words, jnp.uint32)
    return _decode(codec, words, int(width))
