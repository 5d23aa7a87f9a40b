// self_backend.hpp — the self backend's setup: the registry's entry for it
// (transport/src/backends.cpp). It reaches the contexts of the own task and
// no other task; its domain and device are self_device.hpp.
#pragma once

#include "ami/device/backend.hpp"

namespace ami::self {

const device::BackendInfo& backend_info();

}  // namespace ami::self
