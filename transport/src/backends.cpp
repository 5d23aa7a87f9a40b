// backends.cpp — the registry: the only place that names the backends.
// Adding one is a line here (and its folder, and its tests' list).
#include "backends.hpp"

#include "fabric_backend.hpp"
#include "shm_backend.hpp"
#include "self_backend.hpp"
#include "verbs_backend.hpp"

namespace ami::detail {

std::span<const RegisteredBackend> registered_backends() {
  // Priority order: self (the own task), shm (this host), verbs (the rest),
  // ofi (what verbs does not reach, where AMI_BACKENDS names it).
  static const RegisteredBackend registry[] = {
      {0, self::backend_info(), true},
      {1, shm::backend_info()},
      {2, verbs::backend_info()},
      {3, ofi::backend_info()},
  };
  return registry;
}

}  // namespace ami::detail
