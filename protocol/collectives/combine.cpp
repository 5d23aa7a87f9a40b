// protocol/collectives/combine.cpp — the reduction kernels.
#include "combine.hpp"

#include <algorithm>
#include <cstring>

namespace ami::coll {

namespace {

template <typename T>
struct Sum {
  static T f(T x, T y) { return x + y; }
};
template <typename T>
struct Prod {
  static T f(T x, T y) { return x * y; }
};
template <typename T>
struct Min {
  static T f(T x, T y) { return y < x ? y : x; }
};
template <typename T>
struct Max {
  static T f(T x, T y) { return x < y ? y : x; }
};
template <typename T>
struct Band {
  static T f(T x, T y) { return x & y; }
};
template <typename T>
struct Bor {
  static T f(T x, T y) { return x | y; }
};

// Aligned pointers that are either the same or disjoint: typed loops the
// compiler can keep in registers and vectorize (omp simd: at -O2 too, where
// GCC's cheap cost model would leave a loop with a remainder scalar).
template <typename T, typename F>
void run_aligned(T* dst, const T* a, const T* b, std::size_t n) {
  if (dst == a) {
    T* __restrict d = dst;
    const T* __restrict s = b;
#pragma omp simd
    for (std::size_t i = 0; i < n; ++i) d[i] = F::f(d[i], s[i]);
  } else if (dst == b) {
    T* __restrict d = dst;
    const T* __restrict s = a;
#pragma omp simd
    for (std::size_t i = 0; i < n; ++i) d[i] = F::f(s[i], d[i]);
  } else {
    T* __restrict d = dst;
    const T* __restrict x = a;
    const T* __restrict y = b;
#pragma omp simd
    for (std::size_t i = 0; i < n; ++i) d[i] = F::f(x[i], y[i]);
  }
}

template <typename T, typename F>
void run(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t n) {
  const auto misaligned = [](const std::byte* p) { return reinterpret_cast<std::uintptr_t>(p) % alignof(T); };
  if (misaligned(dst) == 0 && misaligned(a) == 0 && misaligned(b) == 0) {
    run_aligned<T, F>(reinterpret_cast<T*>(dst), reinterpret_cast<const T*>(a), reinterpret_cast<const T*>(b), n);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {  // packet payloads need not be aligned
    T x, y;
    std::memcpy(&x, a + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b + i * sizeof(T), sizeof(T));
    const T z = F::f(x, y);
    std::memcpy(dst + i * sizeof(T), &z, sizeof(T));
  }
}

template <typename T>
void run_arith(ReduceOp op, std::byte* dst, const std::byte* a, const std::byte* b, std::size_t n) {
  switch (op) {
    case ReduceOp::sum: run<T, Sum<T>>(dst, a, b, n); break;
    case ReduceOp::prod: run<T, Prod<T>>(dst, a, b, n); break;
    case ReduceOp::min: run<T, Min<T>>(dst, a, b, n); break;
    case ReduceOp::max: run<T, Max<T>>(dst, a, b, n); break;
    case ReduceOp::band:
    case ReduceOp::bor: break;  // refused for floating point (allowed())
  }
}

template <typename T>
void run_integer(ReduceOp op, std::byte* dst, const std::byte* a, const std::byte* b, std::size_t n) {
  switch (op) {
    case ReduceOp::band: run<T, Band<T>>(dst, a, b, n); break;
    case ReduceOp::bor: run<T, Bor<T>>(dst, a, b, n); break;
    default: run_arith<T>(op, dst, a, b, n); break;
  }
}

}  // namespace

bool allowed(DataType type, ReduceOp op) {
  const bool bitwise = op == ReduceOp::band || op == ReduceOp::bor;
  return !bitwise || (type != DataType::float32 && type != DataType::float64);
}

void combine(DataType type, ReduceOp op, std::byte* dst, const std::byte* a, const std::byte* b,
             std::size_t count) {
  switch (type) {
    case DataType::int32: run_integer<std::int32_t>(op, dst, a, b, count); break;
    case DataType::int64: run_integer<std::int64_t>(op, dst, a, b, count); break;
    case DataType::uint64: run_integer<std::uint64_t>(op, dst, a, b, count); break;
    case DataType::float32: run_arith<float>(op, dst, a, b, count); break;
    case DataType::float64: run_arith<double>(op, dst, a, b, count); break;
  }
}

void PieceCombiner::start(DataType type, ReduceOp op, std::byte* dst, const std::byte* a) {
  type_ = type;
  op_ = op;
  element_ = size_of(type);
  dst_ = dst;
  a_ = a;
  consumed_ = 0;
  carried_ = 0;
}

void PieceCombiner::piece(std::uint64_t offset, std::span<const std::byte> bytes) {
  if (offset != consumed_) return;  // the engine hands pieces over in order; anything else is not ours
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  consumed_ += n;
  if (carried_ != 0) {  // finish the element the last piece began
    const std::size_t take = std::min(element_ - carried_, n);
    std::memcpy(carry_ + carried_, p, take);
    carried_ += take;
    p += take;
    n -= take;
    offset += take;
    if (carried_ < element_) return;
    const std::uint64_t at = offset - element_;
    combine(type_, op_, dst_ + at, a_ + at, carry_, 1);
    carried_ = 0;
  }
  const std::size_t whole = n / element_;
  if (whole != 0) combine(type_, op_, dst_ + offset, a_ + offset, p, whole);
  const std::size_t rest = n - whole * element_;
  std::memcpy(carry_, p + whole * element_, rest);
  carried_ = rest;
}

}  // namespace ami::coll
