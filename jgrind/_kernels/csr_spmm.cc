// jgrind native CPU kernel: CSR sparse matrix times dense matrix.
//
//   Y[i, :] = sum_{k in [indptr[i], indptr[i+1])} data[k] * X[indices[k], :]
//
// float32 values, int32 indptr/indices, X row-major [C, F], Y row-major [R, F].
//
// Exposed two ways:
//   * JgrindCsrSpmmF32: an XLA FFI handler (typed FFI, api_version 1 / custom call v4) for
//     `jax.ffi.ffi_call`, attribute `num_threads` (int64; <= 0 means automatic).
//   * jgrind_csr_spmm_f32: a plain C function (used by tests and tools through ctypes).
//
// Performance notes (the product is bound by the random gathers of X rows):
//   * Rows are cut into ~16 chunks per thread of equal cost = nonzeros + rows (binary search on
//     indptr[i] + i), so power-law degree distributions stay balanced; threads pull chunks from
//     a shared counter, so a preempted thread does not hold the others up.
//   * Threads come from a persistent pool (created on the first multi-threaded call); the
//     calling thread works too. No heap allocation per call. Every row is summed by one thread
//     in a fixed order: results are bitwise independent of the thread count.
//   * Each output row is accumulated in registers over a column tile of up to 256 floats
//     (AVX-512: 16 zmm accumulators; last vector masked), then stored once. X rows of upcoming
//     nonzeros are software-prefetched to keep many cache misses in flight.
//   * Without AVX-512 a portable path accumulates into the output row with plain loops that
//     g++ -O3 auto-vectorises.
//   * Out-of-range column indices or a malformed indptr are detected (a compare per nonzero)
//     and reported as an error instead of reading out of bounds.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sched.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jgrind {
namespace {

// ---------------------------------------------------------------------------------------------
// Thread pool
// ---------------------------------------------------------------------------------------------

// fn(ctx, chunk, nchunks) processes chunk `chunk` of `nchunks`.
using TaskFn = void (*)(void* ctx, int64_t chunk, int64_t nchunks);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A persistent pool whose threads and the calling thread pull chunks of one job from a shared
// counter. Dynamic scheduling keeps all participants busy even when one of them is preempted
// (other processes, XLA's own threads), which a static split cannot.
//
// Job state lives in the pool, not in the caller's frame, and a job is "closed" before Run
// returns: a worker that wakes up late finds it closed and never touches the caller's context.
class ThreadPool {
 public:
  explicit ThreadPool(int nworkers) {
    workers_.reserve(nworkers);
    for (int w = 0; w < nworkers; ++w) {
      try {
        workers_.emplace_back([this] { Loop(); });
      } catch (...) {
        break;  // fewer threads than asked for: still correct
      }
    }
  }
  // Never destroyed (see GetPool): joining threads during static destruction at process exit
  // is a classic source of hangs.

  int num_workers() const { return static_cast<int>(workers_.size()); }

  // Runs fn(ctx, c, nchunks) for every c in [0, nchunks) on the caller and up to
  // `max_helpers` pool threads; returns when all chunks are done.
  void Run(TaskFn fn, void* ctx, int64_t nchunks, int max_helpers) {
    std::lock_guard<std::mutex> dispatch(dispatch_mu_);  // one job at a time
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = fn;
      ctx_ = ctx;
      nchunks_ = nchunks;
      helpers_left_ = max_helpers;
      next_.store(0, std::memory_order_relaxed);
      done_.store(0, std::memory_order_relaxed);
      open_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    Work(fn, ctx, nchunks);
    // Wait for chunks still running on workers: spin briefly (they usually finish at about the
    // same time), then sleep.
    for (int spin = 0; spin < 20000 && done_.load(std::memory_order_acquire) < nchunks; ++spin)
      CpuRelax();
    if (done_.load(std::memory_order_acquire) < nchunks) {
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, [&] { return done_.load(std::memory_order_acquire) >= nchunks; });
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = false;  // from now on no worker joins this job
    }
    // Workers that joined may still be between their last (failed) grab and leaving; that
    // window holds no work, so this wait is short.
    while (active_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }

 private:
  void Work(TaskFn fn, void* ctx, int64_t nchunks) {
    for (;;) {
      const int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= nchunks) return;
      fn(ctx, c, nchunks);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == nchunks) {
        std::lock_guard<std::mutex> lk(mu_);
        done_cv_.notify_one();
      }
    }
  }

  void Loop() {
    uint64_t seen = 0;
    for (;;) {
      // Spin a little before sleeping: back-to-back kernel calls (a layer's forward, then the
      // next layer) then skip a futex wake-up. ~50 us of spinning at most.
      bool ready = false;
      for (int spin = 0; spin < 2000; ++spin) {
        if (generation_.load(std::memory_order_acquire) != seen) {
          ready = true;
          break;
        }
        CpuRelax();
      }
      TaskFn fn;
      void* ctx;
      int64_t nchunks;
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (!ready)
          cv_.wait(lk, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        seen = generation_.load(std::memory_order_acquire);
        if (!open_ || helpers_left_ <= 0) continue;
        --helpers_left_;
        active_.fetch_add(1, std::memory_order_relaxed);
        fn = fn_;
        ctx = ctx_;
        nchunks = nchunks_;
      }
      Work(fn, ctx, nchunks);
      active_.fetch_sub(1, std::memory_order_release);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex dispatch_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> active_{0};
  // Guarded by mu_:
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t nchunks_ = 0;
  int helpers_left_ = 0;
  bool open_ = false;
};

std::mutex g_pool_mu;
ThreadPool* g_pool = nullptr;  // intentionally leaked
bool g_atfork_registered = false;

void ForgetPoolInChild() {
  // After fork() only the forking thread exists: the old pool's workers are gone. Leak it and
  // build a new one on demand. The mutex is re-initialised in place for the same reason.
  g_pool = nullptr;
  new (&g_pool_mu) std::mutex();
}

// A pool with at least `nworkers` workers, or nullptr if threads cannot be created.
ThreadPool* GetPool(int nworkers) {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_atfork_registered) {
    pthread_atfork(nullptr, nullptr, ForgetPoolInChild);
    g_atfork_registered = true;
  }
  if (g_pool == nullptr || g_pool->num_workers() < nworkers) {
    // A smaller old pool is leaked (its workers sleep forever); this happens at most a few
    // times, when a caller asks for more threads than before.
    try {
      g_pool = new ThreadPool(nworkers);
    } catch (...) {
      return nullptr;
    }
  }
  return g_pool;
}

int AutoThreads() {
  if (const char* env = std::getenv("JGRIND_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  int n = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int c = CPU_COUNT(&set);
    if (c > 0 && (n <= 0 || c < n)) n = c;
  }
  return n > 0 ? n : 1;
}

// ---------------------------------------------------------------------------------------------
// Kernel
// ---------------------------------------------------------------------------------------------

struct Problem {
  const int32_t* indptr;
  const int32_t* indices;
  const float* data;
  const float* x;
  float* y;
  int64_t rows;
  int64_t cols;   // rows of X
  int64_t feat;   // F
  int64_t nnz_cap;  // length of indices / data
  std::atomic<int> error{0};  // 1: bad column index, 2: bad indptr
};

// Software prefetch of the X rows of upcoming nonzeros. Measured on a 2-core Zen 4 VM (random
// 1M x 1M, 10M nonzeros): 16 nonzeros ahead into L2 (prefetcht1) beat 8/32 ahead and beat
// prefetching into L1 (which exhausts the L1 miss buffers) by 1.3-1.6x for F = 128..256.
#ifndef JGRIND_PREFETCH_DISTANCE
#define JGRIND_PREFETCH_DISTANCE 16
#endif
#ifndef JGRIND_PREFETCH_LOCALITY
#define JGRIND_PREFETCH_LOCALITY 2
#endif
constexpr int kPrefetchDistance = JGRIND_PREFETCH_DISTANCE;  // nonzeros ahead

// First row of part `p` of `nparts`, balancing cost(i) = indptr[i] - indptr[0] + i.
int64_t SplitRow(const Problem& P, int64_t p, int64_t nparts) {
  if (p <= 0) return 0;
  if (p >= nparts) return P.rows;
  const int64_t base = P.indptr[0];
  const int64_t total = (static_cast<int64_t>(P.indptr[P.rows]) - base) + P.rows;
  const int64_t target = total * p / nparts;
  int64_t lo = 0, hi = P.rows;  // smallest i with cost(i) >= target
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(P.indptr[mid]) - base + mid < target)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

inline bool RowBounds(Problem& P, int64_t i, int64_t& k0, int64_t& k1) {
  k0 = P.indptr[i];
  k1 = P.indptr[i + 1];
  if (k0 < 0 || k1 < k0 || k1 > P.nnz_cap) {
    P.error.store(2, std::memory_order_relaxed);
    return false;
  }
  return true;
}

// Prefetches every cache line of [p, p + nbytes).
inline void PrefetchRow(const float* p, int64_t nbytes) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(nbytes);
  for (; a < end; a += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(a), 0, JGRIND_PREFETCH_LOCALITY);
}

#if defined(__AVX512F__)

#define JGRIND_INLINE inline __attribute__((always_inline))

template <int NV>
struct Acc {
  __m512 v[NV];
};

template <int NV>
JGRIND_INLINE void Zero(Acc<NV>& a) {
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) a.v[v] = _mm512_setzero_ps();
}

// a += s * xr[0 : 16 * (NV - 1) + popcount(last)]
template <int NV>
JGRIND_INLINE void Fma(Acc<NV>& a, float s, const float* xr, __mmask16 last) {
  const __m512 b = _mm512_set1_ps(s);
#pragma GCC unroll 16
  for (int v = 0; v < NV - 1; ++v) a.v[v] = _mm512_fmadd_ps(b, _mm512_loadu_ps(xr + 16 * v), a.v[v]);
  a.v[NV - 1] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(last, xr + 16 * (NV - 1)), a.v[NV - 1]);
}

// Columns [c0, c0 + 16 * (NV - 1) + tail) of rows [r0, r1), tail in [1, 16] (mask `last`).
// For NV <= 8 two nonzeros are processed per step into two accumulator sets: with few vectors
// per row the FMA latency chain, not the load throughput, would otherwise bound in-cache speed.
template <int NV>
void TileAvx512(Problem& P, int64_t r0, int64_t r1, int64_t c0, __mmask16 last) {
  constexpr bool kPairs = NV <= 8;
  const int64_t F = P.feat;
  const uint64_t C = static_cast<uint64_t>(P.cols);
  const int32_t* __restrict ind = P.indices;
  const float* __restrict val = P.data;
  const float* __restrict X = P.x + c0;
  const int64_t tile_bytes = 4 * (16 * (NV - 1) + __builtin_popcount(last));
  int64_t kend = P.indptr[r1];
  if (kend > P.nnz_cap) kend = P.nnz_cap;
  auto prefetch = [&](int64_t k) __attribute__((always_inline)) {
    const int64_t kp = k + kPrefetchDistance;
    if (kp < kend) {
      const uint32_t jp = static_cast<uint32_t>(ind[kp]);
      if (jp < C) PrefetchRow(X + static_cast<int64_t>(jp) * F, tile_bytes);
    }
  };
  for (int64_t i = r0; i < r1; ++i) {
    int64_t k0, k1;
    if (!RowBounds(P, i, k0, k1)) return;
    Acc<NV> acc0, acc1;
    Zero(acc0);
    if constexpr (kPairs) Zero(acc1);
    int64_t k = k0;
    if constexpr (kPairs) {
      for (; k + 2 <= k1; k += 2) {
        prefetch(k);
        prefetch(k + 1);
        const uint32_t j0 = static_cast<uint32_t>(ind[k]);
        const uint32_t j1 = static_cast<uint32_t>(ind[k + 1]);
        if (__builtin_expect((j0 >= C) | (j1 >= C), 0)) {
          P.error.store(1, std::memory_order_relaxed);
          return;
        }
        Fma(acc0, val[k], X + static_cast<int64_t>(j0) * F, last);
        Fma(acc1, val[k + 1], X + static_cast<int64_t>(j1) * F, last);
      }
    }
    for (; k < k1; ++k) {
      prefetch(k);
      const uint32_t j = static_cast<uint32_t>(ind[k]);
      if (__builtin_expect(j >= C, 0)) {
        P.error.store(1, std::memory_order_relaxed);
        return;
      }
      Fma(acc0, val[k], X + static_cast<int64_t>(j) * F, last);
    }
    if constexpr (kPairs) {
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc0.v[v] = _mm512_add_ps(acc0.v[v], acc1.v[v]);
    }
    float* yr = P.y + i * F + c0;
#pragma GCC unroll 16
    for (int v = 0; v < NV - 1; ++v) _mm512_storeu_ps(yr + 16 * v, acc0.v[v]);
    _mm512_mask_storeu_ps(yr + 16 * (NV - 1), last, acc0.v[NV - 1]);
  }
}

using TileFn = void (*)(Problem&, int64_t, int64_t, int64_t, __mmask16);

constexpr TileFn kTiles[17] = {
    nullptr,          TileAvx512<1>,  TileAvx512<2>,  TileAvx512<3>,  TileAvx512<4>,
    TileAvx512<5>,    TileAvx512<6>,  TileAvx512<7>,  TileAvx512<8>,  TileAvx512<9>,
    TileAvx512<10>,   TileAvx512<11>, TileAvx512<12>, TileAvx512<13>, TileAvx512<14>,
    TileAvx512<15>,   TileAvx512<16>};

void RunRows(Problem& P, int64_t r0, int64_t r1) {
  if (r0 >= r1) return;
  const int64_t F = P.feat;
  constexpr int64_t kTileCols = 256;  // 16 zmm accumulators
  // Row blocks bound the working set when F > 256 needs several column tiles: the second tile
  // of a block re-reads indices/data that are still in cache.
  const int64_t block = F > kTileCols ? 256 : (r1 - r0);
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t c0 = 0; c0 < F; c0 += kTileCols) {
      const int64_t w = std::min(kTileCols, F - c0);
      const int nv = static_cast<int>((w + 15) / 16);
      const int tail = static_cast<int>(w - 16 * (nv - 1));
      const __mmask16 last = static_cast<__mmask16>((1u << tail) - 1u);
      kTiles[nv](P, b0, b1, c0, last);
      if (P.error.load(std::memory_order_relaxed)) return;
    }
  }
}

#else  // portable path

void RunRows(Problem& P, int64_t r0, int64_t r1) {
  const int64_t F = P.feat;
  const int64_t C = P.cols;
  const int32_t* __restrict ind = P.indices;
  const float* __restrict val = P.data;
  const float* __restrict X = P.x;
  if (r0 >= r1) return;
  int64_t kend = P.indptr[r1];
  if (kend > P.nnz_cap) kend = P.nnz_cap;
  const int64_t row_bytes = F * 4;
  for (int64_t i = r0; i < r1; ++i) {
    int64_t k0, k1;
    if (!RowBounds(P, i, k0, k1)) return;
    float* __restrict yr = P.y + i * F;
    for (int64_t f = 0; f < F; ++f) yr[f] = 0.0f;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t kp = k + kPrefetchDistance;
      if (kp < kend) {
        const uint32_t jp = static_cast<uint32_t>(ind[kp]);
        if (jp < static_cast<uint64_t>(C)) PrefetchRow(X + jp * F, row_bytes);
      }
      const uint32_t j = static_cast<uint32_t>(ind[k]);
      if (__builtin_expect(j >= static_cast<uint64_t>(C), 0)) {
        P.error.store(1, std::memory_order_relaxed);
        return;
      }
      const float a = val[k];
      const float* __restrict xr = X + static_cast<int64_t>(j) * F;
      for (int64_t f = 0; f < F; ++f) yr[f] += a * xr[f];
    }
  }
}

#endif

void RunChunk(void* ctx, int64_t chunk, int64_t nchunks) {
  Problem& P = *static_cast<Problem*>(ctx);
  if (P.error.load(std::memory_order_relaxed)) return;
  const int64_t r0 = SplitRow(P, chunk, nchunks), r1 = SplitRow(P, chunk + 1, nchunks);
  // With a non-decreasing indptr the chunks tile [0, rows) exactly and RowBounds checks every
  // row; a chunk running backwards means indptr decreases somewhere.
  if (r0 > r1) {
    P.error.store(2, std::memory_order_relaxed);
    return;
  }
  RunRows(P, r0, r1);
}

// Returns 0 on success, 1 for a column index out of range, 2 for a malformed indptr.
int Spmm(const int32_t* indptr, const int32_t* indices, const float* data, const float* x,
         float* y, int64_t rows, int64_t cols, int64_t feat, int64_t nnz_cap,
         int64_t num_threads) {
  if (rows <= 0 || feat <= 0) return 0;
  if (indptr[0] < 0 || indptr[rows] < indptr[0] || indptr[rows] > nnz_cap) return 2;
  Problem P;
  P.indptr = indptr;
  P.indices = indices;
  P.data = data;
  P.x = x;
  P.y = y;
  P.rows = rows;
  P.cols = cols;
  P.feat = feat;
  P.nnz_cap = nnz_cap;

  int64_t nt;
  if (num_threads > 0) {
    nt = std::min<int64_t>(num_threads, 1024);  // explicit: honoured (tests rely on it)
  } else {
    // Automatic: enough work per thread to amortise a wake-up (~10 us), about 256K
    // multiply-adds per thread.
    const int64_t work = (static_cast<int64_t>(indptr[rows]) - indptr[0] + rows) * feat;
    nt = std::min<int64_t>(AutoThreads(), std::max<int64_t>(1, work >> 18));
  }
  nt = std::min<int64_t>(nt, rows);
  ThreadPool* pool = nt > 1 ? GetPool(static_cast<int>(nt) - 1) : nullptr;
  if (pool == nullptr) {
    RunChunk(&P, 0, 1);
  } else {
    // ~16 chunks per thread (balanced by cost, see SplitRow), each at least ~64K multiply-adds.
    const int64_t work = (static_cast<int64_t>(indptr[rows]) - indptr[0] + rows) * feat;
    const int64_t nchunks =
        std::min<int64_t>({rows, 16 * nt, std::max<int64_t>(nt, work >> 16)});
    pool->Run(RunChunk, &P, nchunks, static_cast<int>(nt) - 1);
  }
  return P.error.load();
}

const char* ErrorMessage(int code) {
  switch (code) {
    case 1:
      return "jgrind csr_spmm: a column index is out of range [0, C)";
    case 2:
      return "jgrind csr_spmm: malformed indptr (negative, decreasing, or past the end of "
             "indices)";
    default:
      return "jgrind csr_spmm: unknown error";
  }
}

// ---------------------------------------------------------------------------------------------
// XLA FFI handler
// ---------------------------------------------------------------------------------------------

ffi::Error CsrSpmmImpl(ffi::Buffer<ffi::S32> indptr, ffi::Buffer<ffi::S32> indices,
                       ffi::Buffer<ffi::F32> data, ffi::Buffer<ffi::F32> x,
                       ffi::ResultBuffer<ffi::F32> y, int64_t num_threads) {
  auto xd = x.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 2 || yd.size() != 2)
    return ffi::Error::InvalidArgument("jgrind csr_spmm: x and y must be rank 2");
  if (indptr.dimensions().size() != 1 || indices.dimensions().size() != 1 ||
      data.dimensions().size() != 1)
    return ffi::Error::InvalidArgument("jgrind csr_spmm: indptr/indices/data must be rank 1");
  const int64_t R = yd[0], F = yd[1], C = xd[0];
  if (xd[1] != F)
    return ffi::Error::InvalidArgument("jgrind csr_spmm: x and y have different widths");
  if (static_cast<int64_t>(indptr.element_count()) != R + 1)
    return ffi::Error::InvalidArgument("jgrind csr_spmm: indptr must have R + 1 entries");
  const int64_t nnz = static_cast<int64_t>(indices.element_count());
  if (static_cast<int64_t>(data.element_count()) != nnz)
    return ffi::Error::InvalidArgument("jgrind csr_spmm: indices and data differ in length");
  int rc = Spmm(indptr.typed_data(), indices.typed_data(), data.typed_data(), x.typed_data(),
                y->typed_data(), R, C, F, nnz, num_threads);
  if (rc != 0) return ffi::Error::InvalidArgument(ErrorMessage(rc));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jgrind

XLA_FFI_DEFINE_HANDLER_SYMBOL(JgrindCsrSpmmF32, jgrind::CsrSpmmImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // indptr
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // indices
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()  // data
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()  // x
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()  // y
                                  .Attr<int64_t>("num_threads"));

extern "C" {

// Plain C entry point (ctypes): returns 0 on success, else an error code (see ErrorMessage).
__attribute__((visibility("default"))) int jgrind_csr_spmm_f32(
    const int32_t* indptr, const int32_t* indices, const float* data, const float* x, float* y,
    int64_t rows, int64_t cols, int64_t feat, int64_t nnz_cap, int64_t num_threads) {
  return jgrind::Spmm(indptr, indices, data, x, y, rows, cols, feat, nnz_cap, num_threads);
}

__attribute__((visibility("default"))) int jgrind_kernel_abi_version() { return 7; }

__attribute__((visibility("default"))) const char* jgrind_kernel_isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__)
  return "avx2-autovec";
#else
  return "generic-autovec";
#endif
}

}  // extern "C"
