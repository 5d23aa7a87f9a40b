// ami/params.hpp — the arguments of the post calls: plain data the caller
// fills; nothing in them is kept after the call but what each field says.
#pragma once

#include <cstdint>
#include <span>

#include "ami/atomic.hpp"
#include "ami/callback.hpp"
#include "ami/memory.hpp"

namespace ami {

struct SendParams {
  Endpoint dest;
  std::uint16_t dispatch = 0;
  std::span<const std::byte> header;   // at most Context::kMaxHeaderBytes (128), copied at once
  std::span<const std::byte> payload;  // any size; read until local_done
  Callback local_done;                 // payload buffer reusable
  Callback remote_done;                // the target's done ran (optional)
  // Optional: the payload lies inside this registration. A message longer
  // than one packet needs its buffer registered for the receiver's GET;
  // without this, the context's registration cache does it.
  const Memory* memory = nullptr;
};

struct SendImmediateParams {
  Endpoint dest;
  std::uint16_t dispatch = 0;
  std::span<const std::byte> header;
  std::span<const std::byte> payload;  // header + payload <= Context::immediate_limit()
};

// PUT copies local -> remote, GET remote -> local. Offsets are from the start
// of the local registration and of the remote key's region.
struct RdmaParams {
  Endpoint dest;
  const Memory* local = nullptr;
  std::uint64_t local_offset = 0;
  RemoteKey remote{};
  std::uint64_t remote_offset = 0;
  std::uint64_t bytes = 0;
  Callback local_done;  // PUT: local buffer reusable; GET: data is in place
};

// An atomic on the naturally aligned word at remote_offset of the remote
// key's region (Context::atomic; docs/DESIGN.md, "Remote atomics").
struct AtomicParams {
  Endpoint dest;
  AtomicOp op = AtomicOp::fetch_add;
  AtomicType type = AtomicType::u64;
  RemoteKey remote{};
  std::uint64_t remote_offset = 0;  // a multiple of the type's width from an aligned region start
  std::uint64_t operand = 0;        // the value added, swapped in, or combined (low 32 bits for 32-bit types)
  std::uint64_t compare = 0;        // compare_swap: the value the word must hold
  // Where the word's old value goes (4 or 8 bytes, the type's width; no
  // alignment needed), written before done runs; null only for add.
  void* result = nullptr;
  Callback done;                    // the op is done at the target, result written
};

}  // namespace ami
