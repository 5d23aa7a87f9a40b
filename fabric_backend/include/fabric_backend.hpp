// fabric_backend/include/fabric_backend.hpp — the libfabric backend's setup:
// the registry's entry for it (transport/src/backends.cpp). It joins every
// peer task that publishes an entry of the same provider (on one host only,
// for the shm provider) and that no earlier backend joins; its entry in the
// address blob is the provider's name and one endpoint name per context
// (ofi_wire.hpp).
//
// The backend is a module of its own, libami-ofi.so, which libami loads the
// first time the entry is asked anything a name and a table cannot answer:
// only a task that AMI_BACKENDS sends to ofi loads libfabric (ofi_module.cpp).
#pragma once

#include "ami/device/backend.hpp"

namespace ami::ofi {

// In libami: the name, the tunables and the most contexts, and functions
// that load the module and ask its own entry.
const device::BackendInfo& backend_info();

}  // namespace ami::ofi

// In the module: its entry, with the functions that do the work.
extern "C" const ami::device::BackendInfo* ami_ofi_backend_info();
