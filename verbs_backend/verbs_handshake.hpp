// verbs_backend/verbs_handshake.hpp — the messages that connect a lane's RC
// queue pair on first use, over each context's UD queue pair.
//
// The context that first talks to a peer context sends a request (its QP
// number and first PSN) to the peer context's UD QP, published in its
// address. The peer makes its QP, brings it to RTS towards the requester's
// and replies with its own; the requester brings its QP to RTS and says it
// is ready. The one that replied posts nothing until it hears that, or
// until the requester's first packet arrives on the QP (which says the
// same), so no work request ever reaches a QP still at INIT. What the
// requester's lane was given meanwhile waits in its FIFO.
//
// UD may lose a message: the requester sends its request again with
// back-off, the replier its reply while it waits, and each side answers a
// repeat with the same answer, so a lost message costs a retry, not the
// lane. Both sides requesting at once: the request of the lower task wins;
// the higher one turns its requesting QP into the replying one, so the pair
// ends with one QP on each side and nothing sent on either side is lost.
// After connect_timeout_ms without an answer the lane fails as a broken
// lane does (its peer is taken as dead).
//
// Messages are untrusted: one that is not exactly a message of this job's
// tasks (magic, a known task, the nonce that task published, context
// numbers in range, 24-bit QP numbers and PSNs) is dropped and counted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace ami::verbs {

// The UD queue pair's shape: receive buffers (each with the 40-byte GRH
// that UD puts in front), send buffers, and the Q_Key of the job's UD QPs.
inline constexpr std::uint32_t kUdReceives = 64;
inline constexpr std::uint32_t kUdSends = 32;
inline constexpr std::uint32_t kUdGrhBytes = 40;
inline constexpr std::uint32_t kUdReceiveBytes = 128;
inline constexpr std::uint32_t kUdSendBytes = 64;
inline constexpr std::uint32_t kUdQkey = 0x414d4931;  // "AMI1"

struct Handshake {
  static constexpr std::uint32_t kMagic = 0x32485641;  // "AVH2"
  static constexpr std::size_t kBytes = 32;
  enum class Type : std::uint8_t { request = 1, reply = 2, ready = 3 };

  Type type = Type::request;
  std::uint32_t task = 0;          // the sender's
  std::uint16_t context = 0;       // the sender's
  std::uint16_t peer_context = 0;  // the receiver's
  std::uint64_t nonce = 0;         // what the sender published
  std::uint32_t qpn = 0;           // the sender's QP of this lane
  std::uint32_t psn = 0;           // its first send PSN

  void encode(std::span<std::byte, kBytes> out) const;
  // nullopt for anything but a well-formed message (field ranges that need
  // the job's shape are the receiver's to check).
  static std::optional<Handshake> decode(std::span<const std::byte> bytes);
};

}  // namespace ami::verbs
