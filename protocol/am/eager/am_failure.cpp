// protocol/am/eager/am_failure.cpp — a failed peer, and the keepalives that
// find one that died quietly.
//
// A device reports a lane it lost for good (the peer's process exited, its
// QP went into error) after failing what was in the lane's FIFO. The engine
// then fails everything else that concerns the peer: instructions still in
// its work queue, control packets it owed it, requests waiting for its
// answer, messages from it being received; runs the error handler; and
// refuses later operations to it with peer_failed. Other peers are not
// touched.
//
// A peer here is one endpoint, and everything below fails one endpoint,
// once; the error handler runs once for it. A peer this context never
// talked to has no state (no lane, nothing queued, nothing owed): its
// failure is only recorded, in the record every endpoint has, and reading
// it back allocates nothing. That a task ended — so every
// one of its endpoints fails, talked to or not — is known outside the
// engine, and each endpoint is then reported: by the shm device, which
// fails a lane to every context of a task whose process exited, and by the
// context, which abandons every endpoint of a task whose bootstrap
// connection closed. A lane that breaks alone (a verbs QP in error) fails
// only its endpoint.
//
// A peer that dies while nothing is on its lane is found by keepalives:
// every AMI_KEEPALIVE_INTERVAL, a peer this context has a lane to that sent
// nothing since the last look gets a keepalive packet (at most
// kKeepaliveBatch peers a round, taken in turn); a lane that cannot deliver
// it (verbs: transport retries exceeded) breaks, and the device reports it.
// Whether this context still waits on the peer does not matter: a peer whose
// GET was served, or whose answers all came, may die afterwards, and the
// error handler is how the user hears of it. Of two quiet peers only one
// probes in a round: the other hears the probe.

#include "ami/device/coarse_clock.hpp"
#include "am_engine.hpp"

namespace ami::protocol {

Status AmEngine::check_alive(Endpoint dest, const char* failed) const {
  if (dest.task >= shape_.tasks || dest.context >= shape_.contexts) return Status::success();
  const Peer& peer = peers_[std::size_t{dest.task} * shape_.contexts + dest.context];
  return peer.failure.ok() ? Status::success() : Status{StatusCode::peer_failed, failed};
}

void AmEngine::on_lane_failed(Endpoint e, Status why) {
  Peer* peer = peer_for(e);
  if (peer == nullptr || !peer->failure.ok()) return;
  if (why.ok()) why = {StatusCode::peer_failed, "the peer's lane broke"};
  fail_peer(*peer, why);
}

void AmEngine::fail_peer(Peer& peer, Status why) {
  peer.failure = why;
  ++stats_.peers_failed;
  if (peer.state != nullptr) fail_work(peer, why);
  const Endpoint e = endpoint_of(peer);
  // (A copy: a watcher may stop watching from inside its call.)
  const std::vector<PeerErrorHandler> watchers = watchers_;
  for (const PeerErrorHandler& w : watchers) w.fn(w.cookie, e, why);
  if (error_handler_.fn != nullptr) error_handler_.fn(error_handler_.cookie, e, why);
}

void AmEngine::fail_work(Peer& peer, Status why) {
  PeerState& s = *peer.state;
  const std::uint32_t index = index_of(peer);
  // Requests are marked first and settled after, each found again by its id
  // (a callback may post new work that reuses a settled request's slot).
  std::vector<std::uint64_t> touched;
  auto mark = [&](Request& r) {
    if (r.failure.ok()) r.failure = why;
    r.verdict_pending = false;  // no answer will come
    touched.push_back(r.id());
  };
  // Control packets owed to the peer. A cts or fin with an owner carried
  // that send's local completion; a GET not yet injected never will be.
  auto owned = [&](Request* r) {
    if (r == nullptr) return;
    r->local_pending = false;
    mark(*r);
  };
  for (Control& c : s.controls)
    std::visit(Overloaded{
                   [](const AckItem&) {},
                   [&](const GetItem& g) {
                     --g.in->gets_pending;
                     if (g.in->failure.ok()) g.in->failure = why;
                   },
                   [](const StopItem&) {},
                   [&](const CtsItem& x) { owned(x.owner); },
                   [&](const FinItem& f) { owned(f.owner); },
                   [](const KeepaliveItem&) {},
                   [](const AtomicReplyItem&) {},
               },
               c);
  s.controls.clear();
  // Instructions that never reached the FIFO (or, for a send, not its last
  // packet, which carries its completion).
  for (Request* r = s.head; r != nullptr; r = r->next) {
    r->local_pending = false;
    mark(*r);
  }
  s.head = s.tail = nullptr;
  for (Request* r = s.unanswered.head; r != nullptr; r = r->ack_next) mark(*r);
  for (Request* r = s.atomics.head; r != nullptr; r = r->ack_next) mark(*r);  // done there or not: unknown
  for (std::uint64_t id : touched)
    if (Request* r = pool_.find(id)) settle(*r);

  // Messages from the peer: one arriving eagerly fails now; a stopped one
  // once its GETs (failed by the device) are accounted for; a deferred one
  // when accept() is called for it.
  if (s.rx.active && s.rx.stopped == nullptr) complete_rx(peer, why);
  std::vector<std::uint64_t> inbound;
  inbound_.for_each_live([&](Inbound& in) {
    if (in.peer == index) inbound.push_back(in.id());
  });
  for (std::uint64_t id : inbound) {
    Inbound* in = inbound_.find(id);
    if (in == nullptr) continue;
    if (in->failure.ok()) in->failure = why;
    in->end_seen = true;  // no cts or fin will come
    if (!in->waiting) check_inbound(*in);
  }
  s.rx = Reassembly{};
}

void AmEngine::watch_peer_failures(PeerErrorHandler watcher) {
  if (watcher.fn != nullptr) watchers_.push_back(watcher);
}

void AmEngine::unwatch_peer_failures(PeerErrorHandler watcher) {
  std::erase_if(watchers_, [&](const PeerErrorHandler& w) { return w.fn == watcher.fn && w.cookie == watcher.cookie; });
}

void AmEngine::abandon_peer(Endpoint e, Status why) {
  Peer* peer = peer_for(e);
  if (peer == nullptr || !peer->failure.ok()) return;
  if (peer->lane != nullptr && peer->state->device->abandon(e, why)) return;
  fail_peer(*peer, why);
}

std::uint64_t AmEngine::heard(Endpoint e) const {
  if (e.task >= shape_.tasks || e.context >= shape_.contexts) return 0;
  const Peer& peer = peers_[std::size_t{e.task} * shape_.contexts + e.context];
  return peer.state != nullptr ? peer.state->heard : 0;  // (no lane: nothing came)
}

Status AmEngine::peer_status(Endpoint dest) const {
  if (dest.task >= shape_.tasks || dest.context >= shape_.contexts)
    return {StatusCode::invalid_argument, "peer_status: endpoint out of range"};
  return peers_[std::size_t{dest.task} * shape_.contexts + dest.context].failure;
}

void AmEngine::keepalive() {
  const std::size_t n = reached_.size();
  std::size_t probed = 0;
  for (std::size_t looked = 0; looked < n && probed < kKeepaliveBatch; ++looked) {
    Peer* p = reached_[keepalive_cursor_++ % n];
    PeerState& s = *p->state;
    const bool quiet = s.heard == s.heard_at_probe;
    s.heard_at_probe = s.heard;
    if (!p->failure.ok() || !quiet) continue;
    push_control(*p, KeepaliveItem{});
    ++stats_.keepalives_sent;
    ++probed;
  }
}

// Called from advance() every 64 advances, with the coarse clock, and
// before sleeping, with the precise one: the sleeper's timer is set for
// next_keepalive_ns_, and a coarse reading that lags it would find the
// round not due yet each time the timer wakes the context.
void AmEngine::maybe_keepalive(std::int64_t now) {
  if (now < next_keepalive_ns_) return;  // (never, with keepalives off)
  if (next_keepalive_ns_ != 0) keepalive();
  next_keepalive_ns_ = now + std::int64_t{shape_.options.keepalive_ms} * 1000000;
}

}  // namespace ami::protocol
