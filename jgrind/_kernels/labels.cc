// jgrind native CPU kernels for label propagation (`jgrind.partition.partitioners`): every
// node's best label (the inner loop), the order in which moves are accepted, and the
// contraction of clusters into a coarser graph. Each gives its NumPy reference's result bit
// for bit; the tests compare them on random graphs.
//
// Best labels.
//
// For node v with neighbours u (CSR row v) of weight w (1 without weights), the value of label
// l is W(l) = the summed weight of v's neighbours labelled l; with a penalty it is
// W(l) / deg(v) - penalty[l] (deg: the row's summed weight). Candidates are the labels of v's
// neighbours, plus extra[v] with weight 0 when given. The best candidate has the highest value;
// among equal values the current label wins, then the highest 20-bit hash of (v or 0, l, salt),
// then the smallest label. gain = value(best) - value(current), where a current label that is
// not a candidate is worth 0 (no penalty) or -penalty[current].
//
// This is the NumPy code's result bit for bit: weights are whole numbers, so their sums are
// exact in any order, and the value's one division and one subtraction are the same IEEE
// operations in the same order (no FMA: ISO C++ mode does not contract). The NumPy code sorts
// every row by label through scipy (about 37 ns per CSR entry); here each thread sums a row's
// labels in a dense table when there are few labels (refinement: k partitions) and sorts them
// otherwise (clustering: a label per node), in one pass without E-sized temporaries.
//
// Threads pull ranges of rows from a shared counter; every row is computed by one thread
// alone, so the result does not depend on the thread count.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace {

constexpr uint64_t kM1 = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kM2 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kM3 = 0x94D049BB133111EBULL;
constexpr int64_t kDenseLabels = 1 << 16;  // a dense per-thread table up to this many labels
constexpr int64_t kRowsPerGrab = 4096;
constexpr int kFailed = 9;  // a C++ exception (out of memory) stopped the function

// The NumPy code's `_hash`: splitmix64's finaliser, top 20 bits.
inline int64_t Hash(uint64_t a, uint64_t b, uint64_t salt) {
  uint64_t x = a * kM1 + b * kM3 + salt;
  x ^= x >> 30;
  x *= kM2;
  x ^= x >> 27;
  x *= kM3;
  x ^= x >> 31;
  return static_cast<int64_t>(x >> 44);
}

struct Args {
  const int64_t* indptr;
  const void* indices;
  bool indices64;
  const int64_t* weights;  // nullptr: every edge weighs 1
  const int64_t* labels;
  int64_t n, k;
  uint64_t salt;
  bool per_node_ties;
  const double* penalty;  // nullptr: plain counts
  const int64_t* extra;   // nullptr: no extra candidate
  int64_t* best;
  double* gain;
};

struct Choice {
  bool any = false;
  double value = 0;
  int64_t key = -1, label = 0;
  double current = 0;  // the current label's value
};

// Offer candidate `l` with summed weight `w` (of a row with summed weight `deg`).
inline void Offer(const Args& a, int64_t v, int64_t l, int64_t w, double deg, Choice& c) {
  double value = static_cast<double>(w);
  if (a.penalty) value = value / std::max(deg, 1e-300) - a.penalty[l];
  const bool is_cur = l == a.labels[v];
  if (is_cur) c.current = value;
  const int64_t key = (static_cast<int64_t>(is_cur) << 21) |
                      Hash(a.per_node_ties ? static_cast<uint64_t>(v) : 0,
                           static_cast<uint64_t>(l), a.salt);
  if (!c.any || value > c.value || (value == c.value &&
                                    (key > c.key || (key == c.key && l < c.label)))) {
    c.any = true;
    c.value = value;
    c.key = key;
    c.label = l;
  }
}

template <typename Idx>
int Rows(const Args& a, std::atomic<int64_t>& next) {
  const Idx* indices = static_cast<const Idx*>(a.indices);
  const bool dense = a.k <= kDenseLabels;
  std::vector<int64_t> sum(dense ? a.k : 0, 0);
  std::vector<int64_t> touched;
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (label, weight), sorted per row
  for (;;) {
    const int64_t lo = next.fetch_add(kRowsPerGrab);
    if (lo >= a.n) return 0;
    const int64_t hi = std::min(a.n, lo + kRowsPerGrab);
    for (int64_t v = lo; v < hi; ++v) {
      const int64_t s = a.indptr[v], e = a.indptr[v + 1];
      Choice c;
      if (a.penalty) c.current = -a.penalty[a.labels[v]];
      int64_t deg = 0;
      if (dense) {
        touched.clear();
        for (int64_t j = s; j < e; ++j) {
          const int64_t l = a.labels[indices[j]];
          const int64_t w = a.weights ? a.weights[j] : 1;
          if (sum[l] == 0) touched.push_back(l);  // weights are positive: 0 means unseen
          sum[l] += w;
          deg += w;
        }
        if (a.extra && sum[a.extra[v]] == 0) touched.push_back(a.extra[v]);
        for (int64_t l : touched) {
          Offer(a, v, l, sum[l], static_cast<double>(deg), c);
          sum[l] = 0;
        }
      } else {
        pairs.clear();
        for (int64_t j = s; j < e; ++j) {
          const int64_t w = a.weights ? a.weights[j] : 1;
          pairs.emplace_back(a.labels[indices[j]], w);
          deg += w;
        }
        if (a.extra) pairs.emplace_back(a.extra[v], 0);
        std::sort(pairs.begin(), pairs.end());
        for (size_t i = 0; i < pairs.size();) {
          const int64_t l = pairs[i].first;
          int64_t w = 0;
          for (; i < pairs.size() && pairs[i].first == l; ++i) w += pairs[i].second;
          Offer(a, v, l, w, static_cast<double>(deg), c);
        }
      }
      a.best[v] = c.any ? c.label : a.labels[v];
      a.gain[v] = c.any ? c.value - c.current : 0.0;
    }
  }
}

// Runs `work()` on `num_threads` threads (the caller's included); fewer if threads cannot be
// made. Work is pulled from shared counters, so any number of threads gives the same result.
// An exception in any thread (std::bad_alloc) is rethrown here once all have stopped; the
// exported functions turn it into an error code, never an abort of the Python process.
template <typename F>
void Parallel(int64_t num_threads, F work) {
  std::exception_ptr error;
  std::mutex error_lock;
  auto guarded = [&] {
    try {
      work();
    } catch (...) {
      std::lock_guard<std::mutex> hold(error_lock);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  try {
    for (int64_t t = 1; t < num_threads; ++t) helpers.emplace_back(guarded);
  } catch (...) {
  }
  guarded();
  for (auto& t : helpers) t.join();
  if (error) std::rethrow_exception(error);
}

// Contraction: coarse row r gathers the fine rows of its members (members[mptr[r]..mptr[r+1]]),
// maps every neighbour u to its cluster inv[u], drops r itself, and sums the weights of equal
// clusters: scipy's COO -> CSR with duplicates summed, row by row. `count` pass: the number
// of distinct clusters per row into out_ptr[r + 1]; `fill` pass: the sorted clusters and
// their weights at out_ptr[r].
template <typename Idx>
void ContractRows(const int64_t* indptr, const Idx* indices, const int64_t* weights,
                  const int64_t* inv, const int64_t* mptr, const int64_t* members, int64_t c,
                  int64_t* out_ptr, void* out_indices, bool out64, int64_t* out_weights,
                  std::atomic<int64_t>& next) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (;;) {
    const int64_t lo = next.fetch_add(256);
    if (lo >= c) return;
    const int64_t hi = std::min(c, lo + 256);
    for (int64_t r = lo; r < hi; ++r) {
      pairs.clear();
      for (int64_t m = mptr[r]; m < mptr[r + 1]; ++m) {
        const int64_t v = members[m];
        for (int64_t j = indptr[v]; j < indptr[v + 1]; ++j) {
          const int64_t col = inv[indices[j]];
          if (col != r) pairs.emplace_back(col, weights ? weights[j] : 1);
        }
      }
      std::sort(pairs.begin(), pairs.end(),
                [](const auto& x, const auto& y) { return x.first < y.first; });
      int64_t distinct = 0, at = out_weights ? out_ptr[r] : 0;
      for (size_t i = 0; i < pairs.size();) {
        const int64_t col = pairs[i].first;
        int64_t w = 0;
        for (; i < pairs.size() && pairs[i].first == col; ++i) w += pairs[i].second;
        if (out_weights) {
          if (out64) static_cast<int64_t*>(out_indices)[at] = col;
          else static_cast<int32_t*>(out_indices)[at] = static_cast<int32_t>(col);
          out_weights[at++] = w;
        }
        ++distinct;
      }
      if (!out_weights) out_ptr[r + 1] = distinct;
    }
  }
}

// Rows [lo, hi): 1 if every one is sorted, else 0.
template <typename Idx>
int SortedRows(const int64_t* indptr, const Idx* indices, int64_t lo, int64_t hi) {
  for (int64_t v = lo; v < hi; ++v) {
    for (int64_t j = indptr[v] + 1; j < indptr[v + 1]; ++j)
      if (indices[j] < indices[j - 1]) return 0;
  }
  return 1;
}

// Rows [lo, hi) of a CSR whose rows are all sorted: 0 if some entry u > v of row v is not
// matched by as many entries v in row u as row v has u's, else 1. The entries below the
// diagonal are only counted (into `lower`, those above into `upper`): once every entry above
// is matched, equal totals leave no room for an unmatched entry below.
template <typename Idx>
int SymmetricRows(const int64_t* indptr, const Idx* indices, int64_t n, int64_t lo,
                  int64_t hi, std::atomic<int64_t>& lower, std::atomic<int64_t>& upper) {
  int64_t below = 0, above = 0;
  for (int64_t v = lo; v < hi; ++v) {
    for (int64_t j = indptr[v]; j < indptr[v + 1];) {
      const int64_t u = indices[j];
      int64_t run = 0;
      for (; j < indptr[v + 1] && indices[j] == u; ++j) ++run;
      if (u < 0 || u >= n) return 0;
      if (u < v) below += run;
      if (u <= v) continue;
      above += run;
      const auto range = std::equal_range(indices + indptr[u], indices + indptr[u + 1],
                                          static_cast<Idx>(v));
      if (range.second - range.first != run) return 0;
    }
  }
  lower += below;
  upper += above;
  return 1;
}

// `check(lo, hi)` over all rows in parallel; 1 if it returned 1 for every range, else 0
// (stopping early).
template <typename F>
int AllRows(int64_t n, int64_t num_threads, F check) {
  constexpr int64_t kGrab = 16384;
  std::atomic<int64_t> next{0};
  std::atomic<int> all{1};
  Parallel(std::max<int64_t>(1, std::min<int64_t>(num_threads, n / kGrab + 1)), [&] {
    for (;;) {
      const int64_t lo = next.fetch_add(kGrab);
      if (lo >= n || all.load() == 0) return;
      if (check(lo, std::min(n, lo + kGrab)) != 1) all.store(0);
    }
  });
  return all.load();
}

// The order of `np.lexsort((random, -gain, target))` into `order` [m] and the groups' starts
// into `group_start` [k] (targets in [0, k)): candidates grouped by target (a counting sort:
// O(m + k)), each group by gain, highest first, then by `random`, then by position; groups
// are sorted on several threads.
void GroupOrder(const int64_t* target, const double* gain, const double* random, int64_t m,
                int64_t k, int64_t* order, int64_t* group_start, int64_t num_threads) {
  for (int64_t g = 0; g < k; ++g) group_start[g] = 0;
  for (int64_t i = 0; i < m; ++i)
    if (target[i] + 1 < k) ++group_start[target[i] + 1];
  for (int64_t g = 1; g < k; ++g) group_start[g] += group_start[g - 1];
  // Records in group order (by position within a group), then each group sorted in place:
  // contiguous keys, not lookups through `order`. A total order (position last), so an
  // unstable sort gives lexsort's stable result.
  struct Record {
    double neg_gain, random;  // -gain: the key lexsort sees (so -0.0 == 0.0 as there)
    int64_t position;
    bool operator<(const Record& o) const {
      if (neg_gain != o.neg_gain) return neg_gain < o.neg_gain;
      if (random != o.random) return random < o.random;
      return position < o.position;
    }
  };
  std::vector<Record> records(static_cast<size_t>(m));
  {
    std::vector<int64_t> fill(group_start, group_start + k);
    for (int64_t i = 0; i < m; ++i) records[fill[target[i]]++] = Record{-gain[i], random[i], i};
  }
  num_threads = std::max<int64_t>(1, std::min<int64_t>(num_threads, m / 65536 + 1));
  const int64_t grab = std::max<int64_t>(1, k / (64 * num_threads));  // groups per grab
  std::atomic<int64_t> next{0};
  Parallel(num_threads, [&] {
    for (;;) {
      const int64_t first = next.fetch_add(grab);
      if (first >= k) return;
      for (int64_t g = first; g < std::min(k, first + grab); ++g) {
        const int64_t lo = group_start[g], hi = g + 1 < k ? group_start[g + 1] : m;
        if (hi - lo > 1) std::sort(records.begin() + lo, records.begin() + hi);
        for (int64_t i = lo; i < hi; ++i) order[i] = records[i].position;
      }
    }
  });
}

}  // namespace

extern "C" {

// Every function returns an error code rather than letting a C++ exception (out of memory)
// reach Python: kFailed (below) for the int ones, -1 for those returning a count, and -2 for
// jgrind_is_symmetric.

// The contraction's two passes (see ContractRows): out_weights == nullptr counts into
// out_ptr[1..c]; otherwise fills out_indices (int64 if out64, else int32) and out_weights
// from the row starts in out_ptr. Returns 0, or kFailed.
__attribute__((visibility("default"))) int jgrind_contract(
    const int64_t* indptr, const void* indices, int indices64, const int64_t* weights,
    const int64_t* inv, const int64_t* mptr, const int64_t* members, int64_t c,
    int64_t* out_ptr, void* out_indices, int out64, int64_t* out_weights,
    int64_t num_threads) try {
  std::atomic<int64_t> next{0};
  Parallel(std::min<int64_t>(std::max<int64_t>(num_threads, 1), (c + 255) / 256 + 1), [&] {
    if (indices64)
      ContractRows(indptr, static_cast<const int64_t*>(indices), weights, inv, mptr, members,
                   c, out_ptr, out_indices, out64 != 0, out_weights, next);
    else
      ContractRows(indptr, static_cast<const int32_t*>(indices), weights, inv, mptr, members,
                   c, out_ptr, out_indices, out64 != 0, out_weights, next);
  });
  return 0;
} catch (...) {
  return kFailed;
}

// GroupOrder (above) for NumPy arrays; returns 1 if a target is out of [0, k), kFailed, or 0.
__attribute__((visibility("default"))) int jgrind_group_order(
    const int64_t* target, const double* gain, const double* random, int64_t m, int64_t k,
    int64_t* order, int64_t* group_start, int64_t num_threads) try {
  for (int64_t i = 0; i < m; ++i)
    if (target[i] < 0 || target[i] >= k) return 1;
  GroupOrder(target, gain, random, m, k, order, group_start, num_threads);
  return 0;
} catch (...) {
  return kFailed;
}

// Label propagation's capacity-bounded moves (`_capacity_moves`), in two calls around the
// caller's draw of random tie keys (so that the random stream is NumPy's).
//
// `jgrind_capacity_fits`: for candidates `cand` [m] (moving from labels[v] to best[v]),
// computes every constraint's room [C, k] = floor(capacity - load) into `rooms`, and keeps
// (in place, in order) the candidates whose weight fits, for every constraint, in the room of
// their target plus what would leave it if every candidate moved. Returns how many are kept.
//
// `jgrind_capacity_accept`: orders the kept candidates by target, gain (highest first) and
// the random keys, finds the largest set in which every target accepts the longest prefix of
// its arrivals that fits in room + accepted departures (from "all accepted", rejecting until
// nothing changes; from "none accepted" if that takes over 200 rounds), applies the moves to
// `labels` and returns their number. Node weights are int64 (nullptr: ones); loads are exact
// integers, as NumPy's float64 sums of them are below 2^53.
__attribute__((visibility("default"))) int64_t jgrind_capacity_fits(
    const int64_t* labels, const int64_t* best, int64_t n, int64_t* cand, int64_t m, int64_t k,
    int64_t num_constraints, const int64_t* const* node_weights, const double* capacities,
    int64_t* rooms) try {
  std::vector<int64_t> load(k), leaving(k);
  std::vector<char> fits(m, 1);
  for (int64_t c = 0; c < num_constraints; ++c) {
    const int64_t* w = node_weights[c];
    std::fill(load.begin(), load.end(), 0);
    std::fill(leaving.begin(), leaving.end(), 0);
    for (int64_t v = 0; v < n; ++v) load[labels[v]] += w ? w[v] : 1;
    int64_t* room = rooms + c * k;
    for (int64_t l = 0; l < k; ++l)
      room[l] = static_cast<int64_t>(std::floor(capacities[c] - static_cast<double>(load[l])));
    for (int64_t i = 0; i < m; ++i) leaving[labels[cand[i]]] += w ? w[cand[i]] : 1;
    for (int64_t i = 0; i < m; ++i) {
      const int64_t v = cand[i];
      if ((w ? w[v] : 1) > room[best[v]] + leaving[best[v]]) fits[i] = 0;
    }
  }
  int64_t kept = 0;
  for (int64_t i = 0; i < m; ++i)
    if (fits[i]) cand[kept++] = cand[i];
  return kept;
} catch (...) {
  return -1;
}

__attribute__((visibility("default"))) int64_t jgrind_capacity_accept(
    int64_t* labels, const int64_t* best, const double* gain, const int64_t* cand, int64_t m,
    int64_t k, int64_t num_constraints, const int64_t* const* node_weights,
    const int64_t* rooms, const double* random, int64_t num_threads) try {
  std::vector<int64_t> target(m), cand_gain_order(m), group_start(k);
  {
    std::vector<double> cand_gain(m);
    for (int64_t i = 0; i < m; ++i) {
      target[i] = best[cand[i]];
      cand_gain[i] = gain[cand[i]];
    }
    GroupOrder(target.data(), cand_gain.data(), random, m, k, cand_gain_order.data(),
               group_start.data(), num_threads);
  }
  std::vector<int64_t> node(m), tgt(m), src(m);
  for (int64_t i = 0; i < m; ++i) {
    node[i] = cand[cand_gain_order[i]];
    tgt[i] = best[node[i]];
    src[i] = labels[node[i]];
  }
  std::vector<int64_t>().swap(target);
  std::vector<int64_t>().swap(cand_gain_order);
  // weight[c][i]: candidate i's weight; cum[c][i]: its group's weight up to and including i
  // (the arrivals before it fit first)
  const int64_t C = num_constraints;
  std::vector<int64_t> weight(static_cast<size_t>(C * m)), cum(static_cast<size_t>(C * m));
  for (int64_t c = 0; c < C; ++c) {
    const int64_t* w = node_weights[c];
    int64_t run = 0;
    for (int64_t i = 0; i < m; ++i) {
      if (i == 0 || tgt[i] != tgt[i - 1]) run = 0;
      weight[c * m + i] = w ? w[node[i]] : 1;
      run += weight[c * m + i];
      cum[c * m + i] = run;
    }
  }
  // departed[c][l]: the weight of the accepted moves out of l, kept up to date as moves are
  // accepted or rejected (a round then costs one pass over the candidates)
  std::vector<char> accepted(m), next(m);
  std::vector<int64_t> departed(static_cast<size_t>(C * k));
  auto accept = [&](int64_t i, int64_t sign) {
    for (int64_t c = 0; c < C; ++c) departed[c * k + src[i]] += sign * weight[c * m + i];
  };
  auto allowed = [&] {  // next = the rule applied to `accepted`; whether it changed anything
    bool changed = false;
    for (int64_t i = 0; i < m; ++i) {
      char ok = 1;
      for (int64_t c = 0; c < C && ok; ++c)
        ok = cum[c * m + i] <= rooms[c * k + tgt[i]] + departed[c * k + tgt[i]];
      changed |= ok != accepted[i];
      next[i] = ok;
    }
    if (changed) {
      for (int64_t i = 0; i < m; ++i)
        if (next[i] != accepted[i]) accept(i, next[i] ? 1 : -1);
      accepted.swap(next);
    }
    return changed;
  };
  std::fill(accepted.begin(), accepted.end(), 1);
  for (int64_t i = 0; i < m; ++i) accept(i, 1);
  bool converged = false;
  for (int round = 0; round < 200; ++round) {  // top-down: towards the largest fixed point
    if (!allowed()) {
      converged = true;
      break;
    }
  }
  if (!converged) {  // pathological chains: bottom-up is feasible at every step
    std::fill(accepted.begin(), accepted.end(), 0);
    std::fill(departed.begin(), departed.end(), 0);
    for (int round = 0; round < 200; ++round)
      if (!allowed()) break;
  }
  int64_t moves = 0;
  for (int64_t i = 0; i < m; ++i) {
    if (!accepted[i]) continue;
    labels[node[i]] = tgt[i];
    ++moves;
  }
  return moves;
} catch (...) {
  return -1;
}

// Returns 0, 1 when a weight is not positive (the dense table needs weights > 0), or kFailed. Labels,
// extra labels and indices must lie in range (the caller checks them: they are its own arrays).
__attribute__((visibility("default"))) int jgrind_best_labels(
    const int64_t* indptr, const void* indices, int indices64, const int64_t* weights,
    const int64_t* labels, int64_t n, int64_t k, uint64_t salt, int per_node_ties,
    const double* penalty, const int64_t* extra, int64_t* best, double* gain,
    int64_t num_threads) try {
  if (weights) {
    for (int64_t j = 0, e = indptr[n]; j < e; ++j)
      if (weights[j] <= 0) return 1;
  }
  const Args a{indptr, indices, indices64 != 0, weights, labels, n, k, salt,
               per_node_ties != 0, penalty, extra, best, gain};
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  num_threads = std::min<int64_t>(num_threads, (n + kRowsPerGrab - 1) / kRowsPerGrab);
  std::atomic<int64_t> next{0};
  Parallel(num_threads, [&] { a.indices64 ? Rows<int64_t>(a, next) : Rows<int32_t>(a, next); });
  return 0;
} catch (...) {
  return kFailed;
}

// Whether the CSR's pattern (with multiplicities, self loops aside) equals its transpose's,
// without building the transpose: 1 (symmetric), 0 (not), -1 (some row is unsorted: the
// caller must decide another way).
__attribute__((visibility("default"))) int jgrind_is_symmetric(
    const int64_t* indptr, const void* indices, int indices64, int64_t n,
    int64_t num_threads) try {
  auto run = [&](auto* idx) {
    if (!AllRows(n, num_threads,
                 [&](int64_t lo, int64_t hi) { return SortedRows(indptr, idx, lo, hi); }))
      return -1;
    std::atomic<int64_t> lower{0}, upper{0};
    const int matched = AllRows(n, num_threads, [&](int64_t lo, int64_t hi) {
      return SymmetricRows(indptr, idx, n, lo, hi, lower, upper);
    });
    return static_cast<int>(matched && lower.load() == upper.load());
  };
  return indices64 ? run(static_cast<const int64_t*>(indices))
                   : run(static_cast<const int32_t*>(indices));
} catch (...) {
  return -2;
}

}  // extern "C"
