// Never linked: the descriptor_kinds_checked test compiles this file twice.
// A device's visitor that lacks a member for one descriptor kind must not
// compile; with -DAMI_KNOWN_NAME the visitor names every kind and must, so
// the failure is the missing kind's and nothing else's. (A new kind in
// DescriptorKind fails the same way in every device that does not name it:
// visit() calls a member for it.)
#include "ami/device/descriptor.hpp"

namespace {

struct Device {
  int packet(const ami::device::PacketDescriptor&) { return 1; }
  int put(const ami::device::RdmaDescriptor&) { return 2; }
  int get(const ami::device::RdmaDescriptor&) { return 3; }
#ifdef AMI_KNOWN_NAME
  int atomic(const ami::device::AtomicDescriptor&) { return 4; }
#endif
};

}  // namespace

int execute(const ami::device::Descriptor& d);

int execute(const ami::device::Descriptor& d) { return ami::device::visit(d, Device{}); }
