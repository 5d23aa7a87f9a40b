// self_backend.cpp — the self backend's setup: a SelfDomain per task, a
// SelfDevice per context. Nothing to publish, nothing to connect.
#include "self_backend.hpp"

#include "self_config.hpp"
#include "self_device.hpp"

namespace ami::self {

namespace {

class SelfBackend final : public device::Backend {
 public:
  explicit SelfBackend(const device::BackendSetup& s) : SelfBackend(s, Options::from(s.config)) {}
  SelfBackend(const device::BackendSetup& s, const Options& o)
      : task_(s.task),
        domain_(s.task, s.contexts, o.queue_depth, o.cell_bytes, s.regions, s.id),
        describe_("self: memcpy, queue " + s.config.text(Param("AMI_SELF_QUEUE_DEPTH")) + " x " +
                  s.config.text(Param("AMI_SELF_CELL_SIZE")) + " B") {}

  std::string_view name() const override { return "self"; }
  // Other tasks are never the self backend's.
  bool joins(const device::TaskFacts&, const device::TaskFacts&, const std::vector<std::byte>*,
             std::string&) const override {
    return false;
  }
  std::string connect(const device::TaskFacts&, std::span<const std::byte>) override {
    return "the self backend reaches its own task only";
  }
  bool reaches(std::uint32_t task) const override { return task == task_; }
  std::uint32_t tasks_reached() const override { return 1; }
  std::string describe() const override { return describe_; }
  std::unique_ptr<device::Device> make_device(std::uint16_t context, std::uint32_t fifo_depth) override {
    return std::make_unique<SelfDevice>(domain_, context, fifo_depth);
  }

 private:
  std::uint32_t task_;
  SelfDomain domain_;
  std::string describe_;
};

// A reception queue per context.
std::vector<device::MemoryDemand> memory(const Config& c, std::uint16_t contexts) {
  return {device::MemoryDemand::queues("self queues", c, Param("AMI_SELF_QUEUE_DEPTH"), Param("AMI_SELF_CELL_SIZE"),
                                       contexts)};
}

}  // namespace

const device::BackendInfo& backend_info() {
  static const device::BackendInfo info{
      .name = "self",
      .params = kParams,
      .open = [](const device::BackendSetup& s) -> std::unique_ptr<device::Backend> {
        return std::make_unique<SelfBackend>(s);
      },
      .memory = memory,
  };
  return info;
}

}  // namespace ami::self
