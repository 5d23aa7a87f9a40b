// fabric_backend/include/fabric_backend.hpp — the libfabric backend's setup:
// the registry's entry for it (transport/src/backends.cpp). It joins every
// peer task that publishes an entry of the same provider (on one host only,
// for the shm provider) and that no earlier backend joins; its entry in the
// address blob is the provider's name and one endpoint name per context
// (ofi_wire.hpp).
#pragma once

#include "ami/device/backend.hpp"

namespace ami::ofi {

const device::BackendInfo& backend_info();

}  // namespace ami::ofi
