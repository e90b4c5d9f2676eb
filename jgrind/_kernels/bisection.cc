// jgrind native CPU kernels for the recursive bisection (`jgrind.partition.bisection`): greedy
// graph growing (`_grow`) and the balancing moves (`_balance`). Each gives its Python
// reference's result bit for bit; the tests compare them on random graphs.
//
// Growing: a min-heap of (-(2 * inside[u] - degree[u]), tie[u], u), stale entries skipped on
// the way out, as the Python code's heapq; the tie keys are a permutation, so the order of
// extraction is the same. The load is a sum of doubles in the order the nodes join, as there.
//
// Balancing: every move takes the node the Python code's vectorised ranking of all nodes
// takes, found from upper bounds on the scores (see `jgrind_balance`). Edge
// weights are whole numbers, so the connection sums are exact in any order; the excesses are
// the same IEEE operations in the same order: per side, the constraints' terms summed in
// order (NumPy's reduction over the first axis), and the total summed constraint by
// constraint, side 0 before side 1 (the Python code's explicit loop). No FMA: ISO C++ mode
// does not contract.

#include <algorithm>
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

// The balancing moves of `_balance`, in place on `side`: `shares` [C, n] (row-major, each
// row a fraction of its total), `bounds` [C, 2]; the excess left goes to *excess_left.
// Returns 0 or kFailed.
//
// Each move takes the node the Python code's full ranking takes, without scoring every node.
// Which (constraint, side) terms of the summed excess E are positive (the pattern `over`)
// bounds what a move of v off side s can do: the terms over on s fall by at most v's shares
// in them, the terms not over on s stay zero, and the terms over on the other side rise by
// v's shares in them. So the move lowers E by at most Reach(v) = min(E, those shares less
// these) and scores at most Bound(gain, Reach(v)); while the pattern and v's gain stay as they
// are, that bound holds (E only falls). Each side's nodes sit in a max-heap by their bounds;
// a move is found by taking nodes off the heaps of the sides with a positive term, the highest
// bound first (off the other side no move lowers E: its terms are zeros before and after,
// exactly), until the next bound falls below the best score found. Every node that could
// score as high, ties included, has then been scored, by the same operations as there, so the
// choice and its tie-breaks are the full ranking's. After the move, the moved node and its
// neighbours (their gains changed) are keyed again, and so are the nodes taken off; earlier
// entries are stale (by a stamp). A constraint near its bound makes the pattern flip back and
// forth from one move to the next, so the heaps of the last few patterns are kept, and kept
// up to date, rather than built again at each flip. kSlack covers the rounding of E, of the
// shares' sums and of the scored excesses (sums of a few terms of at most 1): a bound a little
// loose only costs a few more nodes scored.
__attribute__((visibility("default"))) int jgrind_balance(
    const int64_t* indptr, const int64_t* indices, const int64_t* w, int64_t* side,
    const double* shares, const double* bounds, int64_t C, int64_t n,
    double* excess_left) try {
  constexpr double kSlack = 1e-9;
  constexpr size_t kPatternsKept = 4;
  std::vector<double> load(C * 2, 0.0), to_side0(n, 0.0), degree(n, 0.0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t v = 0; v < n; ++v) load[c * 2 + side[v]] += shares[c * n + v];
  for (int64_t v = 0; v < n; ++v)
    for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) {
      degree[v] += static_cast<double>(w[e]);
      to_side0[v] += static_cast<double>(side[indices[e]] == 0 ? w[e] : 0);
    }
  double excess = Excess(load, bounds, C);
  auto gain_of = [&](int64_t v) {
    const double same = side[v] == 0 ? to_side0[v] : degree[v] - to_side0[v];
    return degree[v] - 2 * same;
  };
  struct Entry {  // 16 bytes: the caller keeps n below 2^32, and a stamp stays below n + 2
    double bound;
    uint32_t node, stamp;
    bool operator<(const Entry& other) const { return bound < other.bound; }
  };
  struct Keyed {  // the heaps of one pattern
    std::vector<char> over;
    std::vector<Entry> heaps[2];  // max-heaps (std::push_heap)
    std::vector<uint32_t> stamp;  // an entry is current while its stamp is its node's
    int64_t used = 0;
  };
  std::vector<Keyed> kept;
  kept.reserve(kPatternsKept);  // `keyed` points into it
  // v's entry for `keyed`'s pattern, with E as it is now; false where v's move cannot lower E
  auto entry = [&](Keyed& keyed, int64_t v, Entry* out) {
    const int64_t s = side[v];
    double reach = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      if (keyed.over[c * 2 + s]) reach += shares[c * n + v];
      if (keyed.over[c * 2 + 1 - s]) reach -= shares[c * n + v];
    }
    const double most = (excess < reach ? excess : reach) + kSlack;
    if (most <= 0.0) return false;
    const double gain = gain_of(v);
    *out = {gain < 0 ? gain / most : gain * most, static_cast<uint32_t>(v), ++keyed.stamp[v]};
    return true;
  };
  auto push = [&](Keyed& keyed, int64_t v) {
    Entry e;
    if (!entry(keyed, v, &e)) {
      ++keyed.stamp[v];  // its earlier entry, if any, is stale
      return;
    }
    auto& heap = keyed.heaps[side[v]];
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end());
  };
  auto build = [&](Keyed& keyed) {
    keyed.stamp.assign(n, 0);
    for (auto& heap : keyed.heaps) heap.clear();
    Entry e;
    for (int64_t v = 0; v < n; ++v)
      if (entry(keyed, v, &e)) keyed.heaps[side[v]].push_back(e);
    for (auto& heap : keyed.heaps) std::make_heap(heap.begin(), heap.end());
  };
  std::vector<char> over(C * 2, 0);
  std::vector<int64_t> scored, changed, touched(n, -1);
  for (int64_t step = 0; step < n; ++step) {
    if (excess <= 0) break;
    for (int64_t i = 0; i < C * 2; ++i) over[i] = load[i] - bounds[i] > 0.0;
    Keyed* keyed = nullptr;
    for (auto& k : kept)
      if (k.over == over) keyed = &k;
    if (keyed == nullptr) {
      if (kept.size() < kPatternsKept) {
        kept.emplace_back();
        keyed = &kept.back();
      } else {
        keyed = &kept[0];  // the least recently used
        for (auto& k : kept)
          if (k.used < keyed->used) keyed = &k;
      }
      keyed->over = over;
      build(*keyed);
    } else if (keyed->heaps[0].size() + keyed->heaps[1].size() > static_cast<size_t>(2 * n)) {
      build(*keyed);  // stale entries outnumber the nodes
    }
    keyed->used = step;
    bool side_over[2] = {false, false};
    for (int64_t c = 0; c < C; ++c)
      for (int s = 0; s < 2; ++s) side_over[s] = side_over[s] || over[c * 2 + s];
    int64_t best = -1;
    double best_score = 0.0, best_after = 0.0;
    scored.clear();
    while (true) {
      int s = -1;  // the side whose next bound is highest: the nodes are scored in bound order
      for (int t = 0; t < 2; ++t) {
        if (!side_over[t]) continue;
        auto& heap = keyed->heaps[t];
        while (!heap.empty() && heap.front().stamp != keyed->stamp[heap.front().node]) {
          std::pop_heap(heap.begin(), heap.end());  // stale: keyed again since
          heap.pop_back();
        }
        if (!heap.empty() && (s < 0 || heap.front().bound > keyed->heaps[s].front().bound))
          s = t;
      }
      if (s < 0) break;
      auto& heap = keyed->heaps[s];
      if (best >= 0 && heap.front().bound < best_score) break;  // none left scores as high
      const int64_t v = heap.front().node;
      std::pop_heap(heap.begin(), heap.end());
      heap.pop_back();
      scored.push_back(v);
      const double sign = s == 0 ? 1.0 : -1.0;
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
      const double gain = gain_of(v);
      const double drop = excess - after;
      const double score = gain < 0 ? gain / drop : gain * drop;
      if (best < 0 || score > best_score ||
          (score == best_score && (after < best_after || (after == best_after && v < best)))) {
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
    changed.clear();  // the nodes whose gain or side changed, once each
    touched[best] = step;
    changed.push_back(best);
    for (int64_t e = indptr[best]; e < indptr[best + 1]; ++e)
      if (touched[indices[e]] != step) {
        touched[indices[e]] = step;
        changed.push_back(indices[e]);
      }
    for (auto& k : kept)
      for (int64_t v : changed) push(k, v);
    for (int64_t v : scored)  // taken off this pattern's heaps; the changed are back already
      if (touched[v] != step) {
        touched[v] = step;
        push(*keyed, v);
      }
  }
  *excess_left = excess;
  return 0;
} catch (...) {
  return kFailed;
}

}  // extern "C"
