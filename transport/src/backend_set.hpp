// backend_set.hpp — the backends one task uses, opened from the registry
// (backends.hpp) as AMI_BACKENDS says, and what the Client does with all of
// them at once: publish their address entries, join every peer through the
// first backend that joins it, register memory with each, describe them.
// Names no backend. Internal.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "address_blob.hpp"
#include "ami/device/backend.hpp"
#include "backends.hpp"

namespace ami::detail {

class BackendSet {
 public:
  // The most contexts a task may have with the backends AMI_BACKENDS names
  // (and those always in use): the least any of them takes. Names it does
  // not know are left to the constructor to refuse.
  static std::uint16_t max_contexts(const Config& config);
  // The backends those are, in registry order.
  static std::vector<const RegisteredBackend*> asked_for(const Config& config);

  // Opens the backends in registry order: those always in use, and those
  // AMI_BACKENDS names. One named there explicitly that this host cannot
  // have, or that fails to open, is an error (ami::Error); one that is only
  // in the default list is left out, with a warning when it failed to open.
  explicit BackendSet(const device::BackendSetup& setup);

  // This task's entries, one per backend in use.
  void publish(AddressBlob& mine) const;
  // Joins every peer task of the table (indexed by task, this task's own
  // blob among them) through the first backend that joins it; returns,
  // per task, why it is not reached ("" when it is, and for this task).
  // Throws what a backend's connect() throws.
  std::vector<std::string> join(const AddressBlob& mine, const std::vector<AddressBlob>& table);

  // Joins one peer, later than the rest (addresses on demand): its
  // blob, this task's own; returns "" when it is reached, or why not (a
  // backend's connect() that throws counts as why not). Every backend in
  // use must connect_alone(); the caller serialises the calls.
  std::string join_one(const AddressBlob& mine, const AddressBlob& peer);
  // Do all backends in use allow that?
  bool connect_alone() const;

  // Registers the region with every backend in use; on failure the caller
  // deregisters it from all (deregister_region).
  Status register_region(std::uint32_t region, void* address, std::size_t length, device::RegionKeys& keys);
  void deregister_region(std::uint32_t region);
  bool pins_registrations() const;

  // The backends in use, in registry order.
  const std::vector<device::Backend*>& in_use() const { return in_use_; }
  // The one of that name in use, or nullptr.
  device::Backend* find(std::string_view name) const;
  // One line per backend in use, and per backend asked for but absent
  // ("verbs: not in use: why").
  std::string describe() const;

 private:
  struct Slot {
    const RegisteredBackend* row = nullptr;
    bool chosen = false;                       // always in use, or AMI_BACKENDS names it
    std::string absent;                        // chosen, but not in use: why
    std::unique_ptr<device::Backend> backend;  // null when not in use
  };

  std::string unreachable_reason(const device::TaskFacts& mine, const AddressBlob& peer, std::size_t& via) const;

  std::uint32_t task_;
  std::vector<Slot> slots_;  // in registry order
  std::vector<device::Backend*> in_use_;
};

}  // namespace ami::detail
