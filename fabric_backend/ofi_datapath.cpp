// fabric_backend/ofi_datapath.cpp — the libfabric backend's per-message
// path: descriptors to fi_sendmsg/fi_writemsg/fi_readmsg, CQ entries to the
// lanes' reorder windows and the sink, multi-receive buffers.
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

#include "ami/device/coarse_clock.hpp"
#include "ofi_device.hpp"

namespace ami::ofi {

namespace {

constexpr int kReadBatch = 16;

// A failed operation's status. The text is static; the provider's own
// words go to the log.
Status completion_status(int err) {
  switch (err) {
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_EHOSTUNREACH:
    case FI_ENOTCONN:
    case FI_ETIMEDOUT:
    case FI_EIO:
    case FI_ESHUTDOWN:
    case FI_EADDRNOTAVAIL:
      return {StatusCode::peer_failed, "ofi: the provider lost the peer (see the log)"};
    case FI_ECANCELED:
      // ami cancels nothing: this is the provider flushing what was queued
      // on a connection that broke (verbs;ofi_rxm: Work Request Flushed
      // Error), which the verbs backend reports as the peer's failure too.
      // (A PUT or GET so ended is taken as refused: see on_error().)
      return {StatusCode::peer_failed, "ofi: the provider flushed the operation (its connection broke)"};
    case FI_EACCES:
    case FI_EPERM:
    case FI_EKEYREJECTED:
      return {StatusCode::remote_access, "ofi: the peer refused the remote access (see the log)"};
    default:
      return {StatusCode::device_error, "ofi: the provider failed the operation (see the log)"};
  }
}

}  // namespace

// (ofi_device.hpp, "Bundles") A lane's first ring of a burst posts at
// once; later ones wait for a bundle's worth of descriptors, or flush().
// (A descriptor no bundle takes is not held: what waits goes with it.)
void OfiDevice::ring(OfiLane& lane) {
  const std::uint64_t injected = lane.fifo().injected();
  if (bundle_max_ > 1 && lane.rung_epoch_ == ring_epoch_ && injected - lane.posted_ < bundle_max_ &&
      bundleable(lane.fifo().at(injected - 1))) {
    held_ = true;
    return;
  }
  lane.rung_epoch_ = ring_epoch_;
  post(lane);
}

void OfiDevice::flush() {
  if (held_) post_held();
  ++ring_epoch_;
}

void OfiDevice::post_held() {
  held_ = false;
  for (std::size_t i = 0; i < active_.size(); ++i)
    if (active_[i]->posted_ < active_[i]->fifo().injected()) post(*active_[i]);
}

void OfiDevice::post(OfiLane& lane) {
  if (lane.broken_) {
    tending_ = true;  // progress() fails what it was given
    return;
  }
  const std::uint64_t end = lane.fifo().injected();
  while (lane.posted_ < end) {
    const std::uint32_t run = bundle_max_ > 1 && end - lane.posted_ > 1 ? bundle_run(lane, end) : 1;
    if ((run > 1 ? send_bundle(lane, lane.posted_, run) : post_one(lane, lane.posted_)) != Step::posted) return;
  }
}

// How many of the lane's descriptors from its next unposted one go in one
// bundle: consecutive packets that may join one, as many as bundle_bytes_
// holds with their lengths. (Not a packet that paces a
// rendezvous by its delivery: it completes on its own.)
std::uint32_t OfiDevice::bundle_run(OfiLane& lane, std::uint64_t end) const {
  std::size_t bytes = 0;
  std::uint32_t run = 0;
  for (std::uint64_t n = lane.posted_; n < end && run < bundle_max_; ++n, ++run) {
    const device::Descriptor& d = lane.fifo().at(n);
    if (!bundleable(d)) break;
    const std::size_t length = std::size_t{d.packet.inline_len} + d.packet.payload_len;
    if (bytes + kBundleEntryBytes + length > bundle_bytes_) break;
    bytes += kBundleEntryBytes + length;
  }
  return run;
}

bool OfiDevice::bundleable(const device::Descriptor& d) const {
  return d.kind == device::DescriptorKind::packet &&
         kBundleEntryBytes + d.packet.inline_len + d.packet.payload_len <= bundle_bytes_ / 2 &&
         !(d.packet.await_delivery && delivery_complete_);
}

// Descriptors first .. first + count - 1, packets bundle_run() chose, as one
// send from a staging packet. Each packet goes whole (its compact form
// needs the CQ data of its own).
OfiDevice::Step OfiDevice::send_bundle(OfiLane& lane, std::uint64_t first, std::uint32_t count) {
  if (staging_free_.empty()) {
    ++counters_.staging_stalls;
    tending_ = true;
    return Step::wait;
  }
  const std::int32_t staged = staging_free_.back();
  staging_free_.pop_back();
  std::byte* const start = staging_memory_.get() + std::size_t(staged) * staging_bytes_;
  std::byte* at = start;
  if (sequenced_) {
    const SequenceHeader h{.seq = lane.seq_};
    std::memcpy(at, &h, kHeaderBytes);
    at += kHeaderBytes;
  }
  bool callback = false;
  for (std::uint64_t n = first; n < first + count; ++n) {
    const device::PacketDescriptor& p = lane.fifo().at(n).packet;
    const std::uint32_t length = p.inline_len + p.payload_len;
    std::memcpy(at, &length, kBundleEntryBytes);
    at += kBundleEntryBytes;
    std::memcpy(at, p.inline_data, p.inline_len);
    at += p.inline_len;
    if (p.payload_len != 0) std::memcpy(at, p.payload, p.payload_len);
    at += p.payload_len;
    callback = callback || lane.fifo().has_callback(n);
  }
  const auto total = static_cast<std::size_t>(at - start);
  const bool inject = total <= inject_;
  const bool entry = !inject || callback;
  const std::uint32_t slot = static_cast<std::uint32_t>(first & (fifo_depth_ - 1));
  OpContext& op = lane.ops_[slot];
  op.n = first;
  op.count = count;
  iovec iov{start, total};
  void* desc = staging_desc_;
  const fi_msg msg{.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = lane.address_, .context = &op,
                   .data = origin_ | kBundle | (sequenced_ ? kSequenced : 0)};
  const ssize_t rc = fi_sendmsg(ep_.ep.get(), &msg,
                                FI_REMOTE_CQ_DATA | (inject ? FI_INJECT : 0) | (entry ? FI_COMPLETION : 0));
  if (rc != 0) {
    staging_free_.push_back(staged);
    op.count = 1;
    if (rc != -FI_EAGAIN) {
      post_failed(lane, "fi_sendmsg", rc);
      return Step::failed;
    }
    ++counters_.again;
    tending_ = true;
    return Step::wait;
  }
  ++ops_posted_;
  lane.seq_ += sequenced_ ? 1 : 0;
  lane.posted_ += count;
  counters_.packets_sent += count;
  ++counters_.bundles_sent;
  counters_.bundled += count;
  if (inject) {
    staging_free_.push_back(staged);
  } else {
    lane.staging_[slot] = staged;
  }
  if (!entry) {
    counters_.injected += count;
    op.count = 1;
    for (std::uint64_t n = first; n < first + count; ++n) mark_done(lane, n);
  }
  return Step::posted;
}

// Posts descriptor n, the lane's next. wait: the provider (or the staging
// pool) has no room now; progress() tries again.
OfiDevice::Step OfiDevice::post_one(OfiLane& lane, std::uint64_t n) {
  return device::visit(lane.fifo().at(n), device::cases(
      /*packet*/ [&](const device::PacketDescriptor& p) { return send_packet(lane, n, p); },
      /*put*/ [&](const device::RdmaDescriptor& x) { return rdma(lane, n, x, true); },
      /*get*/ [&](const device::RdmaDescriptor& x) { return rdma(lane, n, x, false); },
      // Never built for this lane (offloads_atomic() is false): atomics to
      // an ofi peer go as messages its engine executes.
      /*atomic*/ [&](const device::AtomicDescriptor&) {
        refuse(lane, n, {StatusCode::not_supported, "ofi: atomics are not offloaded on this lane"});
        return Step::posted;
      }));
}

OfiDevice::Step OfiDevice::send_packet(OfiLane& lane, std::uint64_t n, const device::PacketDescriptor& p) {
  static constexpr Status kTooLong{StatusCode::invalid_argument, "ofi: a packet longer than the lane's max_packet()"};
  if (std::size_t{p.inline_len} + p.payload_len > max_packet_) {
    refuse(lane, n, kTooLong);
    return Step::posted;
  }
  const std::uint32_t slot = static_cast<std::uint32_t>(n & (fifo_depth_ - 1));
  const std::size_t skip = compact_ && p.compact_prefix != 0 && p.compact_prefix <= p.inline_len ? p.compact_prefix : 0;
  const std::size_t head = sequenced_ ? kHeaderBytes : 0;
  SequenceHeader& h = lane.headers_[slot];
  h = SequenceHeader{.seq = lane.seq_};
  const std::uint64_t data = origin_ | (sequenced_ ? kSequenced : 0) |
                             (skip != 0 ? kCompact | std::uint64_t{p.immediate} << 32 : 0);
  const std::size_t total = head + p.inline_len - skip + p.payload_len;

  iovec iov[3];
  void* desc[3] = {nullptr, nullptr, nullptr};
  std::size_t count = 0;
  std::int32_t staged = -1;
  if (mr_local_) {
    // Everything from one registered staging packet.
    if (staging_free_.empty()) {
      ++counters_.staging_stalls;
      tending_ = true;
      return Step::wait;
    }
    staged = staging_free_.back();
    staging_free_.pop_back();
    std::byte* b = staging_memory_.get() + std::size_t(staged) * staging_bytes_;
    std::memcpy(b, &h, head);
    std::memcpy(b + head, p.inline_data + skip, p.inline_len - skip);
    if (p.payload_len != 0) std::memcpy(b + head + p.inline_len - skip, p.payload, p.payload_len);
    iov[0] = {b, total};
    desc[0] = staging_desc_;
    count = 1;
  } else {
    if (head != 0) iov[count++] = {&h, head};
    if (p.inline_len != skip) iov[count++] = {const_cast<std::byte*>(p.inline_data) + skip, p.inline_len - skip};
    if (p.payload_len != 0) {
      if (p.payload_keyed) desc[count] = reinterpret_cast<void*>(p.payload_keys[key_id_]);
      iov[count++] = {const_cast<std::byte*>(p.payload), p.payload_len};
    }
  }
  // A packet that paces a rendezvous completes when delivered: an injected
  // one would complete at once, and the sender would stream on while the
  // receiver's stop is on its way. (Not on shm: see delivery_complete_.)
  const bool delivery = p.await_delivery && delivery_complete_;
  const bool inject = total <= inject_ && !delivery;
  const bool entry = !inject || lane.fifo().has_callback(n);
  OpContext& op = lane.ops_[slot];
  op.n = n;
  op.count = 1;
  const fi_msg msg{.msg_iov = iov, .desc = desc, .iov_count = count, .addr = lane.address_, .context = &op,
                   .data = data};
  const ssize_t rc = fi_sendmsg(ep_.ep.get(), &msg,
                                FI_REMOTE_CQ_DATA | (inject ? FI_INJECT : 0) | (entry ? FI_COMPLETION : 0) |
                                    (delivery ? FI_DELIVERY_COMPLETE : 0));
  if (rc == -FI_EAGAIN) {
    if (staged >= 0) staging_free_.push_back(staged);
    ++counters_.again;
    tending_ = true;
    return Step::wait;
  }
  if (rc != 0) {
    if (staged >= 0) staging_free_.push_back(staged);
    post_failed(lane, "fi_sendmsg", rc);
    return Step::failed;
  }
  ++ops_posted_;
  lane.seq_ += sequenced_ ? 1 : 0;
  ++lane.posted_;
  ++counters_.packets_sent;
  if (skip != 0) ++counters_.compact_sent;
  if (staged >= 0 && inject) staging_free_.push_back(staged);
  else if (staged >= 0) lane.staging_[slot] = staged;
  if (!entry) {
    ++counters_.injected;
    mark_done(lane, n);
  }
  return Step::posted;
}

// An injected send with CQ data and no completion entry, of iov[0..count)
// (total bytes, at most the inject size). fi_injectdata is fi_sendmsg with
// FI_INJECT and without FI_COMPLETION (counted alike) by a shorter path:
// shm's skips the transmit lock and the completion step, and 8-byte
// ping-pongs of raw libfabric over shm took 0.86x as long by it. So a
// packet of one buffer, or of small ones gathered here, goes by it.
ssize_t OfiDevice::inject_data(const iovec* iov, std::size_t count, std::size_t total, fi_addr_t to,
                               std::uint64_t data) {
  static constexpr std::size_t kGatherBytes = 256;
  if (count == 1) return fi_injectdata(ep_.ep.get(), iov[0].iov_base, iov[0].iov_len, data, to);
  if (count > 1 && total <= kGatherBytes) {
    std::byte gathered[kGatherBytes];
    std::size_t at = 0;
    for (std::size_t i = 0; i < count; ++i) {
      std::memcpy(gathered + at, iov[i].iov_base, iov[i].iov_len);
      at += iov[i].iov_len;
    }
    return fi_injectdata(ep_.ep.get(), gathered, at, data, to);
  }
  void* desc[3] = {nullptr, nullptr, nullptr};
  const fi_msg msg{.msg_iov = iov, .desc = desc, .iov_count = count, .addr = to, .context = nullptr, .data = data};
  return fi_sendmsg(ep_.ep.get(), &msg, FI_REMOTE_CQ_DATA | FI_INJECT);
}

// What ring() and send_packet() would do with the packet's descriptor, from
// the packet's parts: for an injected send on a lane with nothing unposted.
// The FIFO slot is taken all the same, with an empty packet nothing reads.
bool OfiDevice::send_compact(OfiLane& lane, std::uint32_t immediate, std::span<const std::byte> head,
                             std::span<const std::byte> payload) {
  auto& fifo = lane.fifo();
  const std::uint64_t n = fifo.injected();
  const std::size_t head_bytes = sequenced_ ? kHeaderBytes : 0;
  const std::size_t total = head_bytes + head.size() + payload.size();
  if (lane.broken_ || lane.posted_ != n || total > inject_ || head.size() + payload.size() > max_packet_ ||
      (bundle_max_ > 1 && lane.rung_epoch_ == ring_epoch_))  // (later ones of a burst wait for a bundle)
    return false;
  device::Descriptor* d = fifo.try_reserve();
  if (d == nullptr) return false;
  SequenceHeader& h = lane.headers_[n & (fifo_depth_ - 1)];
  h = SequenceHeader{.seq = lane.seq_};
  iovec iov[3];
  std::size_t count = 0;
  if (head_bytes != 0) iov[count++] = {&h, head_bytes};
  if (!head.empty()) iov[count++] = {const_cast<std::byte*>(head.data()), head.size()};
  if (!payload.empty()) iov[count++] = {const_cast<std::byte*>(payload.data()), payload.size()};
  const std::uint64_t data = origin_ | (sequenced_ ? kSequenced : 0) | kCompact | std::uint64_t{immediate} << 32;
  if (inject_data(iov, count, total, lane.address_, data) != 0) return false;  // (the descriptor's way)
  d->kind = device::DescriptorKind::packet;
  d->packet.inline_len = 0;
  d->packet.payload = nullptr;
  d->packet.payload_len = 0;
  d->packet.compact_prefix = 0;
  d->packet.payload_keyed = false;
  d->packet.await_delivery = false;
  fifo.commit();
  lane.rung_epoch_ = ring_epoch_;
  ++ops_posted_;
  lane.seq_ += sequenced_ ? 1 : 0;
  ++lane.posted_;
  ++counters_.packets_sent;
  ++counters_.compact_sent;
  ++counters_.injected;
  mark_done(lane, n);
  return true;
}

OfiDevice::Step OfiDevice::rdma(OfiLane& lane, std::uint64_t n, const device::RdmaDescriptor& x, bool put) {
  static constexpr Status kNoEntry{StatusCode::remote_access, "ofi: the remote key has no ofi entry"};
  static constexpr Status kOutside{StatusCode::remote_access, "ofi: the range lies outside the remote key"};
  const KeyEntry* e = x.remote.entry(key_id_);
  if (e == nullptr || e->length != sizeof(std::uint64_t)) {
    refuse(lane, n, kNoEntry);
    return Step::posted;
  }
  if (x.remote_address < x.remote.address || x.length > x.remote.length ||
      x.remote_address - x.remote.address > x.remote.length - x.length) {
    refuse(lane, n, kOutside);
    return Step::posted;
  }
  std::uint64_t key = 0;
  std::memcpy(&key, e->bytes.data(), sizeof key);
  const std::uint32_t slot = static_cast<std::uint32_t>(n & (fifo_depth_ - 1));
  OpContext& op = lane.ops_[slot];
  op.n = n;
  op.count = 1;
  iovec local{x.local, x.length};
  void* desc = reinterpret_cast<void*>(x.local_keys[key_id_]);
  fi_rma_iov remote{.addr = virt_addr_ ? x.remote_address : x.remote_address - x.remote.address, .len = x.length,
                    .key = key};
  const fi_msg_rma msg{.msg_iov = &local, .desc = &desc, .iov_count = 1, .addr = lane.address_,
                       .rma_iov = &remote, .rma_iov_count = 1, .context = &op, .data = 0};
  // Where packets may pass a PUT, its completion must mean it is placed:
  // a fin or a fence answer goes after it. A GET asks the same although its
  // completion means its data is here: without it libfabric's shm takes its
  // fast path for both, the initiator copying the peer's memory by CMA
  // itself (faster: a 64 KiB ping-pong 12 instead of 16 us), and that path
  // checks no key, so a stale or foreign key would read whatever the
  // address now holds.
  const std::uint64_t flags = FI_COMPLETION | (fabric_.facts().ordered ? 0 : FI_DELIVERY_COMPLETE);
  const ssize_t rc = put ? fi_writemsg(ep_.ep.get(), &msg, flags) : fi_readmsg(ep_.ep.get(), &msg, flags);
  if (rc == -FI_EAGAIN) {
    ++counters_.again;
    tending_ = true;
    return Step::wait;
  }
  if (rc != 0) {
    post_failed(lane, put ? "fi_writemsg" : "fi_readmsg", rc);
    return Step::failed;
  }
  ++ops_posted_;
  ++lane.posted_;
  ++counters_.rdma_posted;
  return Step::posted;
}

// Its callback runs in progress(), in order after those before it, never in
// the posting call.
void OfiDevice::refuse(OfiLane& lane, std::uint64_t n, Status why) {
  ++counters_.refused;
  ++lane.posted_;
  fail_later(lane, n, why);
}

// Operation n (posted) fails with why once every one before it is done:
// tend() calls its callback in its turn, then the counter passes it.
void OfiDevice::fail_later(OfiLane& lane, std::uint64_t n, Status why) {
  lane.refused_status_[n & (fifo_depth_ - 1)] = why;
  lane.refused_.insert(std::upper_bound(lane.refused_.begin(), lane.refused_.end(), n), n);
  release_staging(lane, n);
  tending_ = true;
}

// The reorder window: slot n is done; the counter moves over the done run
// at the front.
void OfiDevice::mark_done(OfiLane& lane, std::uint64_t n) {
  if (n < lane.retired_ || n >= lane.posted_) return;  // from before the lane broke
  const std::uint64_t mask = fifo_depth_ - 1;
  lane.done_[n & mask] = 1;
  if (n != lane.retired_) return;
  std::uint64_t c = lane.retired_;
  while (c < lane.posted_ && lane.done_[c & mask] != 0) {
    lane.done_[c & mask] = 0;
    ++c;
  }
  lane.retired_ = c;
  lane.fifo().counter().advance_to(c);
}

void OfiDevice::release_staging(OfiLane& lane, std::uint64_t n) {
  std::int32_t& s = lane.staging_[n & (fifo_depth_ - 1)];
  if (s >= 0) staging_free_.push_back(s);
  s = -1;
}

void OfiDevice::post_failed(OfiLane& lane, const char* call, long rc) {
  log("%s (context %u to task %u context %u): %s", call, context_, lane.peer().task, lane.peer().context,
      fi_strerror(static_cast<int>(-rc)));
  break_lane(lane, {StatusCode::device_error, "ofi: posting an operation failed (see the log)"});
}

// What its FIFO holds fails in tend(), from progress().
void OfiDevice::break_lane(OfiLane& lane, Status why) {
  lane.broken_ = true;
  lane.failure_ = why;
  ++broken_lanes_;
  tending_ = true;
}

void OfiDevice::post_receive(std::uint32_t buffer) {
  iovec iov{recv_memory_.get() + buffer * recv_bytes_, recv_bytes_};
  void* desc = recv_desc_;
  const fi_msg msg{.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = FI_ADDR_UNSPEC,
                   .context = &recv_ops_[buffer], .data = 0};
  const ssize_t rc = fi_recvmsg(ep_.ep.get(), &msg, FI_MULTI_RECV | FI_COMPLETION);
  if (rc == 0) {
    ++counters_.receives_posted;
    return;
  }
  if (rc == -FI_ENOMEM)
    post_rescue();
  else if (rc != -FI_EAGAIN)
    log("fi_recvmsg (context %u): %s", context_, fi_strerror(static_cast<int>(-rc)));
  to_repost_.push_back(buffer);
  tending_ = true;
}

// libfabric 1.17's shm takes a receive entry from one pool, of rx_attr->size,
// both for each receive posted and for each message that finds none posted
// (unexpected), and that message keeps a slot of the endpoint's command
// queue, of the same size, until a receive takes it. When every buffer is
// full at once (a receiver that fell behind an injecting sender) the
// unexpected messages can take every entry: each multi-receive post then
// fails with ENOMEM, and nothing frees an entry, so both ends stop for good.
// A receive without FI_MULTI_RECV takes the oldest unexpected message in the
// entry that message holds, allocating none; once handled its entry is free
// and a buffer goes back in it, and that buffer takes the other unexpected
// messages in theirs. One packet long; the order holds, as the rescue takes
// the oldest unexpected message and the buffer those after it.
void OfiDevice::post_rescue() {
  if (rescue_posted_) return;
  iovec iov{rescue_memory_, std::size_t{max_packet_} + kHeaderBytes};
  void* desc = recv_desc_;
  const fi_msg msg{.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = &rescue_op_,
                   .data = 0};
  const ssize_t rc = fi_recvmsg(ep_.ep.get(), &msg, FI_COMPLETION);
  if (rc == 0) {
    rescue_posted_ = true;
    if (counters_.rescues++ == 0)
      log("context %u: the provider has no receive entry left for a multi-receive buffer (fi_recvmsg: ENOMEM); "
          "taking its unexpected messages one at a time until it has",
          context_);
    return;
  }
  if (rc != -FI_EAGAIN && rc != -FI_ENOMEM)
    log("fi_recvmsg (context %u, rescue): %s", context_, fi_strerror(static_cast<int>(-rc)));
  tending_ = true;  // tend() tries the buffers, and this, again
}

void OfiDevice::repost_receives() {
  if (to_repost_.empty()) return;
  std::vector<std::uint32_t> again;
  again.swap(to_repost_);
  to_repost_.reserve(again.capacity());
  for (std::uint32_t b : again) post_receive(b);
}

void OfiDevice::on_entry(const fi_cq_data_entry& e, device::PacketSink& sink) {
  ++counters_.entries;
  auto* op = static_cast<OpContext*>(e.op_context);
  // A receive buffer's entries: a packet, or (FI_MULTI_RECV, maybe alone in
  // an entry of its own) the buffer handed back.
  if ((e.flags & (FI_RECV | FI_MULTI_RECV)) != 0 || (op != nullptr && op->lane == nullptr)) {
    // (A packet may be empty: a compact message with no payload and no
    // sequence header is all CQ data.)
    if (e.flags & FI_REMOTE_CQ_DATA)
      on_packet(e.data, static_cast<const std::byte*>(e.buf), e.len, sink);
    else if ((e.flags & FI_RECV) && e.len != 0)
      ++counters_.dropped;
    // Handled, so the buffer may go back (packets held for order were
    // copied). The rescue's message freed a receive entry: a buffer takes it
    // now, before the provider's next progress gives it to another
    // unexpected message.
    if (op == &rescue_op_) {
      rescue_posted_ = false;
      repost_receives();
    } else if ((e.flags & FI_MULTI_RECV) && op != nullptr) {
      post_receive(static_cast<std::uint32_t>(op->n));
    }
    return;
  }
  if (op == nullptr || op->lane == nullptr) return;
  if (!op->lane->broken_) complete(*op);
}

// A send, PUT or GET completed: its slot (a bundle's slots) done.
void OfiDevice::complete(OpContext& op) {
  OfiLane& lane = *op.lane;
  release_staging(lane, op.n);
  const std::uint32_t count = op.count;
  op.count = 1;
  for (std::uint64_t n = op.n; n < op.n + count; ++n) mark_done(lane, n);
}

void OfiDevice::on_error() {
  fi_cq_err_entry err{};
  if (fi_cq_readerr(ep_.cq.get(), &err, 0) != 1) return;
  char text[256];
  const char* what = fi_cq_strerror(ep_.cq.get(), err.prov_errno, err.err_data, text, sizeof text);
  auto* op = static_cast<OpContext*>(err.op_context);
  if (op == nullptr || op->lane == nullptr) {
    ++counters_.receive_errors;
    log("receive on context %u: %s (%s)", context_, fi_strerror(err.err), what != nullptr ? what : "");
    if (op == &rescue_op_) {
      rescue_posted_ = false;
      repost_receives();
    } else if ((err.flags & FI_MULTI_RECV) && op != nullptr) {
      post_receive(static_cast<std::uint32_t>(op->n));
    }
    return;
  }
  OfiLane& lane = *op->lane;
  if (lane.broken_) return;
  const Status status = completion_status(err.err);
  const std::uint64_t n = op->n;
  const bool rdma = n >= lane.retired_ && n < lane.posted_ &&
                    lane.fifo().at(n).kind != device::DescriptorKind::packet;
  log("context %u to task %u context %u: operation %llu failed: %s (%s)", context_, lane.peer().task,
      lane.peer().context, static_cast<unsigned long long>(n), fi_strerror(err.err), what != nullptr ? what : "");
  // (An I/O error of a PUT or GET is the peer refusing it: verbs;ofi_rxm
  // reports a remote access error so; tcp;ofi_rxm cancels it.)
  const bool refused = rdma && (err.err == FI_EIO || err.err == FI_ECANCELED);
  const bool peer_lost = status == StatusCode::peer_failed && !refused;
  if (peer_lost || !rdma) return break_lane(lane, status);
  // A PUT or GET the peer refused gets its own status; the lane ends after
  // it, as an RC queue pair does on verbs (and tcp;ofi_rxm drops the
  // connection): what follows fails as when the peer is gone.
  static constexpr Status kRefused{StatusCode::remote_access,
                                   "ofi: the peer refused the PUT or GET (a stale or foreign key; see the log)"};
  static constexpr Status kBrokeAfter{StatusCode::peer_failed,
                                      "ofi: the lane broke after the peer refused a PUT or GET (see the log)"};
  fail_later(lane, n, kRefused);
  break_lane(lane, kBrokeAfter);
}

// Untrusted: the origin must be a peer context this task knows, the flags
// consistent, a sequence header whole and its number one not yet seen.
void OfiDevice::on_packet(std::uint64_t data, const std::byte* bytes, std::size_t length,
                          device::PacketSink& sink) {
  const auto word = static_cast<std::uint32_t>(data);
  const std::uint32_t flags = word & kFlags;
  const std::size_t head = (flags & kSequenced) != 0 ? kHeaderBytes : 0;
  const auto immediate = static_cast<std::uint32_t>(data >> 32);
  const Endpoint origin{origin_task(word), origin_context(word)};
  Inbound* in = inbound(origin);
  if (in == nullptr || length < head || length > head + max_packet_ || ((flags & kCompact) != 0 && !compact_) ||
      ((flags & kCompact) == 0 && immediate != 0) || (flags & (kCompact | kBundle)) == (kCompact | kBundle)) {
    ++counters_.dropped;
    return;
  }
  if (head == 0) {
    ++counters_.packets_received;
    ++backlog_;
    return deliver(origin, flags, immediate, {bytes, length}, sink);
  }
  SequenceHeader h;
  std::memcpy(&h, bytes, kHeaderBytes);
  if (h.reserved != 0) {
    ++counters_.dropped;
    return;
  }
  ++counters_.packets_received;
  ++backlog_;
  const std::span<const std::byte> rest{bytes + kHeaderBytes, length - kHeaderBytes};
  if (h.seq != in->expected) {
    // Ahead of the next one due: kept until the gap is filled. Behind it:
    // a sequence number already delivered.
    const auto ahead = static_cast<std::uint16_t>(h.seq - in->expected);
    if (ahead >= 0x8000 || in->held.size() >= 0x4000) {
      ++counters_.dropped;
      return;
    }
    ++counters_.reordered;
    in->held.push_back({h.seq, flags, immediate, {rest.begin(), rest.end()}});
    return;
  }
  deliver(origin, flags, immediate, rest, sink);
  ++in->expected;
  while (!in->held.empty()) {
    auto next = std::find_if(in->held.begin(), in->held.end(), [in](const Held& x) { return x.seq == in->expected; });
    if (next == in->held.end()) break;
    Held x = std::move(*next);
    in->held.erase(next);
    deliver(origin, x.flags, x.immediate, x.bytes, sink);
    ++in->expected;
  }
}

void OfiDevice::deliver(Endpoint origin, std::uint32_t flags, std::uint32_t immediate,
                        std::span<const std::byte> rest, device::PacketSink& sink) {
  if (flags & kBundle)
    deliver_bundle(origin, rest, sink);
  else if (flags & kCompact)
    sink.on_compact_packet(origin, immediate, rest);
  else
    sink.on_packet(origin, rest);
}

// Its packets in order. A length that overruns the bundle (or an empty
// one) drops what is left of it, counted: the packets before went.
void OfiDevice::deliver_bundle(Endpoint origin, std::span<const std::byte> rest, device::PacketSink& sink) {
  ++counters_.bundles_received;
  bool first = true;
  do {
    std::uint32_t length = 0;  // (0 is no packet's)
    if (rest.size() >= kBundleEntryBytes) std::memcpy(&length, rest.data(), kBundleEntryBytes);
    if (length == 0 || length > rest.size() - kBundleEntryBytes) {
      ++counters_.dropped;
      return;
    }
    if (!first) {  // (the bundle itself was counted as one)
      ++counters_.packets_received;
      ++backlog_;
    }
    first = false;
    sink.on_packet(origin, rest.subspan(kBundleEntryBytes, length));
    rest = rest.subspan(kBundleEntryBytes + length);
  } while (!rest.empty());
}

// Per lane: fail what a broken lane holds, fail refused descriptors in
// their turn, post what the provider refused for now; then receive buffers
// the provider refused for now.
std::size_t OfiDevice::tend(device::PacketSink& sink) {
  tending_ = false;  // (set again by whatever still waits)
  std::size_t work = 0;
  for (std::size_t i = 0; i < active_.size(); ++i) {  // (a callback may add a lane)
    OfiLane& lane = *active_[i];
    auto& fifo = lane.fifo();
    if (lane.broken_) {
      if (fifo.counter().snapshot() < fifo.injected()) {
        fifo.complete();  // those done before it broke succeeded
        for (std::uint64_t n : lane.refused_) fifo.fail_one(n, lane.refused_status_[n & (fifo_depth_ - 1)]);
        work += fifo.fail_pending(lane.failure_);
        lane.posted_ = lane.retired_ = fifo.injected();
        lane.refused_.clear();
        for (std::uint32_t s = 0; s < fifo_depth_; ++s) {
          lane.done_[s] = 0;
          release_staging(lane, s);
        }
      }
      if (!lane.reported_) {
        lane.reported_ = true;
        sink.on_lane_failed(lane.peer(), lane.failure_);
        ++work;
      }
      continue;
    }
    while (!lane.refused_.empty() && lane.refused_.front() == lane.retired_) {
      const std::uint64_t n = lane.refused_.front();
      lane.refused_.erase(lane.refused_.begin());
      fifo.complete();
      fifo.fail_one(n, lane.refused_status_[n & (fifo_depth_ - 1)]);
      mark_done(lane, n);
      ++work;
    }
    if (lane.posted_ < fifo.injected()) post(lane);
    if (!lane.refused_.empty() || lane.posted_ < fifo.injected()) tending_ = true;
  }
  broken_lanes_ = 0;
  repost_receives();
  return work;
}

// A lane whose oldest operation has not completed for AMI_OFI_TIMEOUT
// while it had operations outstanding: the provider dropped it (or the
// peer stopped answering without the provider noticing). It fails with a
// timeout, and the lane breaks after it: what the provider may still do
// with it must not reach a reused slot.
void OfiDevice::watch_stalls() {
  static constexpr Status kTimedOut{StatusCode::timeout,
                                    "ofi: the provider did not complete the operation within AMI_OFI_TIMEOUT"};
  static constexpr Status kBrokeAfter{StatusCode::peer_failed,
                                      "ofi: the lane broke after an operation timed out (AMI_OFI_TIMEOUT)"};
  const std::int64_t now = device::coarse_now_ns();
  const std::int64_t limit = std::int64_t{fabric_.options().timeout_ms} * 1'000'000;
  for (std::size_t i = 0; i < active_.size(); ++i) {
    OfiLane& lane = *active_[i];
    if (lane.broken_ || lane.retired_ == lane.posted_) {
      lane.stall_since_ = 0;
      continue;
    }
    if (lane.stall_since_ == 0 || lane.stall_mark_ != lane.retired_) {
      lane.stall_mark_ = lane.retired_;
      lane.stall_since_ = now;
    } else if (now - lane.stall_since_ > limit && std::find(lane.refused_.begin(), lane.refused_.end(),
                                                             lane.retired_) == lane.refused_.end()) {
      log("context %u to task %u context %u: operation %llu not completed in %u ms; failing the lane", context_,
          lane.peer().task, lane.peer().context, static_cast<unsigned long long>(lane.retired_),
          fabric_.options().timeout_ms);
      ++counters_.timed_out;
      fail_later(lane, lane.retired_, kTimedOut);
      break_lane(lane, kBrokeAfter);
    }
  }
}

std::size_t OfiDevice::progress(device::PacketSink& sink, std::size_t budget) {
  std::size_t work = 0;
  backlog_ = 0;
  if ((++polls_ & 1023) == 0) watch_stalls();
  flush();  // what ring() held back goes first, and a new burst starts
  if (tending_) work += tend(sink);
  fi_cq_data_entry e[kReadBatch];
  std::size_t read = 0;
  while (read < budget) {
    const ssize_t n = fi_cq_read(ep_.cq.get(), e, std::min<std::size_t>(kReadBatch, budget - read));
    if (n == -FI_EAVAIL) {
      on_error();
      ++read;
      continue;
    }
    if (n <= 0) {
      if (n != -FI_EAGAIN) log("fi_cq_read (context %u): %s", context_, fi_strerror(static_cast<int>(-n)));
      break;
    }
    for (ssize_t i = 0; i < n; ++i) on_entry(e[i], sink);
    read += static_cast<std::size_t>(n);
    if (n < kReadBatch) break;
  }
  work += read;
  if (tending_ || broken_lanes_ != 0) work += tend(sink);
  return work;
}

}  // namespace ami::ofi
