// verbs_backend/verbs_handshake.cpp — connecting a lane's queue pair on
// first use (see verbs_handshake.hpp): the messages, and the context's side
// of the exchange, driven by VerbsDevice::progress().
#include "verbs_handshake.hpp"

#include <algorithm>
#include <cstring>

#include "ami/device/byte_io.hpp"
#include "ami/device/coarse_clock.hpp"
#include "verbs_device.hpp"

namespace ami::verbs {

using ami::detail::load;
using ami::detail::store;

namespace {

// The first repeat after 50 ms, then twice as long each time, at most 1 s
// apart: a request waits in the peer's receive queue while the peer is busy
// elsewhere (a repeat would only wait beside it), and UD on a sound fabric
// seldom loses one.
constexpr std::int64_t kFirstRetryNs = 50'000'000;
constexpr std::int64_t kLongestRetryNs = 1'000'000'000;

constexpr Status kNoReply{StatusCode::peer_failed,
                          "verbs: the peer context never answered the request to connect the lane (see the log)"};
constexpr Status kNotReady{StatusCode::peer_failed,
                           "verbs: the peer context asked to connect the lane, then went silent (see the log)"};
constexpr Status kTransition{StatusCode::device_error, "verbs: connecting the queue pair failed (see the log)"};

// A send's wr_id on the UD queue pair; a receive's is its buffer's index.
constexpr std::uint64_t kSendTag = 1ull << 32;

std::int64_t retry_after(std::uint16_t tries) {
  return std::min(kLongestRetryNs, kFirstRetryNs << std::min<std::uint16_t>(tries, 5));
}

}  // namespace

// magic u32, type u8, reserved u8, context u16, peer context u16,
// reserved u16, task u32, nonce u64, qpn u32, psn u32.
void Handshake::encode(std::span<std::byte, kBytes> out) const {
  std::byte* p = out.data();
  store(p, kMagic);
  store(p, static_cast<std::uint8_t>(type));
  store(p, std::uint8_t{0});
  store(p, context);
  store(p, peer_context);
  store(p, std::uint16_t{0});
  store(p, task);
  store(p, nonce);
  store(p, qpn);
  store(p, psn);
}

std::optional<Handshake> Handshake::decode(std::span<const std::byte> bytes) {
  if (bytes.size() != kBytes) return std::nullopt;
  const std::byte* p = bytes.data();
  Handshake m;
  if (load<std::uint32_t>(p) != kMagic) return std::nullopt;
  const auto type = load<std::uint8_t>(p);
  if (type < 1 || type > 3) return std::nullopt;
  m.type = static_cast<Type>(type);
  (void)load<std::uint8_t>(p);
  m.context = load<std::uint16_t>(p);
  m.peer_context = load<std::uint16_t>(p);
  (void)load<std::uint16_t>(p);
  m.task = load<std::uint32_t>(p);
  m.nonce = load<std::uint64_t>(p);
  m.qpn = load<std::uint32_t>(p);
  m.psn = load<std::uint32_t>(p);
  if (m.qpn == 0 || m.qpn > 0xFFFFFF || m.psn > 0xFFFFFF) return std::nullopt;
  return m;
}

Connection* VerbsDevice::connection(std::size_t index) {
  auto it = queues_.connections.find(static_cast<std::uint32_t>(index));
  return it == queues_.connections.end() ? nullptr : &it->second;
}

// The request goes now; progress() repeats it until the reply comes (with
// rdma_cm the connection manager does, and progress() takes its events).
void VerbsDevice::start_request(Connection& c, Endpoint peer) {
  const std::int64_t now = device::coarse_now_ns();
  c.give_up_ns = now + std::int64_t{domain_.options().connect_timeout_ms} * 1'000'000;
  c.tries = 1;
  c.next_try_ns = now + retry_after(0);
  ++handshakes_;
  if (cm_) {  // the connection manager repeats its own messages
    c.next_try_ns = c.give_up_ns;
    next_handshake_ns_ = std::min(next_handshake_ns_, c.give_up_ns);
    return cm_request(c, peer);
  }
  next_handshake_ns_ = std::min(next_handshake_ns_, c.next_try_ns);
  send_handshake(Handshake::Type::request, peer, c);
}

// One message to the peer context's UD QP from a free send buffer; with
// none free (a burst of connections) it is not sent, and the timer sends
// it again.
void VerbsDevice::send_handshake(Handshake::Type type, Endpoint peer, const Connection& c) {
  if (queues_.ud_sends_out >= kUdSends) {
    ++counters_.handshakes_unsent;
    return;
  }
  ibv_ah* ah = domain_.address_handle(context_, peer.task);
  if (ah == nullptr) {
    ++counters_.handshakes_unsent;
    return;
  }
  const std::uint32_t slot = queues_.ud_send_next++ % kUdSends;
  std::byte* buffer = queues_.ud_memory.get() + std::size_t{kUdReceives} * kUdReceiveBytes +
                      std::size_t{slot} * kUdSendBytes;
  Handshake m{type, domain_.task(), context_, peer.context, domain_.nonce(), c.qp->qp_num, c.psn};
  m.encode(std::span<std::byte, Handshake::kBytes>(buffer, Handshake::kBytes));
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer), Handshake::kBytes, queues_.ud_mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kSendTag | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = domain_.peer_ud_qpn(peer);
  wr.wr.ud.remote_qkey = kUdQkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(queues_.ud.get(), &wr, &bad)) {
    log_qp(queues_.ud.get(), "ibv_post_send (handshake)", errno_of_rc(rc));
    ++counters_.handshakes_unsent;
    return;
  }
  ++queues_.ud_sends_out;
  ++counters_.handshakes_sent;
}

// A completion on the UD QP: a send buffer free again, or a message in.
void VerbsDevice::on_handshake(const ibv_wc& wc) {
  if (wc.wr_id & kSendTag) {  // (wc.opcode is undefined on an error completion)
    if (queues_.ud_sends_out > 0) --queues_.ud_sends_out;
    if (wc.status != IBV_WC_SUCCESS)
      log("handshake send on UD QP 0x%06x: %s", wc.qp_num, ibv_wc_status_str(wc.status));
    return;
  }
  const auto buffer = static_cast<std::uint32_t>(wc.wr_id);
  if (wc.status == IBV_WC_SUCCESS && buffer < kUdReceives && wc.byte_len >= kUdGrhBytes) {
    const std::byte* bytes = queues_.ud_memory.get() + std::size_t{buffer} * kUdReceiveBytes + kUdGrhBytes;
    const std::optional<Handshake> m = Handshake::decode({bytes, wc.byte_len - kUdGrhBytes});
    // A request from a task not learnt yet (addresses on demand) has its
    // address fetched first: its nonce is checked against that.
    if (m && m->task < domain_.tasks() && m->task != domain_.task() && domain_.learn_on_demand(m->task) &&
        m->nonce == domain_.peer(m->task).nonce && m->context < domain_.contexts() && m->peer_context == context_) {
      ++counters_.handshakes_received;
      on_handshake_message(*m);
    } else {
      ++counters_.handshakes_dropped;
    }
  } else if (wc.status != IBV_WC_SUCCESS) {
    log("handshake receive on UD QP 0x%06x: %s", wc.qp_num, ibv_wc_status_str(wc.status));
  }
  if (buffer < kUdReceives) repost_handshake(buffer);
}

void VerbsDevice::repost_handshake(std::uint32_t buffer) {
  if (int err = post_handshake_receive(queues_, buffer)) log_qp(queues_.ud.get(), "ibv_post_recv (handshake)", err);
}

void VerbsDevice::on_handshake_message(const Handshake& m) {
  const Endpoint peer{m.task, m.context};
  const std::size_t index = domain_.lane_index(peer);
  Connection* c = connection(index);
  switch (m.type) {
    case Handshake::Type::request:
      if (c == nullptr) {
        try {
          c = &domain_.new_connection(context_, peer, false);
        } catch (const std::exception& e) {
          log("no queue pair for a request from task %u context %u: %s", peer.task, peer.context, e.what());
          return;
        }
        ++handshakes_;
        c->give_up_ns = device::coarse_now_ns() + std::int64_t{domain_.options().connect_timeout_ms} * 1'000'000;
        return accept(*c, peer, m);
      }
      if (c->state == Connection::State::requesting) {
        // Both asked: the lower task's request stands.
        if (domain_.task() < peer.task) return;
        c->active = false;
        c->give_up_ns = device::coarse_now_ns() + std::int64_t{domain_.options().connect_timeout_ms} * 1'000'000;
        return accept(*c, peer, m);
      }
      // A repeat: the reply was lost, or crossed it.
      if (!c->active && c->remote_qpn == m.qpn &&
          (c->state == Connection::State::accepted || c->state == Connection::State::ready))
        send_handshake(Handshake::Type::reply, peer, *c);
      return;
    case Handshake::Type::reply:
      if (c == nullptr || !c->active) return;
      if (c->state == Connection::State::requesting) {
        c->remote_qpn = m.qpn;
        if (domain_.connect_queue_pair(*c, peer, m.qpn, m.psn) != 0) return connection_failed(*c, peer, kTransition);
        send_handshake(Handshake::Type::ready, peer, *c);
        return connection_ready(*c, peer);
      }
      // A repeat: the ready message was lost.
      if (c->state == Connection::State::ready && c->remote_qpn == m.qpn)
        send_handshake(Handshake::Type::ready, peer, *c);
      return;
    case Handshake::Type::ready:
      if (c != nullptr && !c->active && c->state == Connection::State::accepted && c->remote_qpn == m.qpn)
        connection_ready(*c, peer);
      return;
  }
}

// The replying side: the QP goes to RTS towards the requester's now, but
// the lane posts nothing until the requester is ready.
void VerbsDevice::accept(Connection& c, Endpoint peer, const Handshake& m) {
  c.remote_qpn = m.qpn;
  if (domain_.connect_queue_pair(c, peer, m.qpn, m.psn) != 0) return connection_failed(c, peer, kTransition);
  c.state = Connection::State::accepted;
  c.tries = 1;
  c.next_try_ns = device::coarse_now_ns() + retry_after(0);
  next_handshake_ns_ = std::min(next_handshake_ns_, c.next_try_ns);
  send_handshake(Handshake::Type::reply, peer, c);
}

void VerbsDevice::connection_ready(Connection& c, Endpoint peer) {
  c.state = Connection::State::ready;
  --handshakes_;
  ++counters_.connections_ready;
  if (VerbsLane* lane = lanes_[domain_.lane_index(peer)].get()) {
    lane->ready_ = true;
    tending_ = true;  // tend_lanes() posts what waited
  }
}

// The lane, if there is one yet, breaks; one made later is born broken.
void VerbsDevice::connection_failed(Connection& c, Endpoint peer, Status why) {
  if (c.state == Connection::State::requesting || c.state == Connection::State::accepted) --handshakes_;
  c.state = Connection::State::failed;
  if (VerbsLane* lane = lanes_[domain_.lane_index(peer)].get()) fail_unconnected(*lane, why);
}

void VerbsDevice::fail_unconnected(VerbsLane& lane, Status why) {
  if (lane.broken_) return;
  lane.broken_ = true;
  lane.failure_ = why;
  ++broken_lanes_;
  tending_ = true;
}

// The first packet from the requester on an accepted QP says it is at RTS.
void VerbsDevice::heard_on(Endpoint peer) {
  Connection* c = connection(domain_.lane_index(peer));
  if (c != nullptr && c->state == Connection::State::accepted) connection_ready(*c, peer);
}

// Repeats what is due and gives up on what waited too long.
std::size_t VerbsDevice::tend_handshakes() {
  const std::int64_t now = device::coarse_now_ns();
  if (now < next_handshake_ns_) return 0;
  std::size_t work = 0;
  next_handshake_ns_ = INT64_MAX;
  for (auto& [index, c] : queues_.connections) {
    if (c.state != Connection::State::requesting && c.state != Connection::State::accepted) continue;
    const Endpoint peer{static_cast<std::uint32_t>(index / domain_.contexts()),
                        static_cast<std::uint16_t>(index % domain_.contexts())};
    if (now >= c.give_up_ns) {
      log("lane from context %u to task %u context %u: no answer to %u connection %s(s) in %u ms", context_,
          peer.task, peer.context, c.tries, c.active ? "request" : "reply", domain_.options().connect_timeout_ms);
      connection_failed(c, peer, c.active ? kNoReply : kNotReady);
      ++work;
      continue;
    }
    if (now >= c.next_try_ns) {
      send_handshake(c.active ? Handshake::Type::request : Handshake::Type::reply, peer, c);
      c.next_try_ns = now + retry_after(c.tries++);
      ++work;
    }
    next_handshake_ns_ = std::min(next_handshake_ns_, std::min(c.next_try_ns, c.give_up_ns));
  }
  return work;
}

}  // namespace ami::verbs
