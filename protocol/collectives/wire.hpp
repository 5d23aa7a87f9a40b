// protocol/collectives/wire.hpp — the user header of every collective
// message: which geometry, which kind of collective, which of them (the
// sequence number, per geometry and kind), which step of its algorithm,
// and the arguments every member must have given alike (root, type,
// operator, algorithm), so a receiver checks them before it places a byte;
// the lengths it checks against the message's own.
//
// 16 bytes on the wire, so that a barrier message, or an allreduce of 8
// bytes, fills one cache line of a shared-memory ring cell with the ring's
// and the packet's headers. Sequence numbers go modulo 2^32 and are
// compared as serial numbers.
//
// Wire input is untrusted: decode() checks the length, magic, kind, type
// and operator; the geometry's handler checks origin, step and lengths.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "ami/collectives.hpp"

namespace ami::coll {

enum class Kind : std::uint8_t { barrier, broadcast, reduce, allreduce, allgather };
inline constexpr std::size_t kKinds = CollectiveStats::kKinds;

struct Header {
  Kind kind = Kind::barrier;
  DataType type = DataType::int32;  // reduce, allreduce
  ReduceOp op = ReduceOp::sum;      // reduce, allreduce
  bool ring = false;                // allreduce: by the ring (else by recursive doubling)
  std::uint16_t step = 0;           // round of the algorithm
  std::uint32_t geometry = 0;
  std::uint32_t seq = 0;            // per geometry and kind, from 0
  std::uint32_t root = 0;           // broadcast, reduce: the root's rank
};

// Layout: kind | 0xC0 (magic in the high bits), type | op << 3 | ring << 6,
// step, geometry, seq, root; little-endian.
inline constexpr std::size_t kHeaderBytes = 16;
using HeaderBytes = std::array<std::byte, kHeaderBytes>;

enum class HeaderError : std::uint8_t { none, truncated, bad_magic, bad_kind, bad_type, bad_op };

HeaderBytes encode(const Header& h);
HeaderError decode(std::span<const std::byte> bytes, Header& out);

// a - b in serial-number order: negative when a is older than b.
inline std::int32_t seq_diff(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b); }

std::string_view kind_name(Kind kind);

}  // namespace ami::coll
