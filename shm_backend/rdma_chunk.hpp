// shm_backend/rdma_chunk.hpp — the shm device's own cells, used when CMA is
// refused: PUT data, GET requests and GET data travel through the rings.
// Protocol engines never see these; the cell's kind tells them apart.
// Untrusted like every arrival: the receiver checks keys, tags and bounds.
#pragma once

#include <cstdint>

#include "ami/memory.hpp"

namespace ami::shm {

enum CellKind : std::uint16_t {
  kPacketCell = 0,      // a protocol packet, for the PacketSink
  kPutDataCell = 1,     // RdmaChunk + data to place at the receiver
  kGetRequestCell = 2,  // RdmaChunk: send back [remote_address, + bytes)
  kGetDataCell = 3,     // RdmaChunk + data answering a GET request
  kPutDoneCell = 4,     // RdmaChunk: the PUT tag names was placed (status 0) or refused
};

// What names the target region: a RemoteKey's fields without its backend
// entries (the owner checks these against its region table), so that a
// chunk leaves room for data in the smallest cells.
struct ChunkKey {
  std::uint64_t job = 0;
  std::uint32_t task = 0;
  std::uint32_t region = 0;
  std::uint32_t generation = 0;
  std::uint32_t reserved = 0;
  std::uint64_t address = 0;
  std::uint64_t length = 0;

  static ChunkKey of(const RemoteKey& k) {
    return {.job = k.job, .task = k.task, .region = k.region, .generation = k.generation,
            .address = k.address, .length = k.length};
  }
  RemoteKey key() const {
    return {.job = job, .task = task, .region = region, .generation = generation, .address = address,
            .length = length};
  }
};

struct RdmaChunk {
  ChunkKey key;                     // put/get request: the target region
  std::uint64_t remote_address = 0; // put: where this chunk goes; get: where the data starts
  std::uint64_t tag = 0;            // put, get: the origin's descriptor number, echoed back
  std::uint64_t offset = 0;         // put, get data: of this chunk in the PUT or GET
  std::uint64_t bytes = 0;          // put/get data: in this cell; get request: in all
  std::uint64_t total = 0;          // put: bytes in the whole PUT
  std::uint32_t status = 0;         // get data, put done: 0, or the StatusCode refusing it
  std::uint32_t reserved = 0;
};

}  // namespace ami::shm
