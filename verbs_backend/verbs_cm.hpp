// verbs_backend/verbs_cm.hpp — connecting a lane's queue pair on first use
// through librdmacm, for fabrics where IP routing must find the path
// (AMI_VERBS_CM=on; RoCE only).
//
// Each context has its own event channel and an rdma_cm id listening on a
// port of its own, published in the task's address beside the port's IP
// address, so everything about one context's connections arrives on its
// own channel and is handled by its own progress(), as the UD handshake's
// messages arrive on its own CQ (verbs_handshake.hpp). The domain's queue
// pairs stay its own (ibv_create_qp, not rdma_create_qp): the connection
// manager only negotiates, and each QP is moved to RTR and RTS with the
// attributes rdma_init_qp_attr() returns.
//
// The context that first talks to a peer context makes its QP at INIT,
// resolves the peer's address and route and connects; the request carries
// the sender's task, contexts and the nonce it published. The peer makes
// its QP, brings it to RTS and accepts; the requester brings its QP up on
// the reply and establishes. The accepting side posts nothing until the
// connection is established (or the requester's first packet arrives), so
// no work request reaches a QP still at INIT. Both contexts asking at once:
// the lower task's request stands; the lower task rejects the higher one's,
// and the higher one gives up its own (its id is retired) and accepts. A
// rejection from a lower task is that: it then waits for the lower task's
// request. The higher task answers with a fresh queue pair: the lower
// task's connection manager saw the old one's number in the request it
// refused, and would take a reply naming it for a stale connection. The connection manager repeats its own messages, so nothing is
// sent again here; no connection within connect_timeout_ms fails the lane
// as a broken lane does.
//
// Requests are untrusted: one that is not from a task of this job, with the
// nonce that task published, naming this context, is rejected and counted.
// A request from a task not learnt yet has its address fetched first
// (VerbsDomain::learn_on_demand).
//
// The channel is read without blocking: while a connection is being made,
// at every progress(); otherwise at most once per coarse clock tick, since
// a read costs a system call and an idle context only waits for requests.
#pragma once

#include <rdma/rdma_cma.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "verbs_domain.hpp"

namespace ami::verbs {

// What a connection request carries (private data).
struct CmHello {
  static constexpr std::uint32_t kMagic = 0x32435641;  // "AVC2"
  static constexpr std::size_t kBytes = 20;
  std::uint32_t task = 0;
  std::uint16_t context = 0;       // the sender's
  std::uint16_t peer_context = 0;  // the receiver's
  std::uint64_t nonce = 0;         // what the sender published

  void encode(std::span<std::byte, kBytes> out) const;
  static std::optional<CmHello> decode(const void* data, std::size_t length);
};

// The domain's share: the port's IP address and what every context's
// connections are made with.
class CmConnector {
 public:
  // Checks that the port holds a routable IP address; throws ami::Error.
  explicit CmConnector(VerbsDomain& domain);

  std::uint8_t ip_family() const { return ip_family_; }
  const std::array<std::uint8_t, 16>& ip() const { return ip_; }

  // A context's non-blocking event channel and its listening id, on a port
  // the kernel picks; throws ami::Error.
  void listen(ContextQueues& q) const;
  // An id on q's channel, resolving the address of the peer context that
  // listens on port at the port whose GID is gid (on RoCE the GID holds its
  // IP address, as this task's does); its events carry tag. 0 or an errno
  // value.
  int start(ContextQueues& q, CmIdOwner& id, void* tag, const std::array<std::uint8_t, 16>& gid,
            std::uint16_t port) const;
  // The parameters of rdma_connect / rdma_accept for qp.
  rdma_conn_param conn_param(ibv_qp* qp) const;

 private:
  bool fill_sockaddr(sockaddr_storage& out, std::uint8_t family, const std::array<std::uint8_t, 16>& ip,
                     std::uint16_t port) const;

  VerbsDomain& domain_;
  std::uint8_t ip_family_ = 0;
  std::array<std::uint8_t, 16> ip_{};
};

}  // namespace ami::verbs
