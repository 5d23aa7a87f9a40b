// protocol/collectives/topology.hpp — who talks to whom in each algorithm,
// as pure functions of a rank and the geometry's size (no state, no I/O).
//
//  dissemination (barrier): round k goes to rank + 2^k, comes from rank - 2^k;
//  binomial tree (broadcast, reduce), over ranks relative to the root: the
//    parent of v clears v's lowest set bit; the children of v are v + 2^k
//    for every 2^k below v's lowest set bit (below the size for the root);
//  recursive doubling (small allreduce): among the largest power of two of
//    ranks; each of the first 2 * rem ranks (rem the rest) pairs up, the
//    even one folding its data into the odd one first and getting the
//    result back last;
//  pairwise exchange (barrier of a power of two): round k with rank xor 2^k,
//    so with tasks placed on nodes in blocks the first rounds stay inside
//    a node and only the last cross;
//  recursive halving then doubling (large allreduce of a power of two):
//    the same partners, exchanging halves of the data;
//  ring (large allreduce of other sizes, allgather): rank + 1 and rank - 1.
#pragma once

#include <bit>
#include <cstdint>

namespace ami::coll::topology {

// Rounds of a dissemination barrier: ceil(log2(n)).
inline std::uint32_t rounds(std::uint32_t n) {
  return n <= 1 ? 0 : static_cast<std::uint32_t>(std::bit_width(n - 1));
}
inline std::uint32_t dissemination_to(std::uint32_t rank, std::uint32_t n, std::uint32_t round) {
  return static_cast<std::uint32_t>((std::uint64_t{rank} + (std::uint64_t{1} << round)) % n);
}
inline std::uint32_t dissemination_from(std::uint32_t rank, std::uint32_t n, std::uint32_t round) {
  const std::uint64_t d = (std::uint64_t{1} << round) % n;
  return static_cast<std::uint32_t>((std::uint64_t{rank} + n - d) % n);
}

// Binomial tree rooted at root, over n ranks.
struct Tree {
  std::uint32_t n = 1;
  std::uint32_t root = 0;

  std::uint32_t relative(std::uint32_t rank) const { return (rank + n - root) % n; }
  std::uint32_t absolute(std::uint32_t v) const { return (v + root) % n; }
  bool is_root(std::uint32_t rank) const { return rank == root; }
  std::uint32_t parent(std::uint32_t rank) const {
    const std::uint32_t v = relative(rank);
    return absolute(v & (v - 1));
  }
  // The children's bound: children are v + m for every power of two m < limit(v).
  std::uint32_t limit(std::uint32_t v) const {
    return v == 0 ? std::bit_ceil(n) : (v & (~v + 1));
  }
  std::uint32_t child_count(std::uint32_t rank) const {
    const std::uint32_t v = relative(rank);
    std::uint32_t c = 0;
    for (std::uint32_t m = 1; m < limit(v) && v + m < n; m <<= 1) ++c;
    return c;
  }
  // Child i, the largest subtree first (i < child_count).
  std::uint32_t child(std::uint32_t rank, std::uint32_t i) const {
    return absolute(relative(rank) + (std::uint32_t{1} << (child_count(rank) - 1 - i)));
  }
  // Which child of rank is c (its index for child()), or -1 when c is not one.
  int child_index(std::uint32_t rank, std::uint32_t c) const {
    const std::uint32_t v = relative(rank), w = relative(c);
    if (w <= v || c == root) return -1;
    const std::uint32_t m = w - v;
    if (!std::has_single_bit(m) || m >= limit(v)) return -1;
    return static_cast<int>(child_count(rank) - 1 - static_cast<std::uint32_t>(std::countr_zero(m)));
  }
};

// Recursive doubling with the fold for sizes that are not a power of two.
struct Doubling {
  std::uint32_t n = 1;
  std::uint32_t pof2() const { return std::bit_floor(n); }
  std::uint32_t rem() const { return n - pof2(); }
  std::uint32_t steps() const { return static_cast<std::uint32_t>(std::countr_zero(pof2())); }
  // An even rank among the first 2 * rem: folds into rank + 1, takes no part in the doubling.
  bool extra(std::uint32_t rank) const { return rank < 2 * rem() && rank % 2 == 0; }
  // An odd rank among the first 2 * rem: takes the fold of rank - 1, and gives it the result.
  bool folds(std::uint32_t rank) const { return rank < 2 * rem() && rank % 2 == 1; }
  std::uint32_t virtual_rank(std::uint32_t rank) const { return rank < 2 * rem() ? rank / 2 : rank - rem(); }
  std::uint32_t real_rank(std::uint32_t v) const { return v < rem() ? 2 * v + 1 : v + rem(); }
  // The partner at doubling step k (1..steps()).
  std::uint32_t partner(std::uint32_t rank, std::uint32_t k) const {
    return real_rank(virtual_rank(rank) ^ (std::uint32_t{1} << (k - 1)));
  }
};

// Recursive halving over n = 2^L ranks and n blocks of the data. Before
// reduce-scatter step k (0..L-1) a rank and its partner (rank xor 2^k) hold
// the same blocks [lo, hi): the ones their bits 0..k-1 chose. Each keeps the
// half its bit k names (the upper for a 1) and gives the other; a rank ends
// the reduce-scatter holding one block. The allgather retraces the steps
// backwards: at step k each sends what it kept and takes what it gave.
// Halves and not strides, so every exchange is one contiguous piece.
struct Halving {
  struct Blocks {
    std::uint32_t lo = 0, hi = 0;
  };
  std::uint32_t n = 1;
  std::uint32_t steps() const { return static_cast<std::uint32_t>(std::countr_zero(n)); }
  static std::uint32_t partner(std::uint32_t rank, std::uint32_t k) { return rank ^ (std::uint32_t{1} << k); }
  Blocks held(std::uint32_t rank, std::uint32_t k) const {
    Blocks b{0, n};
    for (std::uint32_t j = 0; j < k; ++j) {
      const std::uint32_t half = (b.hi - b.lo) / 2;
      if ((rank >> j) & 1) b.lo += half;
      else b.hi -= half;
    }
    return b;
  }
  Blocks kept(std::uint32_t rank, std::uint32_t k) const {
    const Blocks b = held(rank, k);
    const std::uint32_t mid = b.lo + (b.hi - b.lo) / 2;
    return ((rank >> k) & 1) ? Blocks{mid, b.hi} : Blocks{b.lo, mid};
  }
  Blocks given(std::uint32_t rank, std::uint32_t k) const {
    const Blocks b = held(rank, k);
    const std::uint32_t mid = b.lo + (b.hi - b.lo) / 2;
    return ((rank >> k) & 1) ? Blocks{b.lo, mid} : Blocks{mid, b.hi};
  }
};

inline std::uint32_t ring_next(std::uint32_t rank, std::uint32_t n) { return (rank + 1) % n; }
inline std::uint32_t ring_prev(std::uint32_t rank, std::uint32_t n) { return (rank + n - 1) % n; }
// Block b - k around the ring, for rank's step k.
inline std::uint32_t ring_block(std::uint32_t rank, std::uint32_t n, std::uint64_t back) {
  return static_cast<std::uint32_t>((rank + n - back % n) % n);
}

}  // namespace ami::coll::topology
