// shm_backend/include/shm_backend.hpp — the shm backend's setup: the registry's
// entry for it (transport/src/backends.cpp). It joins the tasks of one
// host (same boot id) that both use it, through each other's segment; its
// entry in the address blob is the segment's descriptor in the owner's
// process, which a peer opens through /proc/<pid>/fd/<n> and maps the
// first time one of its contexts needs it.
#pragma once

#include "ami/device/backend.hpp"

namespace ami::shm {

const device::BackendInfo& backend_info();

}  // namespace ami::shm
