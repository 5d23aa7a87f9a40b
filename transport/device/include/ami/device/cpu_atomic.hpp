// ami/device/cpu_atomic.hpp — a remote atomic carried out by this CPU on a
// word it addresses: the target's engine on its own memory, a device on a
// peer's memory it maps. Every such path uses std::atomic_ref on the same
// physical word, so they are atomic against each other (docs/DESIGN.md,
// "Remote atomics").
#pragma once

#include <atomic>
#include <cstdint>

#include "ami/atomic.hpp"

namespace ami::device {

namespace detail {
template <class T>
T apply(AtomicOp op, T* word, T v, T c) {
  std::atomic_ref<T> w(*word);
  switch (op) {
    case AtomicOp::fetch_add:
    case AtomicOp::add: return w.fetch_add(v, std::memory_order_seq_cst);
    case AtomicOp::swap: return w.exchange(v, std::memory_order_seq_cst);
    case AtomicOp::compare_swap: w.compare_exchange_strong(c, v, std::memory_order_seq_cst); return c;
    case AtomicOp::fetch_and: return w.fetch_and(v, std::memory_order_seq_cst);
    case AtomicOp::fetch_or: return w.fetch_or(v, std::memory_order_seq_cst);
    case AtomicOp::fetch_xor: return w.fetch_xor(v, std::memory_order_seq_cst);
  }
  return 0;
}
}  // namespace detail

// Does op on the naturally aligned word at address (checked by the
// caller) and returns its old value, zero-extended. Signed and unsigned
// words of one width are the same bits: unsigned arithmetic wraps as two's
// complement does.
inline std::uint64_t cpu_atomic(AtomicOp op, AtomicType type, void* address, std::uint64_t operand,
                                std::uint64_t compare) {
  if (width_of(type) == 4)
    return detail::apply<std::uint32_t>(op, static_cast<std::uint32_t*>(address),
                                        static_cast<std::uint32_t>(operand), static_cast<std::uint32_t>(compare));
  return detail::apply<std::uint64_t>(op, static_cast<std::uint64_t*>(address), operand, compare);
}

}  // namespace ami::device
