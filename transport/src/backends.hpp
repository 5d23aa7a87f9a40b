// backends.hpp — the registry of backends: every backend this build has, in
// the order a peer is tried (the first that joins it carries it), each with
// the id its entry has in address blobs. backends.cpp is the only place
// that names them. Internal.
#pragma once

#include <cstdint>
#include <span>

#include "ami/device/backend.hpp"

namespace ami::detail {

struct RegisteredBackend {
  std::uint16_t id;  // its entry's id in address blobs: never reused for another backend
  const device::BackendInfo& info;
  bool always = false;  // in use whatever AMI_BACKENDS says
};

std::span<const RegisteredBackend> registered_backends();

}  // namespace ami::detail
