// ami/dispatch.hpp — what a receiver registers per dispatch id and what its
// handler sees.
//
// A handler runs inside Context::advance() on the receiving context. It sees
// the user header and, when the whole payload arrived with it, the payload
// (recv is then nullptr). Otherwise it tells ami where to put the data by
// filling *recv: a buffer of in.total_bytes and a done callback that runs
// when every byte is in place. A null buffer discards the data (counted in
// the statistics); done still runs. The spans are valid only during the
// call: copy what you keep.
//
// A message longer than one packet starts eagerly and its receiver may stop
// it (docs/DESIGN.md, method 2; protocol/am/rndv/policy.hpp says when): the rest
// then comes by RDMA GET or PUT, and done runs once every byte is in place
// either way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ami/callback.hpp"

namespace ami {

inline constexpr std::uint16_t kMaxDispatch = 256;  // ids 0..255

struct Incoming {
  Endpoint origin;
  std::uint16_t dispatch = 0;
  std::span<const std::byte> header;
  std::span<const std::byte> payload;  // the whole payload when recv is nullptr
  std::size_t total_bytes = 0;
  bool can_defer = false;  // Receive::defer may be used for this message
};

class Memory;

// Receives a message in pieces, in order, as they arrive: bytes at offset of
// the message. The spans are valid only during the call.
using PieceFn = void (*)(void* cookie, std::uint64_t offset, std::span<const std::byte> bytes);

// A message its handler put aside (Receive::defer): it waits at the
// receiver, holding no reception buffer, until Context::accept() names
// where it goes. id is 0 until ami fills it in, before the handler's caller
// returns.
struct Deferred {
  std::uint64_t id = 0;
  Endpoint origin;
  std::size_t total_bytes = 0;
};

struct Receive {
  void* buffer = nullptr;  // in.total_bytes long, owned by the handler's caller
  Callback done;
  // Optional: buffer lies inside this registration, so a rendezvous uses it
  // instead of registering the buffer itself.
  const Memory* memory = nullptr;
  // Ask for the data by GET or PUT straight into buffer rather than through
  // bounce buffers: the receiver stops the sender's eager packets at once.
  bool zero_copy = false;
  // Not known yet where the data goes (when in.can_defer): point this at a
  // Deferred the handler keeps, leave buffer null, and call
  // Context::accept() with its id later. The sender is stopped meanwhile;
  // accept() fetches the whole message by GET.
  Deferred* defer = nullptr;
  // Instead of a buffer: the data in pieces as they arrive (a stream, a
  // reduction into place), then done. Such a message is never stopped: it
  // comes eagerly, through bounce buffers, in order. (buffer, then defer,
  // then piece: the first one set is what the handler asked for.)
  PieceFn piece = nullptr;
  void* piece_cookie = nullptr;
};

using DispatchFn = void (*)(void* cookie, const Incoming& in, Receive* recv);

// Runs at the target of a fence (Context::fence) when it arrives: every
// earlier send and PUT from origin to this context has been handled and its
// data placed.
struct FenceHandler {
  void (*fn)(void* cookie, Endpoint origin) = nullptr;
  void* cookie = nullptr;
};

// Runs when a peer fails (its process died, its lane broke, it stopped
// answering keepalives): after every pending operation to it completed with
// an error; later operations to it return peer_failed.
struct PeerErrorHandler {
  void (*fn)(void* cookie, Endpoint peer, Status why) = nullptr;
  void* cookie = nullptr;
};

struct Dispatch {
  DispatchFn fn = nullptr;
  void* cookie = nullptr;
};

}  // namespace ami
