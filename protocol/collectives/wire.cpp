// protocol/collectives/wire.cpp — the collective header on the wire; the
// names of types, operators and kinds.
#include "wire.hpp"

#include <cstring>

namespace ami::coll {

namespace {
constexpr std::uint8_t kMagic = 0xC0;  // the first byte's high bits
constexpr std::uint8_t kMagicMask = 0xF0;

template <typename T>
void put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <typename T>
T get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
}  // namespace

HeaderBytes encode(const Header& h) {
  HeaderBytes b;
  b[0] = static_cast<std::byte>(kMagic | static_cast<std::uint8_t>(h.kind));
  b[1] = static_cast<std::byte>(static_cast<std::uint8_t>(h.type) | static_cast<std::uint8_t>(h.op) << 3 |
                                (h.ring ? 1u : 0u) << 6);
  put(b.data() + 2, h.step);
  put(b.data() + 4, h.geometry);
  put(b.data() + 8, h.seq);
  put(b.data() + 12, h.root);
  return b;
}

HeaderError decode(std::span<const std::byte> bytes, Header& out) {
  if (bytes.size() != kHeaderBytes) return HeaderError::truncated;
  const auto first = static_cast<std::uint8_t>(bytes[0]);
  const auto args = static_cast<std::uint8_t>(bytes[1]);
  if ((first & kMagicMask) != kMagic) return HeaderError::bad_magic;
  if ((first & ~kMagicMask) >= kKinds) return HeaderError::bad_kind;
  if ((args & 7) > static_cast<std::uint8_t>(DataType::float64)) return HeaderError::bad_type;
  if ((args >> 3 & 7) > static_cast<std::uint8_t>(ReduceOp::bor) || (args & 0x80) != 0) return HeaderError::bad_op;
  out.kind = static_cast<Kind>(first & ~kMagicMask);
  out.type = static_cast<DataType>(args & 7);
  out.op = static_cast<ReduceOp>(args >> 3 & 7);
  out.ring = (args >> 6 & 1) != 0;
  out.step = get<std::uint16_t>(bytes.data() + 2);
  out.geometry = get<std::uint32_t>(bytes.data() + 4);
  out.seq = get<std::uint32_t>(bytes.data() + 8);
  out.root = get<std::uint32_t>(bytes.data() + 12);
  return HeaderError::none;
}

std::string_view kind_name(Kind kind) { return collective_kind_name(static_cast<std::size_t>(kind)); }

}  // namespace ami::coll

namespace ami {

std::string_view collective_kind_name(std::size_t i) {
  static constexpr std::string_view kNames[] = {"barrier", "broadcast", "reduce", "allreduce", "allgather"};
  return i < std::size(kNames) ? kNames[i] : std::string_view{"unknown"};
}

std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::int32:
    case DataType::float32: return 4;
    case DataType::int64:
    case DataType::uint64:
    case DataType::float64: return 8;
  }
  return 0;
}

std::string_view to_string(DataType type) {
  switch (type) {
    case DataType::int32: return "int32";
    case DataType::int64: return "int64";
    case DataType::uint64: return "uint64";
    case DataType::float32: return "float32";
    case DataType::float64: return "float64";
  }
  return "unknown_type";
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::band: return "band";
    case ReduceOp::bor: return "bor";
  }
  return "unknown_op";
}

}  // namespace ami
