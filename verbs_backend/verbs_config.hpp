// verbs_backend/verbs_config.hpp — the verbs backend's tunables
// (config_table.hpp): the port, queue pairs and their depths, the RC
// transport's retries, receive buffers. VerbsOptions (verbs_domain.hpp)
// takes its defaults from these rows.
#pragma once

#include "ami/config.hpp"

namespace ami::verbs {

inline constexpr ParamSpec kParams[] = {
    {"AMI_NET_DEVICES", "", ParamType::text, 0, 0,
     "RDMA device and port for the verbs backend, as device[:port] (rxe0:1, mlx5_0); empty: the "
     "first active port."},
    // The GID index travels in an 8-bit field of the address handle.
    {"AMI_VERBS_GID_INDEX", "auto", ParamType::unsigned_int, 0, 255,
     "GID index for RoCE: auto picks the RoCE v2 IPv4-mapped GID; or a number, at most 255.", true},
    {"AMI_VERBS_CM", "auto", ParamType::boolean, 0, 1,
     "How lanes get their queue pairs, each on first use: on, by rdma_cm, each context listening "
     "on a port of its own (RoCE only); off, by a handshake over the context's UD queue pair "
     "(InfiniBand and RoCE); auto: rdma_cm where the port's GID holds a routable IP address "
     "(RoCE), the handshake elsewhere.", true},
    {"AMI_VERBS_MTU", "auto", ParamType::power_of_two, 256, 4096,
     "Largest path MTU: auto (the port's active MTU) or 256, 512, 1024, 2048, 4096.", true},
    {"AMI_VERBS_SQ_DEPTH", "256", ParamType::unsigned_int, 2, 65536,
     "Send work requests per queue pair, at most 65536; at least AMI_FIFO_DEPTH + 1 is used."},
    {"AMI_VERBS_SRQ_DEPTH", "auto", ParamType::unsigned_int, 16, 65536,
     "Receive buffers per context in its shared receive queue: auto (512 on a NIC, 128 on a "
     "software device: soft-RoCE, siw) or a number, at most 65536.", true},
    {"AMI_VERBS_SIGNAL_INTERVAL", "16", ParamType::unsigned_int, 1, 65536,
     "One send work request in this many asks for a completion; one completion retires the run "
     "before it."},
    {"AMI_VERBS_DOORBELL_BATCH", "16", ParamType::unsigned_int, 1, 256,
     "Work requests one ibv_post_send carries in a burst: a lane's first send since the last "
     "advance goes at once, later ones wait until this many are ready, and advance posts the "
     "rest (1: every send rings the doorbell)."},
    {"AMI_VERBS_MAX_RDMA", "auto", ParamType::power_of_two, 4096, 1ull << 31,
     "Largest RDMA WRITE or READ one work request carries: auto (the port's largest message) or "
     "a power of two, at most 2 GiB; longer PUTs, GETs and rendezvous transfers go in pieces this "
     "long. On a lossy link shorter pieces each see fewer losses (an RC queue pair counts its "
     "retries per work request).", true},
    {"AMI_VERBS_MAX_INLINE", "auto", ParamType::unsigned_int, 0, 65536,
     "Bytes a send carries inline in its work request: auto (the most the device takes) or a "
     "number, 0 for never.", true},
    {"AMI_VERBS_IMMEDIATE", "on", ParamType::boolean, 0, 1,
     "Send a whole small message as a SEND with immediate: the immediate stands for its short "
     "header, so 4096 bytes fill one 4096-byte MTU frame, not two (off: the header travels in "
     "the packet)."},
    {"AMI_VERBS_TIMEOUT", "14", ParamType::unsigned_int, 1, 31,
     "RC local ACK timeout: 4.096 us x 2^value before a send is retried (14: 67 ms)."},
    {"AMI_VERBS_RETRY_COUNT", "6", ParamType::unsigned_int, 0, 7,
     "RC transport retries before a lane fails (with AMI_VERBS_TIMEOUT: how long a peer may stay "
     "silent). 7 is 7 tries on a NIC, but soft-RoCE takes it as retry for ever: its lanes then never "
     "fail a dead peer, and only the bootstrap's connection watch finds it (so 6 by default)."},
    // At least 512: a receive buffer must hold a descriptor's inline bytes (320).
    {"AMI_VERBS_BOUNCE_SIZE", "auto", ParamType::power_of_two, 512, 1u << 20,
     "Bytes per receive buffer, so the largest packet over verbs: auto (8 KiB on a NIC; 128 KiB "
     "on a software device, where each work request and completion costs the kernel's CPU as much "
     "as pages of data) or a power of two from 512 B to 1 MiB.", true},
    {"AMI_VERBS_STAGING_SIZE", "auto", ParamType::power_of_two, 4096, 1u << 30,
     "Bytes of each lane's registered staging ring, where unregistered payloads are copied for "
     "the NIC: auto (64 KiB) or a power of two from 4 KiB to 1 GiB; at least two receive buffers "
     "(AMI_VERBS_BOUNCE_SIZE) are used. Made with the lane, when a context first talks to a peer.",
     true},
    {"AMI_VERBS_CONNECT_TIMEOUT", "30000", ParamType::unsigned_int, 100, 3600000,
     "Milliseconds a lane's connection may take (the handshake, from its first request; rdma_cm, "
     "all lanes to one peer) before the lane fails and the peer is taken as gone."},
};
static_assert(rows_are_sound(kParams), "verbs_config.hpp: a row has a bad name, range or default");

using Param = ParamIn<kParams>;

}  // namespace ami::verbs
