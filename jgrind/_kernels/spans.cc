// jgrind native CPU kernels: row reads and row read-add-writes on an SSD-tier file, span by span.
//
//   read:  out[dst[k], :]  = file[rows[k], :]                  (dst == nullptr: out[k, :])
//   add:   file[rows[k], :] += values[src[k], :]               (src == nullptr: values[k, :])
//
// A file holds a float32 [file_rows, width] table at byte `data_start` (`jgrind.engine.ssd`).
// `rows` is ascending. Rows less than `gap_rows` apart are merged into one span, and a span is
// moved with one pread (and, for an addition, one pwrite) through `scratch`, at most
// `scratch_rows` rows at a time.
//
// Why native: the SSD tier reads halo rows scattered over other partitions' blocks. Each span
// costs a system call plus, in Python, ~5-10 us of interpreter and NumPy work, which made it
// cheaper to read long gaps than to issue more calls: with the 128 KiB gap that paid off, a
// 1M-node R-MAT graph's halo gathers read 9x the bytes they needed (tools/bench_span_gap.py).
// Here a span costs the system call only, so the gap can be a few KiB, and the loop runs with
// the GIL released on the store's prefetch and writer threads.
//
// Every index is checked before it is used: a bad one returns an error code and touches nothing
// outside the arrays (what was read or written up to it stays).
//
// Integrity: `crcs` (nullable) holds the CRC32C of every file row (`checksum.cc`), kept by the
// caller for rows written whole and here for rows written back by an addition. Every current
// row a loop uses is checked against it (a read checks the rows it returns, an addition the
// rows it adds to), so a row changed on disk behind the store's back returns kCorrupt, the row
// in stats[kCorruptRow], instead of being returned or added to. After an addition the added
// rows get the CRCs of their new values, and gaps written back as zeros the zeros' CRC. A
// current gap row goes back as it was read and keeps its CRC, unchecked: were it damaged, it
// stays damaged on disk against its old CRC, and the read that uses it finds out. Checking the
// gaps too cost a CRC pass over every span byte, about 10 times the added rows' bytes.

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" void jgrind_crc32c_rows(const void* base, int64_t row_bytes, const int64_t* index,
                                   int64_t first, int64_t count, uint32_t* out);
extern "C" uint32_t jgrind_crc32c_zeros(int64_t n);

namespace {

enum : int {
  kOk = 0,
  kBadRow = 1,       // a row outside [0, file_rows), or rows not ascending
  kBadOther = 2,     // a dst (read) or src (add) index out of range
  kFileEnded = 3,    // the file ended inside a span: truncated
  kCorrupt = 4,      // a row read does not match its CRC (the file row: stats[kCorruptRow])
};

// stats[] slots, accumulated (kCorruptRow: set with kCorrupt)
enum : int { kReadCalls = 0, kWriteCalls, kRowsRead, kBytesRead, kBytesWritten, kCorruptRow,
             kNumStats };

// Per-thread room for one span's CRCs (a span has at most `scratch_rows` rows).
uint32_t* CrcRoom(int64_t rows) {
  thread_local std::vector<uint32_t> room;
  if (static_cast<int64_t>(room.size()) < rows) room.resize(static_cast<size_t>(rows));
  return room.data();
}

// Fill `n` bytes at `buf` from `offset`: 0, kFileEnded, or -errno.
int ReadFully(int fd, char* buf, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t got = pread(fd, buf + done, static_cast<size_t>(n - done), offset + done);
    if (got < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (got == 0) return kFileEnded;
    done += got;
  }
  return kOk;
}

int WriteFully(int fd, const char* buf, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t put = pwrite(fd, buf + done, static_cast<size_t>(n - done), offset + done);
    if (put < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    done += put;
  }
  return kOk;
}

// The end (exclusive) of the span starting at rows[i]: rows whose gaps are at most `gap_rows`,
// within `scratch_rows` rows of rows[i]. `*error` becomes kBadRow for a row out of order or
// range, kBadOther for an index of `other` (dst or src: rows k of the span use other[k], or k
// without it) outside [0, other_rows).
int64_t CheckedSpan(const int64_t* rows, int64_t i, int64_t n, int64_t file_rows,
                    int64_t gap_rows, int64_t scratch_rows, const int64_t* other,
                    int64_t other_rows, int* error) {
  *error = kOk;
  if (rows[i] < 0 || rows[i] >= file_rows) {
    *error = kBadRow;
    return i;
  }
  int64_t j = i + 1;
  for (; j < n; ++j) {
    const int64_t step = rows[j] - rows[j - 1];
    if (step < 0 || rows[j] >= file_rows) {
      *error = kBadRow;
      return j;
    }
    if (step > gap_rows + 1 || rows[j] - rows[i] >= scratch_rows) break;
  }
  for (int64_t k = i; k < j; ++k) {
    const int64_t o = other ? other[k] : k;
    if (static_cast<uint64_t>(o) >= static_cast<uint64_t>(other_rows)) {
      *error = kBadOther;
      return j;
    }
  }
  return j;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int jgrind_read_spans_f32(
    int fd, int64_t data_start, int64_t file_rows, int64_t width, const int64_t* rows, int64_t n,
    int64_t gap_rows, float* out, int64_t out_rows, const int64_t* dst, float* scratch,
    int64_t scratch_rows, const uint8_t* current, const uint32_t* crcs, int64_t* stats) {
  const int64_t row_bytes = width * static_cast<int64_t>(sizeof(float));
  for (int64_t i = 0; i < n;) {
    int error;
    const int64_t j = CheckedSpan(rows, i, n, file_rows, gap_rows, scratch_rows, dst, out_rows,
                                  &error);
    if (error != kOk) return error;
    const int64_t lo = rows[i], span = rows[j - 1] + 1 - lo;
    // a run of consecutive rows into consecutive output rows goes straight to `out`
    const bool direct = dst == nullptr && span == j - i;
    char* buf = direct ? reinterpret_cast<char*>(out + i * width)
                       : reinterpret_cast<char*>(scratch);
    const int rc = ReadFully(fd, buf, span * row_bytes, data_start + lo * row_bytes);
    if (rc != kOk) return rc;
    stats[kReadCalls] += 1;
    stats[kRowsRead] += j - i;
    stats[kBytesRead] += span * row_bytes;
    if (crcs != nullptr) {  // the rows asked for (rows not current read as zeros: unchecked)
      uint32_t* got = CrcRoom(j - i);
      jgrind_crc32c_rows(buf, row_bytes, direct ? nullptr : rows + i, lo, j - i, got);
      for (int64_t k = i; k < j; ++k) {
        const int64_t r = rows[k];
        if ((current == nullptr || current[r]) && got[k - i] != crcs[r]) {
          stats[kCorruptRow] = r;
          return kCorrupt;
        }
      }
    }
    if (!direct) {
      for (int64_t k = i; k < j; ++k) {
        const int64_t d = dst ? dst[k] : k;
        std::memcpy(out + d * width, scratch + (rows[k] - lo) * width,
                    static_cast<size_t>(row_bytes));
      }
    }
    i = j;
  }
  return kOk;
}

// `current` (nullable, one byte per file row): whether a row holds this epoch's value. A span
// whose rows are all current is read; one with some is read and its other rows zeroed; one with
// none is not read at all (zeros). Every row of a span written back becomes current.
__attribute__((visibility("default"))) int jgrind_add_spans_f32(
    int fd, int64_t data_start, int64_t file_rows, int64_t width, const int64_t* rows, int64_t n,
    int64_t gap_rows, const float* values, int64_t values_rows, const int64_t* src,
    float* scratch, int64_t scratch_rows, uint8_t* current, uint32_t* crcs, int64_t* stats) {
  const int64_t row_bytes = width * static_cast<int64_t>(sizeof(float));
  const uint32_t zeros_crc = crcs != nullptr ? jgrind_crc32c_zeros(row_bytes) : 0;
  for (int64_t i = 0; i < n;) {
    int error;
    const int64_t j = CheckedSpan(rows, i, n, file_rows, gap_rows, scratch_rows, src,
                                  values_rows, &error);
    if (error != kOk) return error;
    const int64_t lo = rows[i], span = rows[j - 1] + 1 - lo;
    const int64_t offset = data_start + lo * row_bytes;
    char* buf = reinterpret_cast<char*>(scratch);
    int64_t held = span;  // rows of the span that hold current values
    if (current != nullptr) {
      held = 0;
      for (int64_t r = 0; r < span; ++r) held += current[lo + r] != 0;
    }
    if (held == 0) {
      std::memset(buf, 0, static_cast<size_t>(span * row_bytes));
    } else {
      const int rc = ReadFully(fd, buf, span * row_bytes, offset);
      if (rc != kOk) return rc;
      stats[kReadCalls] += 1;
      stats[kRowsRead] += j - i;
      stats[kBytesRead] += span * row_bytes;
      if (crcs != nullptr) {  // the current rows added to (the gaps go back as read)
        uint32_t* got = CrcRoom(j - i);
        jgrind_crc32c_rows(buf, row_bytes, rows + i, lo, j - i, got);
        for (int64_t k = i; k < j; ++k) {
          const int64_t r = rows[k];
          if ((current == nullptr || current[r]) && got[k - i] != crcs[r]) {
            stats[kCorruptRow] = r;
            return kCorrupt;
          }
        }
      }
      if (held < span) {
        for (int64_t r = 0; r < span; ++r) {
          if (!current[lo + r]) {
            std::memset(scratch + r * width, 0, static_cast<size_t>(row_bytes));
          }
        }
      }
    }
    for (int64_t k = i; k < j; ++k) {
      float* __restrict row = scratch + (rows[k] - lo) * width;
      const float* __restrict add = values + (src ? src[k] : k) * width;
      for (int64_t c = 0; c < width; ++c) row[c] += add[c];
    }
    const int rc = WriteFully(fd, buf, span * row_bytes, offset);
    if (rc != kOk) return rc;
    stats[kWriteCalls] += 1;
    stats[kBytesWritten] += span * row_bytes;
    if (crcs != nullptr) {
      if (held < span) {  // rows that were not current went back as zeros
        for (int64_t r = lo; r < lo + span; ++r) {
          if (!current[r]) crcs[r] = zeros_crc;
        }
      }
      uint32_t* got = CrcRoom(j - i);
      jgrind_crc32c_rows(buf, row_bytes, rows + i, lo, j - i, got);
      for (int64_t k = i; k < j; ++k) crcs[rows[k]] = got[k - i];
    }
    if (current != nullptr) std::memset(current + lo, 1, static_cast<size_t>(span));
    i = j;
  }
  return kOk;
}

}  // extern "C"
