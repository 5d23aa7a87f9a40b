// verbs_backend/include/verbs_backend.hpp — the verbs backend's setup: the
// registry's entry for it (transport/src/backends.cpp). Where an RDMA port
// is active it joins every peer task that uses verbs too and that no
// earlier backend joins; its entry in the address blob is the domain's
// address (verbs_address.hpp).
#pragma once

#include "ami/device/backend.hpp"

namespace ami::verbs {

const device::BackendInfo& backend_info();

}  // namespace ami::verbs
