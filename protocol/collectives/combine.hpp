// protocol/collectives/combine.hpp — the reduction kernels: every element
// type with every operator it allows, and the combiner that applies one to
// a message piece by piece as the engine hands the pieces over, so a
// contribution is combined in place straight from the reception buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ami/collectives.hpp"

namespace ami::coll {

// band and bor take integers only.
bool allowed(DataType type, ReduceOp op);

// dst[i] = a[i] op b[i] for count elements. dst may be a or b (element by
// element); no pointer need be aligned.
void combine(DataType type, ReduceOp op, std::byte* dst, const std::byte* a, const std::byte* b,
             std::size_t count);

// Combines a message that arrives in pieces, in order from offset 0, with
// a into dst: dst[i] = a[i] op message[i]. A piece may end inside an
// element; its bytes wait for the next piece.
class PieceCombiner {
 public:
  void start(DataType type, ReduceOp op, std::byte* dst, const std::byte* a);
  void piece(std::uint64_t offset, std::span<const std::byte> bytes);
  // Bytes consumed so far (a piece not at this offset is out of order).
  std::uint64_t consumed() const { return consumed_; }

 private:
  DataType type_ = DataType::int32;
  ReduceOp op_ = ReduceOp::sum;
  std::size_t element_ = 4;
  std::byte* dst_ = nullptr;
  const std::byte* a_ = nullptr;
  std::uint64_t consumed_ = 0;
  std::byte carry_[8]{};
  std::size_t carried_ = 0;
};

}  // namespace ami::coll
