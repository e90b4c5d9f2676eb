// jgrind native CPU kernel: CRC32C (Castagnoli) of a byte range, with the CPU's CRC instruction.
//
//   crc = jgrind_crc32c(crc, data, n)     chained like zlib.crc32: crc32c(AB) = f(f(0, A), B)
//
// Why: the SSD tier checksums every row it writes and verifies every row it reads back
// (`jgrind.checksum`, and the span loops of spans.cc through jgrind_crc32c_rows). zlib's
// CRC-32 ran at 3.7 GB/s on the 2-core test machine
// (this kernel: 11.8, tools/bench_span_gap.py), and on the 1M-node benchmark the checksums
// were about half of the SSD tier's CPU time. The CRC32C polynomial has an instruction on x86
// (SSE4.2 `crc32`) and ARMv8 (`crc32c*`): 8 bytes per instruction, latency 3 cycles,
// throughput 1 per cycle. One dependency chain would run at a third of the throughput, so the
// data goes through three chains over three adjacent lanes, whose registers are then combined
// with the GF(2) algebra of CRCs (shifting a register over n zero bytes is a multiplication by
// x^(8n) mod P). The result is the standard CRC32C
// (check value: "123456789" -> 0xE3069283) whatever the path, so the tests can pin it.

#include <cstdint>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#define JGRIND_CRC32C_HW 1
#elif defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#define JGRIND_CRC32C_HW 1
#else
#define JGRIND_CRC32C_HW 0
#endif

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // CRC32C, bit-reflected
constexpr int64_t kLane = 8192;          // bytes per chain in the three-chain loop

// a * b modulo P, both as bit-reflected polynomials (bit 31 is x^0)
uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8 n) modulo P: what a register is multiplied by when n zero bytes go through it
uint32_t ZeroBytesOperator(int64_t n) {
  uint32_t result = 1u << 31;    // x^0
  uint32_t power = 1u << 23;     // x^8: one zero byte
  for (; n > 0; n >>= 1) {
    if (n & 1) result = MulModP(power, result);
    power = MulModP(power, power);
  }
  return result;
}

uint32_t g_byte_table[256];

struct ByteTableInit {
  ByteTableInit() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      g_byte_table[i] = c;
    }
  }
} g_byte_table_init;

inline uint32_t Byte(uint32_t crc, uint8_t byte) {
#if defined(__SSE4_2__)
  return _mm_crc32_u8(crc, byte);
#elif defined(__ARM_FEATURE_CRC32)
  return __crc32cb(crc, byte);
#else
  return g_byte_table[(crc ^ byte) & 0xFF] ^ (crc >> 8);
#endif
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline uint32_t Word(uint32_t crc, const uint8_t* p) {
#if defined(__SSE4_2__)
  return static_cast<uint32_t>(_mm_crc32_u64(crc, Load64(p)));
#elif defined(__ARM_FEATURE_CRC32)
  return __crc32cd(crc, Load64(p));
#else
  for (int k = 0; k < 8; ++k) crc = Byte(crc, p[k]);
  return crc;
#endif
}

// the raw register (no pre- or post-inversion) after `n` bytes from `crc`
uint32_t Raw(uint32_t crc, const uint8_t* p, int64_t n) {
  if (JGRIND_CRC32C_HW && n >= 3 * kLane) {
    static const uint32_t shift_lane = ZeroBytesOperator(kLane);
    for (; n >= 3 * kLane; p += 3 * kLane, n -= 3 * kLane) {
      uint32_t a = crc, b = 0, c = 0;
      for (int64_t i = 0; i < kLane; i += 8) {
        a = Word(a, p + i);
        b = Word(b, p + kLane + i);
        c = Word(c, p + 2 * kLane + i);
      }
      // registers are linear in (state, data): ABC from a = MulModP(x^(8L), a) ^ b, and so on
      crc = MulModP(shift_lane, MulModP(shift_lane, a) ^ b) ^ c;
    }
  }
  for (; n >= 8; p += 8, n -= 8) crc = Word(crc, p);
  for (; n > 0; ++p, --n) crc = Byte(crc, *p);
  return crc;
}

}  // namespace

extern "C" {

// CRC32C of `n` bytes at `data`, continuing `crc` (0 to start), as zlib.crc32 continues its own.
__attribute__((visibility("default"))) uint32_t jgrind_crc32c(uint32_t crc, const void* data,
                                                               int64_t n) {
  return ~Raw(~crc, static_cast<const uint8_t*>(data), n);
}

// The CRC32C of each of `count` rows of `row_bytes` bytes: row k starts at
// base + (index ? index[k] - first : k) * row_bytes. Three rows go through three independent
// chains at once, which hides the instruction's latency as the three lanes of `Raw` do (a row
// is often shorter than one lane). Rows of 128 bytes or more go as rows k of the first, second
// and last third: three long sequential streams, which the hardware prefetcher follows, where
// three adjacent rows ran at a quarter of the speed on a buffer out of cache (1 KiB rows,
// 32 MiB: 3.5 against 12.6 GB/s on the test machine); shorter rows go three adjacent ones at a
// time (one stream; 32-byte rows ran at half the speed by thirds). The SSD tier keeps one such
// CRC per file row.
__attribute__((visibility("default"))) void jgrind_crc32c_rows(const void* base,
                                                                int64_t row_bytes,
                                                                const int64_t* index,
                                                                int64_t first, int64_t count,
                                                                uint32_t* out) {
  const uint8_t* data = static_cast<const uint8_t*>(base);
  auto row = [&](int64_t k) { return data + (index ? index[k] - first : k) * row_bytes; };
  const int64_t groups = count / 3;
  const int64_t apart = row_bytes < 128 ? 1 : groups;  // rows k, k + apart, k + 2 apart
  const int64_t next = apart == 1 ? 3 : 1;
  for (int64_t g = 0, k = 0; g < groups; ++g, k += next) {
    const uint8_t* a = row(k);
    const uint8_t* b = row(k + apart);
    const uint8_t* c = row(k + 2 * apart);
    uint32_t x = ~0u, y = ~0u, z = ~0u;
    int64_t i = 0;
    for (; i + 8 <= row_bytes; i += 8) {
      x = Word(x, a + i);
      y = Word(y, b + i);
      z = Word(z, c + i);
    }
    for (; i < row_bytes; ++i) {
      x = Byte(x, a[i]);
      y = Byte(y, b[i]);
      z = Byte(z, c[i]);
    }
    out[k] = ~x;
    out[k + apart] = ~y;
    out[k + 2 * apart] = ~z;
  }
  for (int64_t k = 3 * groups; k < count; ++k) out[k] = ~Raw(~0u, row(k), row_bytes);
}

// The CRC32C of `n` zero bytes, without reading any: a register goes through zero bytes by a
// multiplication (see `ZeroBytesOperator`).
__attribute__((visibility("default"))) uint32_t jgrind_crc32c_zeros(int64_t n) {
  return ~MulModP(ZeroBytesOperator(n), ~0u);
}

// 1 when the CRC instruction is used, 0 for the table fallback (reported by the profile).
__attribute__((visibility("default"))) int jgrind_crc32c_hardware() { return JGRIND_CRC32C_HW; }

}  // extern "C"
