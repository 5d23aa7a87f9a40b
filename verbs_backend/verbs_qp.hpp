// verbs_backend/verbs_qp.hpp — the RC queue pair state transitions, for
// both connection methods. Each returns 0 or an errno value; the caller logs
// it with the QP number.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "verbs_domain.hpp"

namespace ami::verbs {


// access: kQpAccess, with IBV_ACCESS_REMOTE_ATOMIC where the device does atomics.
int qp_to_init(ibv_qp* qp, std::uint8_t port, int access);
// The handshake: RTR towards the peer's QP (its port from what it
// published), then RTS.
int qp_to_rtr(ibv_qp* qp, const PortInfo& port, const VerbsOptions& options, const PeerInfo& peer,
              std::uint32_t remote_qpn, std::uint32_t remote_psn);
int qp_to_rts(ibv_qp* qp, const VerbsOptions& options, std::uint32_t psn, std::uint8_t rd_atomic);
// rdma_cm: the attributes the connection manager negotiated for id.
int qp_to_state_from_cm(ibv_qp* qp, rdma_cm_id* id, ibv_qp_state state, const PortInfo& port,
                        const VerbsOptions& options);

}  // namespace ami::verbs
