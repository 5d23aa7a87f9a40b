// verbs_backend/verbs_address.hpp — what one task publishes through the
// bootstrap so that its peers can connect queue pairs to it when they first
// talk to it.
//
// Little-endian, the same size whatever the job's size: the port (link
// layer, LID, GID, MTU), the largest packet it receives, a nonce its
// connection messages carry, with rdma_cm the IP address its connection
// manager listens on, then one number per context: where that context
// takes connection requests, the QP number of its UD queue pair (the
// handshake, verbs_handshake.hpp) or the port its rdma_cm id listens on. No queue pair of any lane exists when the
// address is published. decode() treats the bytes as untrusted and names the
// first problem; whether they fit this task's job is VerbsDomain::connect()'s
// to judge.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ami/status.hpp"

namespace ami::verbs {

enum class ConnectMethod : std::uint8_t { handshake = 1, rdma_cm = 2 };

struct DomainAddress {
  static constexpr std::uint32_t kMagic = 0x31425641;  // "AVB1"
  static constexpr std::uint16_t kVersion = 3;
  static constexpr std::size_t kFixedBytes = 72;
  static constexpr std::size_t kRendezvousBytes = 4;

  ConnectMethod method = ConnectMethod::handshake;
  std::uint8_t link_layer = 0;  // IBV_LINK_LAYER_INFINIBAND or _ETHERNET
  std::uint8_t mtu = 0;         // enum ibv_mtu: the port's active MTU
  std::uint8_t rd_atomic = 0;   // RDMA READs the task answers at once per QP
  std::uint16_t lid = 0;
  std::uint16_t contexts = 0;
  std::uint32_t task = 0;
  std::uint32_t tasks = 0;
  std::uint32_t bounce_bytes = 0;  // the largest packet it receives
  std::array<std::uint8_t, 16> gid{};
  // The token its connection messages carry (both methods).
  std::uint64_t nonce = 0;
  // rdma_cm: the IP address it listens on.
  std::uint8_t ip_family = 0;  // 4 or 6; 0 without rdma_cm
  std::array<std::uint8_t, 16> ip{};
  // One per context: its UD QP number (handshake) or its rdma_cm port.
  std::vector<std::uint32_t> rendezvous;

  std::vector<std::byte> encode() const;
  static Status decode(std::span<const std::byte> bytes, DomainAddress& out);
};

}  // namespace ami::verbs
