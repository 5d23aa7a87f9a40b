// ami/config_table.hpp — the table of tunables: every AMI_* variable with its
// type, default, range and documentation, one row each.
//
// It is constexpr data in a header so that a parameter name written in the
// code is checked against it while compiling (ami::ParamName, config.hpp):
// a misspelt name does not build. config.cpp reads it; ami_info -c prints it.
#pragma once

#include <cstdint>
#include <string_view>

namespace ami {

// choice: one of the words in ParamSpec::choices; number() is its position.
enum class ParamType : std::uint8_t { unsigned_int, power_of_two, boolean, text, choice };

struct ParamSpec {
  std::string_view name;  // AMI_...
  std::string_view default_value;
  ParamType type;
  std::uint64_t min = 0;  // for numbers
  std::uint64_t max = 0;  // for numbers; for text, the most bytes (0: any length)
  std::string_view doc;
  bool allows_auto = false;  // "auto" is a value too: the backend decides (number_or_auto)
  std::string_view choices = {};  // choice: the allowed words, '|'-separated
  bool secret = false;            // its value is never printed
};

// Every bound below is one a job can use on today's hosts: a value beyond it
// is a mistake (AMI_SIZE=100000000 is a typo, not a job), refused when the
// configuration is read. Settings whose product is the memory a client
// allocates (depths times cell sizes, requests, FIFOs) are also checked
// together against the host's memory when a Client starts.
inline constexpr ParamSpec kParamTable[] = {
    {"AMI_FIFO_DEPTH", "256", ParamType::power_of_two, 4, 65536,
     "Slots in each lane's injection FIFO (a power of two, at most 65536); also the most descriptors "
     "in flight per lane."},
    {"AMI_MAX_REQUESTS", "1024", ParamType::unsigned_int, 1, 1u << 20,
     "Requests per context (at most 1048576) for instructions that wait in the work queue or for a "
     "remote answer."},
    {"AMI_SELF_QUEUE_DEPTH", "256", ParamType::power_of_two, 4, 65536,
     "Cells in each context's reception queue for same-process peers (a power of two, at most 65536)."},
    {"AMI_SELF_CELL_SIZE", "8192", ParamType::power_of_two, 256, 4u << 20,
     "Bytes per cell of the self backend's queues, so its largest packet (a power of two, at most "
     "4 MiB)."},
    {"AMI_SHM_RING_DEPTH", "256", ParamType::power_of_two, 4, 65536,
     "Cells in each context's shared-memory ring (a power of two, at most 65536; every peer on the host "
     "writes into it)."},
    {"AMI_SHM_CELL_SIZE", "256", ParamType::power_of_two, 128, 4u << 20,
     "Bytes per shared-memory ring cell (a power of two, at most 4 MiB), so the largest packet between "
     "processes; small cells keep the ring in cache (message rate), large ones cut fewer packets "
     "(eager bandwidth)."},
    {"AMI_SHM_CMA", "on", ParamType::boolean, 0, 1,
     "PUT/GET between processes with one copy by process_vm_writev/readv; off copies through the rings."},
    {"AMI_SHM_STALL_TIMEOUT", "1000", ParamType::unsigned_int, 1, 3600000,
     "Milliseconds, once a peer on the host failed, that the next cell of a context's ring may stay "
     "reserved but unwritten before it is skipped: a process that died holding it blocks the rest."},
    {"AMI_RANK", "0", ParamType::unsigned_int, 0, (1u << 20) - 1,
     "This process's rank in the job, below AMI_SIZE (when not started by a tool or a PMIx launcher)."},
    {"AMI_SIZE", "1", ParamType::unsigned_int, 1, 1u << 20,
     "Processes in the job, at most 1048576; 1 needs no bootstrap."},
    {"AMI_BOOTSTRAP", "", ParamType::text, 0, 0,
     "host:port where rank 0 listens and the other ranks connect to exchange addresses."},
    {"AMI_BOOTSTRAP_TIMEOUT", "30000", ParamType::unsigned_int, 1, 3600000,
     "Milliseconds to wait for the bootstrap: connecting to rank 0 and each exchange (PMIx: each "
     "fence and get, in whole seconds)."},
    {"AMI_JOB_KEY", "", ParamType::text, 0, 256,
     "Shared secret every rank of a TCP-bootstrapped job presents to rank 0, which refuses (and logs) "
     "connections without it. Set the same value on every rank; ami's tools set a random one for the "
     "processes they start. At most 256 bytes.",
     false, {}, true},
    {"AMI_BOOTSTRAP_MODE", "auto", ParamType::choice, 0, 0,
     "How the job's tasks find each other: pmix (rank, size and the address exchange from the PMIx "
     "launcher that started the process: mpirun, prterun, srun --mpi=pmix; an error without one), "
     "tcp (AMI_RANK, AMI_SIZE, AMI_BOOTSTRAP), or auto: pmix when a PMIx launcher started the "
     "process and neither the program nor AMI_RANK, AMI_SIZE, AMI_BOOTSTRAP gives the job, tcp "
     "otherwise.", false, "auto|pmix|tcp"},
    {"AMI_BACKENDS", "self,shm,verbs", ParamType::text, 0, 0,
     "Backends this process may use, comma-separated from self, shm, verbs. A peer is reached by the "
     "first of self, shm, verbs (in that order) that is listed and reaches it; leave out shm to run "
     "same-host peers over verbs."},
    {"AMI_REACHABILITY", "all", ParamType::choice, 0, 0,
     "all: the Client fails at creation, on every task and naming the pair, when some task cannot "
     "reach another (AMI_BACKENDS, another host without verbs, a segment it cannot map); symmetric: "
     "tasks may be apart, for a job whose tasks only watch each other, but never one way only.",
     false, "all|symmetric"},
    {"AMI_NET_DEVICES", "", ParamType::text, 0, 0,
     "RDMA device and port for the verbs backend, as device[:port] (rxe0:1, mlx5_0); empty: the "
     "first active port."},
    // The GID index travels in an 8-bit field of the address handle.
    {"AMI_VERBS_GID_INDEX", "auto", ParamType::unsigned_int, 0, 255,
     "GID index for RoCE: auto picks the RoCE v2 IPv4-mapped GID; or a number, at most 255.", true},
    {"AMI_VERBS_CM", "auto", ParamType::boolean, 0, 1,
     "Connect queue pairs with rdma_cm (on), by exchanging their numbers through the bootstrap "
     "(off), or auto: rdma_cm on RoCE, the exchange on InfiniBand.", true},
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
    {"AMI_VERBS_RETRY_COUNT", "6", ParamType::unsigned_int, 0, 6,
     "RC transport retries before a lane fails (with AMI_VERBS_TIMEOUT: how long a peer may stay "
     "silent). At most 6: soft-RoCE takes 7 as retry forever, and a dead peer would never be found."},
    // At least 512: a receive buffer must hold a descriptor's inline bytes (320).
    {"AMI_VERBS_BOUNCE_SIZE", "auto", ParamType::power_of_two, 512, 1u << 20,
     "Bytes per receive buffer, so the largest packet over verbs: auto (8 KiB on a NIC; 128 KiB "
     "on a software device, where each work request and completion costs the kernel's CPU as much "
     "as pages of data) or a power of two from 512 B to 1 MiB.", true},
    {"AMI_MAX_REGIONS", "4096", ParamType::unsigned_int, 1, 1u << 20,
     "Memory registrations a client holds at once, at most 1048576."},
    {"AMI_RNDV_MODE", "auto", ParamType::choice, 0, 0,
     "What a receiver does when it stops an eager message: discard_get (drop the eager packets, "
     "GET it all), split_get (keep them, GET the rest from both ends), stop_put (the sender PUTs "
     "the rest into the receive buffer; a rest of 16 KiB or more is shared with the receiver's GET), "
     "or auto: stop_put.", false, "auto|discard_get|split_get|stop_put"},
    {"AMI_RNDV_CROSSOVER", "auto", ParamType::unsigned_int, 0, 1ull << 40,
     "Eager bytes still to come above which a receiver stops a message and moves the rest by "
     "RDMA: auto (the backend's figure for the lane) or bytes (1 TiB: never).", true},
    {"AMI_RNDV_LOW_WATER", "75", ParamType::unsigned_int, 1, 100,
     "Percent of a context's reception buffers in use at which it stops every eager message it "
     "can."},
    {"AMI_ACK_IDLE_THRESHOLD", "8", ParamType::unsigned_int, 0, 1u << 20,
     "Idle advances (advances in which nothing arrived) after which a context acknowledges every "
     "message it owes an answer, coalesced per origin; 0 answers each at once."},
    {"AMI_ACK_MAX_UNACKED", "64", ParamType::unsigned_int, 1, 1u << 20,
     "Messages from one origin a context leaves unacknowledged at most (at most 1048576): under "
     "sustained load it acknowledges them at once when that many are waiting."},
    {"AMI_KEEPALIVE_INTERVAL", "1000", ParamType::unsigned_int, 0, 3600000,
     "Milliseconds between keepalives to a peer this context waits on (for an answer, or the rest "
     "of a message) that sent nothing meanwhile; a lane that cannot deliver one fails the peer. "
     "0: none."},
    {"AMI_RCACHE_MAX_ENTRIES", "256", ParamType::unsigned_int, 1, 1u << 20,
     "Registrations each context's registration cache holds (in use and idle), at most 1048576."},
    {"AMI_RCACHE_MAX_MB", "4096", ParamType::unsigned_int, 1, 1u << 24,
     "MiB of memory each context's registration cache keeps registered (pinned, on verbs), at most "
     "16777216 (16 TiB)."},
    {"AMI_RCACHE_IDLE", "auto", ParamType::unsigned_int, 0, 1u << 20,
     "Idle registrations kept for reuse: auto keeps 64 without verbs and none with it (a pinned "
     "registration kept past free() would point at the old pages).", true},
    {"AMI_COLL_EAGER_MAX", "8192", ParamType::unsigned_int, 0, 1u << 30,
     "Bytes up to which a collective's message that comes before its call waits in an early-arrival "
     "buffer, and a contribution to a reduction is combined piece by piece as its packets arrive; a "
     "larger one waits at its sender and comes by the rendezvous straight into place. At most 1 GiB."},
    {"AMI_COLL_RING_MIN", "65536", ParamType::unsigned_int, 0, 1ull << 40,
     "Bytes from which allreduce runs as a ring (reduce-scatter, then allgather, each block straight "
     "into the receive buffer) rather than by recursive doubling; the same on every task."},
};

}  // namespace ami
