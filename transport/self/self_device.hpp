// self_device.hpp — the self backend: peers that are contexts of this very
// process, reached by memcpy through the same device contract as every other
// backend (injection FIFO, transfer counter, reception queue, remote keys).
//
// SelfDomain is owned by the task's self backend (self_backend.cpp) and
// holds one reception queue per context; each context owns a SelfDevice
// with one SelfLane per target context. The device does its work in progress(), not when a descriptor is
// posted, so completion goes through the transfer counter exactly as on a NIC.
// A full target queue stalls that lane until the target drains it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ami/device/device.hpp"
#include "ami/device/reception_queue.hpp"
#include "ami/device/region_table.hpp"
#include "ami/device/wake.hpp"

namespace ami::self {

class SelfDomain {
 public:
  // key_id: the registry's id of self (BackendSetup::id).
  SelfDomain(std::uint32_t task, std::uint16_t contexts, std::uint32_t queue_depth,
             std::uint32_t cell_bytes, const device::RegionTable& regions, std::uint8_t key_id = 0);

  std::uint32_t task() const { return task_; }
  std::uint8_t key_id() const { return key_id_; }
  std::uint16_t contexts() const { return static_cast<std::uint16_t>(queues_.size()); }
  device::ReceptionQueue& queue(std::uint16_t context) { return queues_[context]; }
  const device::ReceptionQueue& queue(std::uint16_t context) const { return queues_[context]; }
  const device::RegionTable& regions() const { return regions_; }
  // The context's wake-up: written by a producer whose reservation found
  // its queue armed (docs/DESIGN.md, "Event-driven progress").
  const int& wake_fd(std::uint16_t context) const { return wake_fds_[context]; }

 private:
  struct FreeAligned {
    void operator()(void* p) const;
  };

  std::uint32_t task_;
  std::uint8_t key_id_;
  const device::RegionTable& regions_;
  std::unique_ptr<void, FreeAligned> memory_;
  std::vector<device::ReceptionQueue> queues_;
  std::vector<device::EventFd> wakes_;  // by context
  std::vector<int> wake_fds_;           // their descriptors
};

class SelfDevice;

class SelfLane final : public device::Lane {
 public:
  SelfLane(SelfDevice& device, Endpoint peer, std::uint32_t fifo_depth, std::size_t max_packet)
      : Lane(peer, fifo_depth), device_(device), max_packet_(max_packet) {}
  std::size_t max_packet() const override { return max_packet_; }
  // A GET is one memcpy against an eager packet's two (into the queue, out
  // of it) and a dispatch per packet.
  std::uint64_t rdma_crossover() const override { return std::uint64_t{16} << 10; }
  void ring() override {}
  // The region is this process's own memory: the device does the atomic
  // with the CPU, as the owner's engine would, where the region's atomics
  // are the CPU's (docs/DESIGN.md, "Remote atomics"); a NIC-domain one's
  // go to the engine, which does them through the NIC.
  bool offloads_atomic(const RemoteKey& key, AtomicOp, AtomicType) override {
    return key.atomics == AtomicDomain::cpu;
  }
  Status atomic_in_place(const device::AtomicRef& a) override;

 private:
  friend class SelfDevice;
  SelfDevice& device_;
  std::size_t max_packet_;
  Status failure_;         // set by SelfDevice::fail_lane
  bool reported_ = false;  // the sink has been told
};

class SelfDevice final : public device::Device {
 public:
  SelfDevice(SelfDomain& domain, std::uint16_t context, std::uint32_t fifo_depth);

  std::string_view name() const override { return "self"; }
  std::uint8_t key_id() const override { return domain_.key_id(); }
  bool can_reach(Endpoint peer) const override;
  device::Lane* lane(Endpoint peer) override;
  std::size_t progress(device::PacketSink& sink, std::size_t budget) override;
  bool wants_progress() const override;
  unsigned reception_load() const override;
  std::span<const int> wake_fds() const override { return {&domain_.wake_fd(context_), 1}; }
  // Busy while a lane holds descriptors to carry out: their copies are this
  // device's own work (a full target queue is drained by an awake target).
  Status arm() override;
  Status arm_quiet() override;  // (its eventfd was just seen quiet)

  // For deterministic tests: while held, the lane to target context keeps
  // its descriptors in its FIFO (nothing is delivered or copied);
  // release(n) then carries out the next n of them.
  void hold(std::uint16_t target, bool held);
  void release(std::uint16_t target, std::uint64_t n);
  // For tests of peer failure: the lane to target context breaks as if its
  // peer had died; the next progress() fails what is in its FIFO and
  // reports it (PacketSink::on_lane_failed). Later descriptors fail too.
  void fail_lane(std::uint16_t target, Status why);

 private:
  friend class SelfLane;
  std::size_t drain_lane(SelfLane& lane);
  bool execute(SelfLane& lane, std::uint64_t n);
  bool deliver(SelfLane& lane, const device::PacketDescriptor& p);
  bool rdma(SelfLane& lane, std::uint64_t n, const device::RdmaDescriptor& x, bool put);
  void atomic(SelfLane& lane, std::uint64_t n, const device::AtomicDescriptor& a);
  Status atomic_on(const device::AtomicRef& a);

  SelfDomain& domain_;
  std::uint16_t context_;
  std::uint32_t fifo_depth_;
  std::vector<std::unique_ptr<SelfLane>> lanes_;  // by target context
  std::vector<std::uint64_t> allowance_;          // per held lane: descriptors it may still carry out
  static constexpr std::uint64_t kUnheld = ~std::uint64_t{0};
};

}  // namespace ami::self
