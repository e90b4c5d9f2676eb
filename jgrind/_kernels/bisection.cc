// jgrind native CPU kernels for the recursive bisection (`jgrind.partition.bisection`): greedy
// graph growing (`_grow`) and the balancing moves (`_balance`). Each gives its Python
// reference's result bit for bit; the tests compare them on random graphs.
//
// Growing: a min-heap of (-(2 * inside[u] - degree[u]), tie[u], u), stale entries skipped on
// the way out, as the Python code's heapq; the tie keys are a permutation, so the order of
// extraction is the same. The load is a sum of doubles in the order the nodes join, as there.
//
// Balancing: every move ranks all nodes, as the Python code's vectorised pass does. Edge
// weights are whole numbers, so the connection sums are exact in any order; the excesses are
// the same IEEE operations in the same order: per side, the constraints' terms summed in
// order (NumPy's reduction over the first axis), and the total summed constraint by
// constraint, side 0 before side 1 (the Python code's explicit loop). No FMA: ISO C++ mode
// does not contract.

#include <cstdint>
#include <functional>
#include <queue>
#include <tuple>
#include <vector>

namespace {

constexpr int kFailed = 9;  // a C++ exception (out of memory) stopped the function

double Excess(const std::vector<double>& load, const double* bounds, int64_t C) {
  double total = 0.0;
  for (int64_t c = 0; c < C; ++c)
    for (int s = 0; s < 2; ++s) {
      const double over = load[c * 2 + s] - bounds[c * 2 + s];
      total += over > 0.0 ? over : 0.0;
    }
  return total;
}

}  // namespace

extern "C" {

// Side 0 grown from order[] seeds until it holds about `target` of `measure` (see `_grow`).
// `indices` and `w` (entry weights, self loops 0) are int64; `side` [n] is written.
__attribute__((visibility("default"))) int jgrind_grow(
    const int64_t* indptr, const int64_t* indices, const int64_t* w, const double* measure,
    int64_t n, double target, const int64_t* tie, const int64_t* order, int64_t* side) try {
  std::vector<int64_t> degree(n, 0), inside(n, 0);
  for (int64_t v = 0; v < n; ++v) {
    for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) degree[v] += w[e];
    side[v] = 1;
  }
  using Entry = std::tuple<int64_t, int64_t, int64_t>;  // (-gain, tie, node)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  double load = 0.0;
  int64_t next_seed = 0;
  while (load < target) {
    while (!heap.empty()) {
      const auto& [key, t, u] = heap.top();
      if (side[u] != 0 && -key == 2 * inside[u] - degree[u]) break;
      heap.pop();  // stale: moved already, or its gain changed since
    }
    int64_t v;
    if (!heap.empty()) {
      v = std::get<2>(heap.top());
      heap.pop();
    } else {
      while (next_seed < n && side[order[next_seed]] == 0) ++next_seed;
      if (next_seed == n) break;
      v = order[next_seed];
    }
    if (load > 0 && load + measure[v] - target > target - load) break;
    side[v] = 0;
    load += measure[v];
    for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) {
      const int64_t u = indices[e];
      if (side[u] == 1 && w[e]) {
        inside[u] += w[e];
        heap.emplace(-(2 * inside[u] - degree[u]), tie[u], u);
      }
    }
  }
  return 0;
} catch (...) {
  return kFailed;
}

// The balancing moves of `_balance`, in place on `side`: `shares` [C, n] (row-major),
// `bounds` [C, 2]; the excess left goes to *excess_left. Returns 0 or kFailed.
__attribute__((visibility("default"))) int jgrind_balance(
    const int64_t* indptr, const int64_t* indices, const int64_t* w, int64_t* side,
    const double* shares, const double* bounds, int64_t C, int64_t n,
    double* excess_left) try {
  std::vector<double> load(C * 2, 0.0), to_side0(n, 0.0), degree(n, 0.0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t v = 0; v < n; ++v) load[c * 2 + side[v]] += shares[c * n + v];
  for (int64_t v = 0; v < n; ++v)
    for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) {
      degree[v] += static_cast<double>(w[e]);
      to_side0[v] += static_cast<double>(side[indices[e]] == 0 ? w[e] : 0);
    }
  double excess = Excess(load, bounds, C);
  for (int64_t step = 0; step < n; ++step) {
    if (excess <= 0) break;
    int64_t best = -1;
    double best_score = 0.0, best_after = 0.0;
    for (int64_t v = 0; v < n; ++v) {
      const double sign = side[v] == 0 ? 1.0 : -1.0;
      double over0 = 0.0, over1 = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        const double leaving = sign * shares[c * n + v];
        const double a = load[c * 2] - leaving - bounds[c * 2];
        const double b = load[c * 2 + 1] + leaving - bounds[c * 2 + 1];
        const double a0 = a > 0.0 ? a : 0.0, b0 = b > 0.0 ? b : 0.0;
        over0 = c == 0 ? a0 : over0 + a0;
        over1 = c == 0 ? b0 : over1 + b0;
      }
      const double after = over0 + over1;
      if (!(after < excess)) continue;
      const double same = side[v] == 0 ? to_side0[v] : degree[v] - to_side0[v];
      const double gain = degree[v] - 2 * same;
      const double drop = excess - after;
      const double score = gain < 0 ? gain / drop : gain * drop;
      if (best < 0 || score > best_score || (score == best_score && after < best_after)) {
        best = v;
        best_score = score;
        best_after = after;
      }
    }
    if (best < 0) break;
    const int64_t was = side[best];
    side[best] = 1 - was;
    for (int64_t c = 0; c < C; ++c) {
      load[c * 2 + was] -= shares[c * n + best];
      load[c * 2 + 1 - was] += shares[c * n + best];
    }
    for (int64_t e = indptr[best]; e < indptr[best + 1]; ++e)
      to_side0[indices[e]] += static_cast<double>(was == 1 ? w[e] : -w[e]);
    excess = Excess(load, bounds, C);
  }
  *excess_left = excess;
  return 0;
} catch (...) {
  return kFailed;
}

}  // extern "C"
