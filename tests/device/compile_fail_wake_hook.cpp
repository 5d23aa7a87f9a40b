// Never linked: the wake_hook_required test compiles this file twice. A
// device that does not say how it wakes a sleeping context (wake_fds() and
// arm(), docs/DESIGN.md, "Event-driven progress") must not compile; with
// -DAMI_KNOWN_NAME it says so and must, so the failure is the missing
// hook's and nothing else's.
#include <memory>

#include "ami/device/device.hpp"

namespace {

class Quiet final : public ami::device::Device {
 public:
  std::string_view name() const override { return "quiet"; }
  std::uint8_t key_id() const override { return 0; }
  bool can_reach(ami::Endpoint) const override { return false; }
  ami::device::Lane* lane(ami::Endpoint) override { return nullptr; }
  std::size_t progress(ami::device::PacketSink&, std::size_t) override { return 0; }
  std::span<const int> wake_fds() const override { return {}; }
#ifdef AMI_KNOWN_NAME
  ami::Status arm() override { return {ami::StatusCode::not_supported, "quiet: cannot sleep"}; }
#endif
};

}  // namespace

std::unique_ptr<ami::device::Device> make_quiet();

std::unique_ptr<ami::device::Device> make_quiet() { return std::make_unique<Quiet>(); }
