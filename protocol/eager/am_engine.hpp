// protocol/eager/am_engine.hpp — active messages, PUT and GET over the device
// contract, for one context.
//
// The engine owns the per-peer state (lane, work queue of requests, pending
// remote-done answers, the message being reassembled from that peer), the
// dispatch table and the request pool. Messages larger than one packet are
// cut into packets that go out back to back on the peer's lane, so the
// receiver reassembles at most one message per origin at a time. Nothing
// here knows what device is underneath. Not thread-safe (see context.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "ami/device/device.hpp"
#include "ami/dispatch.hpp"
#include "ami/params.hpp"
#include "ami/stats.hpp"
#include "protocol/eager/request_pool.hpp"
#include "protocol/wire/packet.hpp"

namespace ami::protocol {

class AmEngine final : public device::PacketSink {
 public:
  struct Shape {
    std::uint32_t tasks = 1;
    std::uint16_t contexts = 1;      // per task
    std::uint32_t max_requests = 1024;
  };

  AmEngine(Shape shape, ContextStats& stats);

  // Devices in priority order; the first that can reach a peer carries it.
  void add_device(device::Device& device) { devices_.push_back(&device); }

  Status set_dispatch(std::uint16_t id, Dispatch dispatch);
  Status send(const SendParams& p);
  Status send_immediate(const SendImmediateParams& p);
  // local/local_key: the checked local range of p.local.
  Status rdma(device::DescriptorKind kind, const RdmaParams& p, std::byte* local,
              std::uint32_t local_key);

  std::size_t immediate_limit(Endpoint dest);
  std::string_view backend_for(Endpoint dest);
  std::size_t advance();

  void on_packet(Endpoint origin, std::span<const std::byte> bytes) override;

 private:
  struct Reassembly {
    bool active = false;
    std::uint64_t message_id = 0;
    std::uint64_t total = 0;
    std::uint64_t received = 0;
    std::byte* buffer = nullptr;
    Callback done;
    bool wants_remote_done = false;
    std::uint16_t answer_flags = 0;  // remote_done flags owed when it completes
  };
  struct Answer {
    std::uint64_t message_id;
    std::uint16_t flags;
  };
  struct Peer {
    Endpoint endpoint;
    device::Device* device = nullptr;
    device::Lane* lane = nullptr;
    Request* head = nullptr;  // work queue: instructions waiting for FIFO slots
    Request* tail = nullptr;
    std::vector<Answer> answers;  // remote_done answers waiting for a FIFO slot
    Reassembly rx;
    bool busy = false;
  };

  // setup and lookup
  Peer* peer_for(Endpoint e);
  device::Lane* lane_for(Peer& peer);
  Status check_send(const SendParams& p) const;
  Request* acquire();
  void mark_busy(Peer& peer);
  void enqueue(Peer& peer, Request& r);

  // sending
  bool inject_send(Peer& peer, Request& r);
  bool inject_rdma(Peer& peer, Request& r);
  bool inject_answer(Peer& peer, const Answer& a);
  std::size_t service(Peer& peer);
  static void on_send_local(void* cookie, Status s);
  void finish(Request& r);

  // receiving
  void on_first(Peer& peer, const wire::PacketView& v);
  void on_more(Peer& peer, const wire::PacketView& v);
  void on_remote_done(const wire::PacketView& v);
  void complete_rx(Peer& peer, Status s);
  void answer(Peer& peer, std::uint64_t message_id, std::uint16_t flags);
  void count_malformed(std::size_t reason);

  Shape shape_;
  ContextStats& stats_;
  std::vector<device::Device*> devices_;
  std::vector<Peer> peers_;           // by task * contexts + context
  std::vector<device::Lane*> lanes_;  // every lane made so far
  std::vector<Peer*> busy_;
  std::array<Dispatch, kMaxDispatch> dispatch_{};
  RequestPool pool_;
};

}  // namespace ami::protocol
