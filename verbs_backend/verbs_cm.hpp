// verbs_backend/verbs_cm.hpp — connecting lanes through librdmacm, the
// default on RoCE.
//
// The domain's queue pairs stay its own (created with ibv_create_qp, not
// rdma_create_qp); the connection manager only negotiates, and each QP is
// moved to RTR and RTS with the attributes rdma_init_qp_attr() returns. The
// lower task of a pair is active: it resolves, connects and establishes one
// connection per (own context, peer context); the higher one listens and
// accepts. Requests carry the sender's task, contexts and the nonce it
// published, and are accepted only once connect() for that task has the
// published address to check them against; until then they wait.
//
// Every connection is an explicit state machine with named states and one
// function per transition; failures and state names go to the log. Blocking:
// connect() pumps the event channel until every lane to the peer is
// established, one fails, or connect_timeout_ms passes. Call connect() for
// the peers in increasing task order on every task.
#pragma once

#include <rdma/rdma_cma.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

#include "verbs_domain.hpp"

namespace ami::verbs {

class CmConnector {
 public:
  explicit CmConnector(VerbsDomain& domain);  // binds and listens; throws ami::Error
  ~CmConnector();
  CmConnector(const CmConnector&) = delete;
  CmConnector& operator=(const CmConnector&) = delete;

  std::uint64_t nonce() const { return nonce_; }
  std::uint8_t ip_family() const { return ip_family_; }
  const std::array<std::uint8_t, 16>& ip() const { return ip_; }
  std::uint16_t port() const { return port_; }

  Status connect(std::uint32_t peer, const DomainAddress& address);

 private:
  enum class State : std::uint8_t {
    awaiting_request,   // passive: the peer's request has not come yet
    resolving_address,  // active: rdma_resolve_addr issued
    resolving_route,    // active: rdma_resolve_route issued
    connecting,         // active: rdma_connect issued, waiting for the reply
    accepting,          // passive: QP at RTS, rdma_accept issued
    established,
    failed,
  };
  static const char* name(State s);

  // What a connection request carries (private data).
  struct Hello {
    static constexpr std::uint32_t kMagic = 0x31435641;  // "AVC1"
    static constexpr std::size_t kBytes = 20;
    std::uint32_t task = 0;
    std::uint16_t context = 0;       // the sender's
    std::uint16_t peer_context = 0;  // the receiver's
    std::uint64_t nonce = 0;         // what the sender published
  };
  struct Connection {
    State state = State::awaiting_request;
    CmIdOwner id;
    std::uint16_t context = 0;
    std::uint16_t peer_context = 0;
  };
  struct Session {
    std::uint32_t peer;
    const DomainAddress& address;
    std::vector<Connection> lanes;  // [context * contexts + peer context]
    const char* failure = nullptr;
  };
  struct Request {
    CmIdOwner id;
    Hello hello;
    std::uint8_t initiator_depth;
    std::uint8_t responder_resources;
  };

  // transitions
  void start_active(Session& s, Connection& c);
  void on_address_resolved(Session& s, Connection& c);
  void on_route_resolved(Session& s, Connection& c);
  void on_connect_response(Session& s, Connection& c);
  void on_established(Connection& c);
  CmIdOwner on_request(Session* s, rdma_cm_event& e);
  CmIdOwner accept(Session& s, Request r);
  void fail(Session& s, Connection& c, const char* what, int err);

  Status pump(Session& s, std::chrono::steady_clock::time_point deadline);
  CmIdOwner handle(Session* s, rdma_cm_event& e);
  ibv_qp* qp_for(std::uint16_t context, std::uint32_t peer, std::uint16_t peer_context) const;
  rdma_conn_param conn_param(ibv_qp* qp) const;
  bool fill_sockaddr(sockaddr_storage& out, std::uint8_t family, const std::array<std::uint8_t, 16>& ip,
                     std::uint16_t port) const;

  VerbsDomain& domain_;
  std::uint64_t nonce_ = 0;
  std::uint8_t ip_family_ = 0;
  std::array<std::uint8_t, 16> ip_{};
  std::uint16_t port_ = 0;
  CmChannelOwner channel_;
  CmIdOwner listener_;
  std::vector<Request> waiting_;        // requests from tasks not being connected yet
  std::vector<CmIdOwner> connections_;  // established: kept for the domain's life
};

}  // namespace ami::verbs
