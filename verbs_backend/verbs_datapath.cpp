// verbs_backend/verbs_datapath.cpp — the per-message path: descriptors to
// work requests, completions to the transfer counter, receive completions
// to the protocol, receive buffers back to the SRQ. See verbs_device.hpp.
#include <endian.h>

#include <cstring>

#include "ami/device/coarse_clock.hpp"
#include "verbs_device.hpp"

namespace ami::verbs {

namespace {

// wr_id of a send WR: flags, lane index, injection number modulo 2^39 (it
// is recovered from the counter: at most a FIFO's depth lies between them).
constexpr std::uint64_t kReceiveBit = 1ull << 63;
constexpr std::uint64_t kProbeBit = 1ull << 62;
constexpr std::uint64_t kRefusedBit = 1ull << 61;
constexpr int kLaneShift = 39;
constexpr std::uint64_t kLaneMask = (1ull << 22) - 1;
constexpr std::uint64_t kNumberMask = (1ull << kLaneShift) - 1;
static_assert(kLaneShift + 22 <= 61, "lane and number bits must not reach the flag bits");

constexpr std::uint64_t kStagingAlign = 64;

constexpr std::uint64_t send_wr_id(std::uint32_t lane, std::uint64_t n, std::uint64_t flags) {
  return flags | (std::uint64_t{lane} << kLaneShift) | (n & kNumberMask);
}
// The injection number whose low bits are low, in [base, base + 2^39).
constexpr std::uint64_t unwrap(std::uint64_t low, std::uint64_t base) {
  return base + ((low - base) & kNumberMask);
}

bool inside_key(const device::RdmaDescriptor& x) {
  const RemoteKey& k = x.remote;
  return x.remote_address >= k.address && x.remote_address - k.address <= k.length &&
         x.length <= k.length - (x.remote_address - k.address);
}

[[gnu::always_inline]] inline void add_sge(ibv_send_wr& wr, const void* address, std::uint32_t length,
                                           std::uint32_t lkey) {
  if (length == 0) return;
  wr.sg_list[wr.num_sge++] = ibv_sge{reinterpret_cast<std::uintptr_t>(address), length, lkey};
}

}  // namespace

int post_receives(ContextQueues& q, std::uint32_t bounce_bytes) {
  const std::size_t k = q.to_repost.size();
  if (k == 0) return 0;
  std::byte* base = q.receive_memory.get();
  for (std::size_t i = 0; i < k; ++i) {
    const std::uint32_t buffer = q.to_repost[i];
    q.recv_wr[i].wr_id = kReceiveBit | buffer;
    q.recv_sge[i].addr = reinterpret_cast<std::uintptr_t>(base + std::size_t{buffer} * bounce_bytes);
    q.recv_sge[i].length = bounce_bytes;
  }
  ibv_recv_wr* last = &q.recv_wr[k - 1];
  last->next = nullptr;
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_srq_recv(q.srq.get(), &q.recv_wr[0], &bad);
  last->next = k < q.recv_wr.size() ? &q.recv_wr[k] : nullptr;
  const std::size_t posted =
      rc == 0 ? k : (bad != nullptr ? static_cast<std::size_t>(bad - &q.recv_wr[0]) : 0);
  q.to_repost.erase(q.to_repost.begin(), q.to_repost.begin() + static_cast<std::ptrdiff_t>(posted));
  q.receives_posted += static_cast<std::uint32_t>(posted);
  return rc == 0 ? 0 : errno_of_rc(rc);
}

// A ring of registered bytes handed out in FIFO order and freed by
// completions (staging_tail_); a chunk never wraps.
std::byte* VerbsLane::stage(std::uint32_t bytes) {
  const std::uint64_t need = (bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
  const std::uint64_t pos = staging_head_ % staging_size_;
  const std::uint64_t skip = pos + need > staging_size_ ? staging_size_ - pos : 0;
  if (staging_head_ + skip + need - staging_tail_ > staging_size_) return nullptr;
  staging_head_ += skip;
  std::byte* p = staging_.get() + staging_head_ % staging_size_;
  staging_head_ += need;
  return p;
}

// Turns descriptor n into wr; false when the staging ring is full (n and
// those after it wait for completions). (Always inline: a lone small
// message's ring() is one function down to ibv_post_send.)
[[gnu::always_inline]] inline bool VerbsDevice::prepare(VerbsLane& lane, std::uint64_t n, ibv_send_wr& wr,
                                                        ibv_sge* sge) {
  auto& fifo = lane.fifo();
  const device::Descriptor& d = fifo.at(n);
  wr.wr_id = send_wr_id(lane.index_, n, 0);
  wr.sg_list = sge;
  wr.num_sge = 0;
  wr.send_flags = 0;
  bool signal = false;
  // What a kind's case made of the descriptor: a WR, a refusal (refuse()
  // made its WR), or nothing yet (no staging room).
  enum class Made { wr, refused, stalled };
  auto packet = [&](const device::PacketDescriptor& p) {
    if (p.inline_len > device::kPacketInlineBytes || std::uint64_t{p.inline_len} + p.payload_len > lane.max_packet_ ||
        (p.payload == nullptr && p.payload_len != 0)) {
      refuse(lane, n, wr,
             {StatusCode::invalid_argument, "verbs: packet larger than the lane's max_packet()"});
      return Made::refused;
    }
    // The compact form goes as a SEND with immediate, without its prefix.
    const std::uint16_t skip =
        immediate_ && p.compact_prefix <= p.inline_len ? p.compact_prefix : 0;
    const std::byte* head = p.inline_data + skip;
    const std::uint32_t head_len = p.inline_len - skip;
    const std::uint64_t total = std::uint64_t{head_len} + p.payload_len;
    wr.opcode = IBV_WR_SEND;
    if (skip != 0) {
      wr.opcode = IBV_WR_SEND_WITH_IMM;
      wr.imm_data = htobe32(p.immediate);
      ++counters_.compact_sent;
    }
    if (total <= max_inline_) {
      wr.send_flags = IBV_SEND_INLINE;  // copied at post time: no key needed
      add_sge(wr, head, head_len, 0);
      add_sge(wr, p.payload, p.payload_len, 0);
    } else if (p.payload_keyed) {
      // Registered payload (a rendezvous message, or one sent with its
      // Memory): sent from where it lies, no copy.
      add_sge(wr, head, head_len, lane.slots_mr_->lkey);
      add_sge(wr, p.payload, p.payload_len, static_cast<std::uint32_t>(p.payload_keys[key_id_]));
    } else {
      std::byte* staged = nullptr;
      if (p.payload_len != 0) {
        staged = lane.stage(p.payload_len);
        if (staged == nullptr) return Made::stalled;
        std::memcpy(staged, p.payload, p.payload_len);
      }
      add_sge(wr, head, head_len, lane.slots_mr_->lkey);
      add_sge(wr, staged, p.payload_len, lane.staging_mr_->lkey);
    }
    return Made::wr;
  };
  auto rdma = [&](const device::RdmaDescriptor& x, bool get) {
    std::uint32_t rkey = 0;
    if (!rkey_of(x.remote, key_id_, rkey)) {  // a key verbs did not register, or one edited
      refuse(lane, n, wr, {StatusCode::remote_access, "verbs: the remote key has no verbs entry"});
      return Made::refused;
    }
    if (!inside_key(x)) {
      refuse(lane, n, wr, {StatusCode::remote_access, "verbs: range lies outside the remote key's region"});
      return Made::refused;
    }
    if (x.length > domain_.port().max_msg) {
      refuse(lane, n, wr, {StatusCode::invalid_argument, "verbs: longer than the port's largest message"});
      return Made::refused;
    }
    wr.opcode = get ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = x.remote_address;
    wr.wr.rdma.rkey = rkey;
    add_sge(wr, x.local, static_cast<std::uint32_t>(x.length), static_cast<std::uint32_t>(x.local_keys[key_id_]));
    // A small WRITE goes inline: the data rides in the WR, the NIC fetches nothing.
    if (!get && x.length <= max_inline_) wr.send_flags = IBV_SEND_INLINE;
    signal = get;
    return Made::wr;
  };
  // Built only where offloads_atomic() said yes: 64-bit fetch_add, add or
  // compare_swap on a NIC-domain region. The old value lands in the slot
  // (the FIFO's slots are registered), and retire() copies it out.
  auto atomic = [&](const device::AtomicDescriptor& a) {
    std::uint32_t rkey = 0;
    if (!rkey_of(a.remote, key_id_, rkey) || a.remote.atomics != AtomicDomain::nic) {
      refuse(lane, n, wr, {StatusCode::not_supported, "verbs: the region's atomics are not its NIC's"});
      return Made::refused;
    }
    const RemoteKey& k = a.remote;
    if (a.remote_address < k.address || a.remote_address - k.address > k.length ||
        k.length - (a.remote_address - k.address) < 8) {
      refuse(lane, n, wr, {StatusCode::remote_access, "verbs: the word lies outside the remote key's region"});
      return Made::refused;
    }
    if ((a.remote_address & 7) != 0 || !nic_native(a.op, a.type)) {
      refuse(lane, n, wr, {StatusCode::invalid_argument, "verbs: the NIC does 64-bit fetch-add and compare-swap "
                                                         "on aligned words only"});
      return Made::refused;
    }
    const bool cas = a.op == AtomicOp::compare_swap;
    wr.opcode = cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.wr.atomic.remote_addr = a.remote_address;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = cas ? a.compare : a.operand;
    wr.wr.atomic.swap = cas ? a.operand : 0;
    add_sge(wr, &fifo.at(n).atomic.landing, 8, lane.slots_mr_->lkey);
    if (a.result != nullptr) {
      lane.results_[n & (fifo_depth_ - 1)] = a.result;
      ++lane.atomics_in_flight_;
    }
    signal = true;  // its old value is what its callback waits for
    return Made::wr;
  };
  const Made made = device::visit(d, device::cases(
      /*packet*/ packet,
      /*put*/ [&](const device::RdmaDescriptor& x) { return rdma(x, false); },
      /*get*/ [&](const device::RdmaDescriptor& x) { return rdma(x, true); },
      /*atomic*/ [&](const device::AtomicDescriptor& a) { return atomic(a); }));
  if (made != Made::wr) return made == Made::refused;
  choose_signal(lane, n, wr, signal);
  return true;
}

// Signal every signal_interval-th WR, the one after which the FIFO has no
// free slot (its completion is what frees one), and one after which a
// quarter of the staging ring waits on unsignalled WRs. And a WR posted
// alone while no signalled one is in flight (ping-pong traffic) when a
// callback waits: left unsignalled it would wait for a later WR or a
// probe. Streams keep one completion per signal_interval, and a WR nobody
// waits for (send_immediate, a PUT without local_done) costs none.
// signal: the WR asks for its completion anyway (a GET).
[[gnu::always_inline]] inline void VerbsDevice::choose_signal(VerbsLane& lane, std::uint64_t n, ibv_send_wr& wr,
                                                              bool signal) {
  auto& fifo = lane.fifo();
  lane.staging_end_[n & (fifo_depth_ - 1)] = lane.staging_head_;
  ++lane.unsignalled_;
  signal = signal || lane.unsignalled_ >= signal_interval_ ||
           n + 1 - fifo.counter().snapshot() >= fifo_depth_ ||
           lane.staging_head_ - lane.staging_signalled_ >= lane.staging_size_ / 4;
  const bool lone = !signal && n == lane.posted_ && n + 1 == fifo.injected() &&
                    fifo.counter().snapshot() >= lane.retire_target_ && fifo.pending_callbacks() != 0;
  if (lone) ++counters_.lone_signalled;
  if (signal || lone) mark_signalled(lane, wr, n);
}

void VerbsDevice::mark_signalled(VerbsLane& lane, ibv_send_wr& wr, std::uint64_t n) {
  wr.send_flags |= IBV_SEND_SIGNALED;
  lane.unsignalled_ = 0;
  lane.staging_signalled_ = lane.staging_head_;
  lane.retire_target_ = n + 1;
  ++counters_.signalled;
}

// Descriptor n is not sent: a signalled zero-length RDMA WRITE (no key is
// checked for zero bytes) holds its place, and its completion fails it.
void VerbsDevice::refuse(VerbsLane& lane, std::uint64_t n, ibv_send_wr& wr, Status why) {
  const std::uint32_t slot = static_cast<std::uint32_t>(n & (fifo_depth_ - 1));
  lane.refused_[slot] = why;
  wr.wr_id = send_wr_id(lane.index_, n, kRefusedBit);
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.num_sge = 0;
  wr.send_flags = 0;
  wr.wr.rdma.remote_addr = 0;
  wr.wr.rdma.rkey = 0;
  lane.staging_end_[slot] = lane.staging_head_;
  mark_signalled(lane, wr, n);
  ++counters_.refused;
}

// A doorbell costs a system call on soft-RoCE and an uncached write and a
// fence on a NIC. A lane's first ring of a burst (since the last progress()
// or flush()) posts at once, so a lone message leaves now; later ones wait
// until doorbell_batch descriptors are ready and go in one chain; flush()
// and progress() post what is left.
[[gnu::always_inline]] inline void VerbsDevice::ring(VerbsLane& lane) {
  if (lane.rung_epoch_ == ring_epoch_ && lane.fifo().injected() - lane.posted_ < doorbell_batch_) {
    held_ = true;
    tending_ = true;
    return;
  }
  lane.rung_epoch_ = ring_epoch_;
  if (lane.posted_ + 1 == lane.fifo().injected() && lane.ready_ && !lane.broken_) return post_one(lane);
  tending_ = true;
  post(lane);
}

// post() for a lone descriptor (ping-pong traffic), without the chain.
[[gnu::always_inline]] inline void VerbsDevice::post_one(VerbsLane& lane) {
  ibv_send_wr& wr = lane.wr_[0];
  if (!prepare(lane, lane.posted_, wr, &lane.sge_[0])) {
    ++counters_.staging_stalls;  // tend_lanes() posts it once completions free the ring
    tending_ = true;
    return;
  }
  post_lone(lane, wr);
}

// Posts wr (lane.wr_[0]) without the rest of its chain; a failure breaks
// the lane, and fails wr's slot with the lane's other operations. A
// signalled WR retires the lane up to itself by its own completion: only an
// unsignalled one may need tend_lanes() (a probe), so a lone operation that
// waits for its completion (a GET, an atomic, ping-pong traffic) leaves the
// polls that find it without that pass over the lanes.
[[gnu::always_inline]] inline void VerbsDevice::post_lone(VerbsLane& lane, ibv_send_wr& wr) {
  wr.next = nullptr;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(lane.qp_, &wr, &bad);
  wr.next = &lane.wr_[1];
  if (rc != 0) return post_failed(lane, "ibv_post_send", rc);
  ++lane.posted_;
  if (!(wr.send_flags & IBV_SEND_SIGNALED)) tending_ = true;
}

void VerbsLane::ring() { device_.ring(*this); }

bool VerbsLane::send_compact(std::uint32_t immediate, std::span<const std::byte> head,
                             std::span<const std::byte> payload) {
  return device_.send_compact(*this, immediate, head, payload);
}

// What ring() and post_one() would do with the packet's descriptor, from
// the packet's parts: only for the first ring of a burst (later ones are
// held back for a doorbell batch) on a lane with nothing unposted, and for
// bytes that go inline (copied at post time: the caller's spans are free
// on return). The FIFO slot is taken all the same, and its descriptor is
// an empty packet: nothing reads it once the WR is posted.
[[gnu::always_inline]] inline bool VerbsDevice::send_compact(VerbsLane& lane, std::uint32_t immediate,
                                                             std::span<const std::byte> head,
                                                             std::span<const std::byte> payload) {
  auto& fifo = lane.fifo();
  const std::uint64_t n = fifo.injected();
  const std::size_t total = head.size() + payload.size();
  if (!immediate_ || !lane.ready_ || lane.broken_ || lane.posted_ != n || total > max_inline_ || total > lane.max_packet_ ||
      (lane.rung_epoch_ == ring_epoch_ && doorbell_batch_ > 1))
    return false;
  device::Descriptor* d = fifo.try_reserve();
  if (d == nullptr) return false;
  d->kind = device::DescriptorKind::packet;
  d->packet.inline_len = 0;
  d->packet.payload = nullptr;
  d->packet.payload_len = 0;
  d->packet.compact_prefix = 0;
  d->packet.payload_keyed = false;
  d->packet.await_delivery = false;
  fifo.commit();
  lane.rung_epoch_ = ring_epoch_;
  ibv_send_wr& wr = lane.wr_[0];
  wr.wr_id = send_wr_id(lane.index_, n, 0);
  wr.sg_list = &lane.sge_[0];
  wr.num_sge = 0;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htobe32(immediate);
  wr.send_flags = IBV_SEND_INLINE;
  add_sge(wr, head.data(), static_cast<std::uint32_t>(head.size()), 0);
  add_sge(wr, payload.data(), static_cast<std::uint32_t>(payload.size()), 0);
  ++counters_.compact_sent;
  ++counters_.compact_direct;
  choose_signal(lane, n, wr, false);
  post_lone(lane, wr);
  return true;
}

void VerbsDevice::flush() {
  if (held_)
    post_waiting();
  else
    ++ring_epoch_;
}

// Posts every lane's committed descriptors (those ring() held back, and
// those a full staging ring stopped), and starts a new burst.
void VerbsDevice::post_waiting() {
  ++ring_epoch_;
  held_ = false;
  for (VerbsLane* lane : active_)
    if (lane->posted_ < lane->fifo().injected()) post(*lane);
}

void VerbsDevice::post(VerbsLane& lane) {
  if (lane.broken_ || !lane.ready_) return;  // connection_ready() has it tended
  const std::uint64_t end = lane.fifo().injected();
  while (lane.posted_ < end) {
    std::uint32_t k = 0;
    while (k < VerbsLane::kPostBatch && lane.posted_ + k < end &&
           prepare(lane, lane.posted_ + k, lane.wr_[k], &lane.sge_[2 * k]))
      ++k;
    const bool stalled = lane.posted_ + k < end && k < VerbsLane::kPostBatch;
    if (stalled) ++counters_.staging_stalls;
    if (k == 0) return;
    ibv_send_wr* last = &lane.wr_[k - 1];
    last->next = nullptr;
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(lane.qp_, &lane.wr_[0], &bad);
    last->next = k < VerbsLane::kPostBatch ? &lane.wr_[k] : nullptr;
    if (rc != 0) {
      lane.posted_ += bad != nullptr ? static_cast<std::uint64_t>(bad - &lane.wr_[0]) : 0;
      return post_failed(lane, "ibv_post_send", rc);
    }
    lane.posted_ += k;
    if (stalled) return;
  }
}

// Callbacks may not run inside the posting call: progress() fails the
// lane's operations.
void VerbsDevice::post_failed(VerbsLane& lane, const char* call, int rc) {
  log_qp(lane.qp_, call, errno_of_rc(rc));
  lane.broken_ = true;
  tending_ = true;
  ++broken_lanes_;
  lane.failure_ = {StatusCode::device_error, "verbs: ibv_post_send failed (see the log)"};
}

// The QP goes to the error state, so the NIC stops retrying and flushes
// what it holds (those completions are ignored: the lane is broken).
bool VerbsDevice::abandon(Endpoint peer, Status why) {
  if (!can_reach(peer)) return false;
  // No more handshake with it either.
  Connection* c = connection(domain_.lane_index(peer));
  if (c != nullptr && (c->state == Connection::State::requesting || c->state == Connection::State::accepted)) {
    --handshakes_;
    c->state = Connection::State::failed;
  }
  VerbsLane* lane = lanes_[domain_.lane_index(peer)].get();
  if (lane == nullptr) return false;
  if (lane->broken_) return true;  // reported, or about to be
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (int rc = ibv_modify_qp(lane->qp_, &attr, IBV_QP_STATE)) log_qp(lane->qp_, "ibv_modify_qp (to error)", rc);
  lane->broken_ = true;
  lane->failure_ = why;
  ++broken_lanes_;
  tending_ = true;
  return true;
}

void VerbsDevice::post_probe(VerbsLane& lane) {
  ibv_send_wr wr{};
  wr.wr_id = send_wr_id(lane.index_, lane.posted_, kProbeBit);
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(lane.qp_, &wr, &bad)) {
    post_failed(lane, "ibv_post_send (retire probe)", rc);
    return;
  }
  lane.probe_outstanding_ = true;
  lane.retire_target_ = lane.posted_;
  lane.unsignalled_ = 0;
  lane.staging_signalled_ = lane.staging_head_;
  ++counters_.probes;
  ++counters_.signalled;
}

// The device is done with every descriptor below counter: the transfer
// counter moves there and the staging bytes of those packets are free.
[[gnu::always_inline]] inline void VerbsDevice::retire(VerbsLane& lane, std::uint64_t counter) {
  auto& tc = lane.fifo().counter();
  if (counter <= tc.snapshot()) return;  // slot counter - 1 may hold a newer WR's mark
  if (lane.atomics_in_flight_ != 0) land_atomics(lane, counter);
  lane.staging_tail_ = lane.staging_end_[(counter - 1) & (fifo_depth_ - 1)];
  tc.advance_to(counter);
}

// The old values of the atomics the counter passes now go to their callers'
// buffers (width bytes: a 64-bit word, little-endian), before their
// callbacks can run.
void VerbsDevice::land_atomics(VerbsLane& lane, std::uint64_t counter) {
  auto& fifo = lane.fifo();
  for (std::uint64_t n = fifo.counter().snapshot(); n < counter && lane.atomics_in_flight_ != 0; ++n) {
    void*& to = lane.results_[n & (fifo_depth_ - 1)];
    if (to == nullptr) continue;
    const device::AtomicDescriptor& a = fifo.at(n).atomic;
    // (Fixed widths: a copy of a variable one is a call to memcpy.)
    if (width_of(a.type) == 8)
      std::memcpy(to, &a.landing, 8);
    else
      std::memcpy(to, &a.landing, 4);
    to = nullptr;
    --lane.atomics_in_flight_;
  }
}

// The work request that failed gets its own status (remote_access when the
// peer's NIC refused it). The queue pair is in the error state after it:
// whatever waited behind it, and the peer, fail as when the peer is gone.
void VerbsDevice::break_lane(VerbsLane& lane, std::uint64_t first_failed, Status status, const ibv_wc* wc) {
  static constexpr Status kBrokeAfter{StatusCode::peer_failed,
                                      "verbs: the lane broke after an operation failed (see the log)"};
  auto& fifo = lane.fifo();
  lane.broken_ = true;
  tending_ = true;
  lane.failure_ = status == StatusCode::peer_failed ? status : kBrokeAfter;
  ++broken_lanes_;
  log("QP 0x%06x (context %u to task %u context %u): %s (vendor error 0x%x); failing its %llu operations "
      "from number %llu on",
      lane.qp_->qp_num, context_, lane.peer().task, lane.peer().context,
      wc != nullptr ? ibv_wc_status_str(wc->status) : status.what(), wc != nullptr ? wc->vendor_err : 0u,
      static_cast<unsigned long long>(fifo.injected() - first_failed),
      static_cast<unsigned long long>(first_failed));
  retire(lane, first_failed);  // an RC send queue completes in order: those before it succeeded
  if (lane.atomics_in_flight_ != 0) {  // failed atomics write no result
    std::fill_n(lane.results_.get(), fifo_depth_, nullptr);
    lane.atomics_in_flight_ = 0;
  }
  fifo.complete();
  if (first_failed < fifo.injected()) fifo.fail_one(first_failed, status);
  fifo.fail_pending(lane.failure_);
}

// (Always inline, as on_receive_completion() below: a completion's whole
// path, from the poll to the transfer counter, is one function.)
[[gnu::always_inline]] inline void VerbsDevice::on_send_completion(const ibv_wc& wc) {
  const std::uint64_t index = (wc.wr_id >> kLaneShift) & kLaneMask;
  VerbsLane* lane = index < lanes_.size() ? lanes_[index].get() : nullptr;
  if (lane == nullptr) {
    log("send completion (wr_id 0x%llx, QP 0x%06x) for no lane", static_cast<unsigned long long>(wc.wr_id),
        wc.qp_num);
    return;
  }
  ++counters_.send_completions;
  const std::uint64_t base = lane->fifo().counter().snapshot();
  const std::uint64_t n = unwrap(wc.wr_id & kNumberMask, base);
  if (wc.wr_id & kProbeBit) lane->probe_outstanding_ = false;
  if (lane->broken_) return;  // the flushes that follow the first error
  if (wc.status != IBV_WC_SUCCESS) return break_lane(*lane, n, completion_status(wc.status), &wc);
  if (wc.wr_id & kProbeBit) {
    // tend_lanes() stops tending a lane while its probe is out: a WR posted
    // after the probe (unsignalled, a callback waiting on it) needs another
    // look now, or its callback waits for ever.
    tending_ = true;
    return retire(*lane, n);
  }
  if (wc.wr_id & kRefusedBit) {
    retire(*lane, n);
    lane->fifo().complete();  // the callbacks before it first, in order
    lane->fifo().fail_one(n, lane->refused_[n & (fifo_depth_ - 1)]);
  }
  retire(*lane, n + 1);
}

[[gnu::always_inline]] inline void VerbsDevice::on_receive_completion(const ibv_wc& wc, device::PacketSink& sink) {
  const auto buffer = static_cast<std::uint32_t>(wc.wr_id & 0xFFFFFFFFu);
  --queues_.receives_posted;
  if (wc.status != IBV_WC_SUCCESS) {
    ++counters_.receive_errors;
    log("receive completion on QP 0x%06x: %s (vendor error 0x%x)", wc.qp_num, ibv_wc_status_str(wc.status),
        wc.vendor_err);
  } else if (wc.opcode != IBV_WC_RECV || wc.byte_len > domain_.options().bounce_bytes) {
    // An RDMA WRITE with immediate took this receive: its bytes went
    // elsewhere (and its length is the peer's to choose). ami sends none.
    ++counters_.dropped;
  } else if (const ContextQueues::Route* r = queues_.route(wc.qp_num)) {
    ++counters_.packets_received;
    if (handshakes_ != 0) [[unlikely]] heard_on(r->peer);
    const std::byte* bytes =
        queues_.receive_memory.get() + std::size_t{buffer} * domain_.options().bounce_bytes;
    if (wc.wc_flags & IBV_WC_WITH_IMM)
      sink.on_compact_packet(r->peer, be32toh(wc.imm_data), {bytes, wc.byte_len});
    else
      sink.on_packet(r->peer, {bytes, wc.byte_len});
  } else {
    ++counters_.dropped;
  }
  queues_.to_repost.push_back(buffer);  // capacity srq_depth: never allocates
}

void VerbsDevice::replenish() {
  const std::size_t n = queues_.to_repost.size();
  if (int err = post_receives(queues_, domain_.options().bounce_bytes))
    log("ibv_post_srq_recv: %s", std::strerror(err));
  counters_.receives_reposted += n - queues_.to_repost.size();
}

std::size_t VerbsDevice::return_credit() {
  const std::size_t before = queues_.to_repost.size();
  if (before != 0) replenish();
  return before - queues_.to_repost.size();
}

// Per lane after polling: post what the staging ring held back, fail what
// a broken lane was given, and retire an unsignalled run once the lane is
// quiet. Only while some lane may need it (tending_): a lane needs nothing
// more until its next ring() or until it breaks once it has nothing
// unposted, nothing to fail, and no callback waiting on an unsignalled run
// without a probe (a probe's completion retires the run by itself).
std::size_t VerbsDevice::tend_lanes() {
  std::size_t work = 0;
  tending_ = false;  // (a lane that breaks, or a callback's ring(), sets it again meanwhile)
  bool again = false;
  for (VerbsLane* lane : active_) {
    auto& fifo = lane->fifo();
    if (lane->broken_) {
      if (fifo.counter().snapshot() < fifo.injected()) work += fifo.fail_pending(lane->failure_);
      again = again || fifo.counter().snapshot() < fifo.injected();
      continue;
    }
    if (lane->posted_ < fifo.injected()) post(*lane);
    const bool quiet = lane->posted_ == lane->seen_posted_;
    lane->seen_posted_ = lane->posted_;
    if (quiet && !lane->probe_outstanding_ && lane->retire_target_ < lane->posted_ &&
        (fifo.pending_callbacks() != 0 || lane->posted_ < fifo.injected())) {
      post_probe(*lane);
      ++work;
    }
    again = again || lane->posted_ < fifo.injected() ||
            (!lane->probe_outstanding_ && lane->retire_target_ < lane->posted_ && fifo.pending_callbacks() != 0);
  }
  tending_ = tending_ || again;
  return work;
}

std::size_t VerbsDevice::progress(device::PacketSink& sink, std::size_t budget) {
  // What ring() held back goes first; what a full staging ring stopped goes
  // in tend_lanes(), after the completions that free it.
  flush();
  if (stashed_ != 0) [[unlikely]] {  // found by arm()
    const int n = stashed_;
    stashed_ = 0;
    return progress_rest(sink, budget, stash_, n);
  }
  ibv_wc wc[kPollBatch];
  const int want = static_cast<int>(std::min<std::size_t>(kPollBatch, budget));
  const int n = want > 0 ? ibv_poll_cq(queues_.cq.get(), want, wc) : 0;
  // An idle poll (what a waiting process spins on) ends here: receives to
  // repost were counted when they came, and nothing else waits.
  // (With rdma_cm, also the channel's turn: once per coarse clock tick.)
  if (n == 0 && !tending_ && broken_lanes_ == 0 && handshakes_ == 0 &&
      (!cm_ || device::coarse_now_ns() < next_cm_poll_ns_))
    return 0;
  return progress_rest(sink, budget, wc, n);
}

std::size_t VerbsDevice::progress_rest(device::PacketSink& sink, std::size_t budget, ibv_wc* wc, int n) {
  std::size_t polled = 0;
  for (;;) {
    if (n < 0) {
      log("ibv_poll_cq on context %u: error %d", context_, n);
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (wc[i].qp_num == ud_qpn_) [[unlikely]]
        on_handshake(wc[i]);
      else if (wc[i].wr_id & kReceiveBit)
        on_receive_completion(wc[i], sink);
      else
        on_send_completion(wc[i]);
    }
    polled += static_cast<std::size_t>(n);
    const int want = static_cast<int>(std::min<std::size_t>(kPollBatch, budget - polled));
    if (n < kPollBatch || want == 0) break;
    n = ibv_poll_cq(queues_.cq.get(), want, wc);
  }
  if (queues_.to_repost.size() >= repost_batch_) replenish();
  std::size_t work = polled;
  if (cm_) work += poll_cm();
  if (handshakes_ != 0) work += tend_handshakes();
  if (tending_) work += tend_lanes();
  if (broken_lanes_ != 0) {
    // After tend_lanes() failed what their FIFOs held.
    for (VerbsLane* lane : active_)
      if (lane->broken_ && !lane->reported_) {
        lane->reported_ = true;
        // (The atomic loopback is no peer's: its failed atomics were its
        // callbacks' to hear.)
        if (!lane->loopback_) sink.on_lane_failed(lane->peer(), lane->failure_);
        ++work;
      }
    broken_lanes_ = 0;
  }
  return work;
}

}  // namespace ami::verbs
