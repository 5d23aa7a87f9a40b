// backend_set.cpp — choosing, opening and joining through the backends of
// the registry, none of them by name.
#include "backend_set.hpp"

#include <algorithm>
#include <cstdio>

#include "ami/error.hpp"
#include "core_config.hpp"

namespace ami::detail {

namespace {

// What AMI_BACKENDS names, by registry index.
struct Choice {
  std::vector<bool> named;
  bool explicit_list = false;  // set by the user, not the table's default
  std::string unknown;         // the first name the registry does not have
};

Choice choose(const Config& c) {
  const auto rows = registered_backends();
  Choice choice;
  choice.named.resize(rows.size());
  const std::string& list = c.text(core::Param("AMI_BACKENDS"));
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string name = list.substr(start, end - start);
    const auto it = std::find_if(rows.begin(), rows.end(), [&](const RegisteredBackend& r) { return r.info.name == name; });
    if (it != rows.end()) choice.named[static_cast<std::size_t>(it - rows.begin())] = true;
    else if (!name.empty() && choice.unknown.empty()) choice.unknown = name;
    start = end + 1;
  }
  choice.explicit_list = c.origin(core::Param("AMI_BACKENDS")) != "default";
  return choice;
}

// "self, shm and verbs"
std::string registry_names() {
  const auto rows = registered_backends();
  std::string out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i > 0) out += i + 1 == rows.size() ? " and " : ", ";
    out += rows[i].info.name;
  }
  return out;
}

device::TaskFacts facts_of(const AddressBlob& b) {
  return {b.task, b.pid, b.contexts, b.boot_id, b.hostname};
}

}  // namespace

std::vector<const RegisteredBackend*> BackendSet::asked_for(const Config& config) {
  const Choice choice = choose(config);
  const auto rows = registered_backends();
  std::vector<const RegisteredBackend*> out;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].always || choice.named[i]) out.push_back(&rows[i]);
  return out;
}

std::uint16_t BackendSet::max_contexts(const Config& config) {
  std::uint16_t most = 0xFFFF;
  for (const RegisteredBackend* b : asked_for(config)) most = std::min(most, b->info.max_contexts);
  return most;
}

BackendSet::BackendSet(const device::BackendSetup& setup) : task_(setup.task) {
  const Choice choice = choose(setup.config);
  if (!choice.unknown.empty())
    throw Error("Client: AMI_BACKENDS names '" + choice.unknown + "'; the backends are " + registry_names());
  const auto rows = registered_backends();
  slots_.resize(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    Slot& slot = slots_[i];
    slot.row = &rows[i];
    slot.chosen = rows[i].always || choice.named[i];
    if (!slot.chosen) continue;
    const std::string name(rows[i].info.name);
    const bool required = rows[i].always || choice.explicit_list;
    if (rows[i].info.available != nullptr && !rows[i].info.available(setup, &slot.absent)) {
      if (required) throw Error("Client: AMI_BACKENDS asks for " + name + ", but " + slot.absent);
      continue;
    }
    if (rows[i].id >= kMaxKeyBackends)
      throw Error("Client: backend " + name + " has an id past the keys' room (kMaxKeyBackends)");
    device::BackendSetup own = setup;
    own.id = static_cast<std::uint8_t>(rows[i].id);
    try {
      slot.backend = rows[i].info.open(own);
    } catch (const Error& e) {
      if (required) throw;
      slot.absent = e.what();
      std::fprintf(stderr, "ami: warning: going on without %s: %s\n", name.c_str(), e.what());
      continue;
    }
    in_use_.push_back(slot.backend.get());
  }
}

void BackendSet::publish(AddressBlob& mine) const {
  for (const Slot& slot : slots_)
    if (slot.backend) mine.entries.push_back({slot.row->id, slot.backend->local_address()});
}

// Why no backend joins this task and the peer, in the words of each that
// does not; via is the index of the first that does (then "").
std::string BackendSet::unreachable_reason(const device::TaskFacts& mine, const AddressBlob& peer,
                                           std::size_t& via) const {
  const device::TaskFacts them = facts_of(peer);
  std::vector<std::string> clauses;
  std::string left_out;  // backends AMI_BACKENDS leaves out here, said once
  std::size_t left_out_at = 0;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    const std::string name(slot.row->info.name);
    if (slot.backend) {
      std::string why;
      if (slot.backend->joins(mine, them, peer.entry(slot.row->id), why)) {
        via = i;
        return {};
      }
      if (!why.empty()) clauses.push_back(why);
    } else if (slot.chosen) {
      clauses.push_back(name + " is not in use at task " + std::to_string(task_) +
                        (slot.absent.empty() ? std::string() : " (" + slot.absent + ")"));
    } else {
      if (left_out.empty()) left_out_at = clauses.size();
      left_out += (left_out.empty() ? "" : " and ") + name;
    }
  }
  if (!left_out.empty())
    clauses.insert(clauses.begin() + static_cast<std::ptrdiff_t>(left_out_at),
                   "AMI_BACKENDS at task " + std::to_string(task_) + " leaves out " + left_out);
  via = slots_.size();
  std::string out;
  for (const std::string& c : clauses) out += (out.empty() ? "" : ", and ") + c;
  return out.empty() ? "no backend joins the two" : out;
}

std::vector<std::string> BackendSet::join(const AddressBlob& mine, const std::vector<AddressBlob>& table) {
  const device::TaskFacts me = facts_of(mine);
  std::vector<std::string> why(table.size());
  std::vector<std::size_t> via(table.size(), slots_.size());
  for (std::uint32_t t = 0; t < table.size(); ++t)
    if (t != task_) why[t] = unreachable_reason(me, table[t], via[t]);
  // Backend by backend, each peer in increasing task order on every task
  // (rdma_cm wants that order).
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    for (std::uint32_t t = 0; t < table.size(); ++t) {
      if (via[t] != i) continue;
      const std::vector<std::byte>* entry = table[t].entry(slots_[i].row->id);
      why[t] = slots_[i].backend->connect(facts_of(table[t]), entry ? std::span<const std::byte>(*entry)
                                                                    : std::span<const std::byte>());
    }
  }
  return why;
}

std::string BackendSet::join_one(const AddressBlob& mine, const AddressBlob& peer) {
  if (peer.task == task_) return {};
  std::size_t via = slots_.size();
  std::string why = unreachable_reason(facts_of(mine), peer, via);
  if (via == slots_.size()) return why;
  const std::vector<std::byte>* entry = peer.entry(slots_[via].row->id);
  try {
    return slots_[via].backend->connect(facts_of(peer), entry ? std::span<const std::byte>(*entry)
                                                              : std::span<const std::byte>());
  } catch (const Error& e) {
    return e.what();
  }
}

bool BackendSet::connect_alone() const {
  return std::all_of(in_use_.begin(), in_use_.end(), [](const device::Backend* b) { return b->connects_alone(); });
}

Status BackendSet::register_region(std::uint32_t region, void* address, std::size_t length,
                                   device::RegionKeys& keys) {
  for (const Slot& slot : slots_) {
    if (!slot.backend) continue;
    keys.set_backend(static_cast<std::uint8_t>(slot.row->id));
    Status s = slot.backend->register_region(region, address, length, keys);
    if (!s.ok()) return s;
  }
  return Status::success();
}

void BackendSet::deregister_region(std::uint32_t region) {
  for (device::Backend* b : in_use_) b->deregister_region(region);
}

bool BackendSet::pins_registrations() const {
  return std::any_of(in_use_.begin(), in_use_.end(), [](const device::Backend* b) { return b->pins_registrations(); });
}

device::Backend* BackendSet::find(std::string_view name) const {
  for (device::Backend* b : in_use_)
    if (b->name() == name) return b;
  return nullptr;
}

std::string BackendSet::describe() const {
  std::string out;
  for (const Slot& slot : slots_) {
    if (slot.backend) out += slot.backend->describe() + "\n";
    else if (slot.chosen) out += std::string(slot.row->info.name) + ": not in use: " + slot.absent + "\n";
  }
  return out;
}

}  // namespace ami::detail
