// fabric_backend/ofi_config.hpp — the libfabric backend's tunables
// (config_table.hpp): which provider, the packet size, the multi-receive
// buffers. OfiOptions (ofi_fabric.hpp) takes its defaults from these rows.
#pragma once

#include "ami/config.hpp"

namespace ami::ofi {

inline constexpr ParamSpec kParams[] = {
    {"AMI_OFI_PROVIDER", "", ParamType::text, 0, 64,
     "libfabric provider for the ofi backend, as fi_info names it (tcp;ofi_rxm, shm, verbs;ofi_rxm, "
     "efa, ...); empty: the first that meets ami's needs, preferring one that leaves the host (not shm, "
     "nor the deprecated sockets and udp;ofi_rxd)."},
    // At least 1 KiB: a packet holds a descriptor's inline bytes (320) and the backend's header.
    {"AMI_OFI_PACKET_SIZE", "auto", ParamType::power_of_two, 1024, 1u << 20,
     "Bytes of message a packet over libfabric carries (a power of two from 1 KiB to 1 MiB; at most "
     "the provider's largest message), with 64 bytes more for the protocol's headers: larger "
     "messages go in several, or by the rendezvous. auto: "
     "64 KiB on shm (one copy by CMA carries a packet of any size); over rxm 16 KiB, and ami sets rxm's eager size (FI_OFI_RXM_BUFFER_SIZE, unless set) to hold them with their headers (one byte more and each packet goes by rxm's own rendezvous; a size set is taken as it is, and packets then fill it); 8 KiB elsewhere.", true},
    {"AMI_OFI_RECV_BUFFERS", "4", ParamType::unsigned_int, 2, 1024,
     "Multi-receive buffers each context keeps posted (FI_MULTI_RECV); one is re-posted as soon as the "
     "provider has filled it and its packets are handled."},
    {"AMI_OFI_RECV_BUFFER_SIZE", "auto", ParamType::power_of_two, 65536, 1u << 30,
     "Bytes per multi-receive buffer (a power of two, 64 KiB to 1 GiB; at least 2 packets). auto: "
     "2 packets on shm (128 KiB: the provider copies each packet into the next bytes of a buffer, "
     "and the fewer bytes the buffers span, the more of them the cache still holds when they come "
     "round again), 1 MiB elsewhere (8 packets where that is more).", true},
    {"AMI_OFI_MR_LOCAL", "auto", ParamType::boolean, 0, 1,
     "Send only from registered memory (FI_MR_LOCAL): auto when the provider asks for it, on to do so "
     "anyway (packets are then copied into a registered staging pool).", true},
    {"AMI_OFI_ORDERED", "auto", ParamType::boolean, 0, 1,
     "Take the provider's message order as it says (auto), or treat every lane as unordered (off): a "
     "fence then waits for every earlier operation (a flush) and a PUT completes only once placed.", true},
    {"AMI_OFI_STAGING", "256", ParamType::power_of_two, 8, 65536,
     "Packets of the staging pool per context, used under FI_MR_LOCAL (a power of two)."},
    {"AMI_OFI_BUNDLE", "16", ParamType::unsigned_int, 1, 64,
     "Small packets a lane may send together as one message (those of which two or more fit in a packet, "
     "or in the provider's inject size where that is 4 KiB or more, as on shm): a lane's first packet "
     "since the context last advanced goes at once, later ones wait until this many are ready or the "
     "next advance(), and consecutive small ones then go as one send (one provider call, and one "
     "doorbell on verbs;ofi_rxm, for all of them). 1: every packet is a message of its own."},
    {"AMI_OFI_TIMEOUT", "30000", ParamType::unsigned_int, 10, 3600000,
     "Milliseconds a lane may have operations outstanding without one completing before its oldest "
     "fails with a timeout and the lane breaks: for a provider that drops an operation without an "
     "error (shm in libfabric 1.17 does, for a PUT or GET with a key its target refuses)."},
    {"AMI_OFI_WAIT", "off", ParamType::boolean, 0, 1,
     "Open each context's completion queue with a descriptor to sleep on (FI_WAIT_FD), so that "
     "Context::arm() can put the context to sleep: auto where the provider has one (tcp;ofi_rxm, "
     "verbs;ofi_rxm; not shm), on to refuse a provider without one, off for none (arm() says "
     "not_supported). Asked for up front, as UCX's UCP_FEATURE_WAKEUP is: on tcp;ofi_rxm the "
     "descriptor costs busy-polling contexts about an eighth of their small-message latency.", true},
    {"AMI_OFI_CQ_SIZE", "auto", ParamType::unsigned_int, 64, 1u << 22,
     "Entries of each context's completion queue. auto: the provider's own default (1024 for those "
     "built on libfabric's common completion queue: shm, rxm, tcp, udp;ofi_rxd; these keep what does "
     "not fit in an overflow list, losing nothing). Every completion is written to the ring's next "
     "entry, so a larger ring spreads them over more memory: with 16384 entries (48 bytes each) a "
     "ping-pong of 8 B over shm took a page fault every 85 messages for its first 16384, and its "
     "20000 round trips 1.16x as long (median of 5 interleaved runs).", true},
};
static_assert(rows_are_sound(kParams), "ofi_config.hpp: a row has a bad name, range or default");

using Param = ParamIn<kParams>;

}  // namespace ami::ofi
