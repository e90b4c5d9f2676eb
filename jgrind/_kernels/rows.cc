// jgrind native CPU kernels: row gathers and row scatter-adds on host (NumPy) tables.
//
//   take:  out[dst[i], :]    = src[idx[i], :]      (dst == nullptr: out[i, :])
//   add:   table[idx[i], :] += values[src[i], :]   (src == nullptr: values[i, :])
//
// float32 rows, int32 or int64 indices, all arrays C-contiguous. The activation store moves halo rows
// with these (`jgrind.rows`), and the hardware profile times them, so the planner prices the
// code the engine runs.
//
// Why native: NumPy's `np.take` copies rows fast, but placing them at scattered output rows
// (`out[dst] = ...`) or adding them (`t[idx] += v`, or take + add + put) makes two or three
// passes through NumPy's advanced-indexing machinery, whose per-row cost dominates narrow rows
// (8 floats: ~12 ns per row against ~2 ns for the copy). Here every row is one copy or one
// add, in one pass, on the calling thread (the store calls these from its prefetch and writer
// threads, beside the compute; ctypes releases the GIL). Rows of upcoming indices are
// prefetched to keep several cache misses in flight.
//
// Every index is checked (one compare): an out-of-range index returns an error code instead
// of touching memory outside the arrays.

#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kAhead = 8;  // rows prefetched ahead of the copy

inline bool OutOfRange(int64_t i, int64_t n) {
  return static_cast<uint64_t>(i) >= static_cast<uint64_t>(n);
}

template <typename Idx>
int TakeRows(const float* src, int64_t src_rows, const Idx* idx, int64_t n, int64_t width,
             float* out, int64_t out_rows, const Idx* dst) {
  const size_t row_bytes = static_cast<size_t>(width) * sizeof(float);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const int64_t ahead = idx[i + kAhead];
      if (!OutOfRange(ahead, src_rows)) __builtin_prefetch(src + ahead * width, 0, 0);
    }
    const int64_t s = idx[i];
    if (OutOfRange(s, src_rows)) return 1;
    const int64_t d = dst ? static_cast<int64_t>(dst[i]) : i;
    if (OutOfRange(d, out_rows)) return 2;
    std::memcpy(out + d * width, src + s * width, row_bytes);
  }
  return 0;
}

template <typename Idx>
int AddRows(float* table, int64_t table_rows, const Idx* idx, int64_t n, int64_t width,
            const float* values, int64_t values_rows, const Idx* src) {
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const int64_t ahead = idx[i + kAhead];
      if (!OutOfRange(ahead, table_rows)) __builtin_prefetch(table + ahead * width, 1, 0);
    }
    const int64_t t = idx[i];
    if (OutOfRange(t, table_rows)) return 1;
    const int64_t v = src ? static_cast<int64_t>(src[i]) : i;
    if (OutOfRange(v, values_rows)) return 2;
    float* __restrict row = table + t * width;
    const float* __restrict add = values + v * width;
    for (int64_t c = 0; c < width; ++c) row[c] += add[c];
  }
  return 0;
}

}  // namespace

extern "C" {

// Row indices as int64 (`_i64`) or int32 (`_i32`: the store keeps its routes as int32, half
// the memory). Return 0 on success; take: 1 if an index of `idx` is out of range, 2 if one of
// `dst` is; add: 1 for `idx`, 2 for `src`. Nothing is written past the first bad index.
// Indices in an add's `idx` should be unique: a repeated row gets every addition, in order
// (the same float result as adding them one by one).
#define JGRIND_ROWS(suffix, Idx)                                                               \
  __attribute__((visibility("default"))) int jgrind_take_rows_f32_##suffix(                    \
      const float* src, int64_t src_rows, const Idx* idx, int64_t n, int64_t width,            \
      float* out, int64_t out_rows, const Idx* dst) {                                          \
    return TakeRows<Idx>(src, src_rows, idx, n, width, out, out_rows, dst);                    \
  }                                                                                            \
  __attribute__((visibility("default"))) int jgrind_add_rows_f32_##suffix(                     \
      float* table, int64_t table_rows, const Idx* idx, int64_t n, int64_t width,              \
      const float* values, int64_t values_rows, const Idx* src) {                              \
    return AddRows<Idx>(table, table_rows, idx, n, width, values, values_rows, src);           \
  }

JGRIND_ROWS(i64, int64_t)
JGRIND_ROWS(i32, int32_t)

}  // extern "C"
