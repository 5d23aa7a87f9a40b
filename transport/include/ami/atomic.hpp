// ami/atomic.hpp — the operations and word types of a remote atomic
// (Context::atomic, AtomicParams; docs/DESIGN.md, "Remote atomics").
#pragma once

#include <cstddef>
#include <cstdint>

namespace ami {

// What an atomic does to the word w at the target, given operand v (and
// compare c): every op but add returns w's old value.
enum class AtomicOp : std::uint8_t {
  fetch_add,     // w += v
  add,           // w += v; no result
  swap,          // w = v
  compare_swap,  // if (w == c) w = v; the old value says whether it did
  fetch_and,     // w &= v
  fetch_or,      // w |= v
  fetch_xor,     // w ^= v
};
inline constexpr std::uint8_t kLastAtomicOp = static_cast<std::uint8_t>(AtomicOp::fetch_xor);

// The word: 32 or 64 bits, unsigned or signed. Arithmetic wraps around in
// two's complement either way, so signedness changes no bit of the result;
// it is named so that a caller says what the word holds. Operands and
// results travel as 64-bit words: a 32-bit op uses the low 32 bits of
// operand and compare, and writes 4 bytes of result.
enum class AtomicType : std::uint8_t { u32, i32, u64, i64 };
inline constexpr std::uint8_t kLastAtomicType = static_cast<std::uint8_t>(AtomicType::i64);

// Which hardware makes a region's words atomic (docs/DESIGN.md, "Remote
// atomics"): the CPUs of the host that owns it, or its NIC. The owner
// chooses at registration (AMI_ATOMIC_MODE) and its remote key carries the
// choice, so that every initiator's atomics on the region take paths that
// end in the same one; the two do not mix.
enum class AtomicDomain : std::uint8_t { cpu, nic };
inline constexpr std::uint8_t kLastAtomicDomain = static_cast<std::uint8_t>(AtomicDomain::nic);

constexpr std::size_t width_of(AtomicType t) {
  return t == AtomicType::u32 || t == AtomicType::i32 ? 4 : 8;
}
constexpr bool returns_old(AtomicOp op) { return op != AtomicOp::add; }
// What an RDMA NIC does itself (IBV_WR_ATOMIC_FETCH_AND_ADD, _CMP_AND_SWP):
// 64-bit fetch_add, add and compare_swap. The rest, on a NIC-domain region,
// is a loop of compare-and-swaps (docs/DESIGN.md, "Remote atomics").
constexpr bool nic_native(AtomicOp op, AtomicType t) {
  return width_of(t) == 8 && (op == AtomicOp::fetch_add || op == AtomicOp::add || op == AtomicOp::compare_swap);
}
// Is address a multiple of the type's width? (A mask: the widths are powers
// of two, which `% width_of(t)` left to a division.)
constexpr bool aligned_for(std::uint64_t address, AtomicType t) { return (address & (width_of(t) - 1)) == 0; }

}  // namespace ami
