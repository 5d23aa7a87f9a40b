// Never linked: the config_name_checked test compiles this file twice. A
// lookup by a name its component's table lacks must not compile: a typo,
// or a name another component declares (the shm backend reading the core's
// AMI_FIFO_DEPTH is given the typed value instead). With -DAMI_KNOWN_NAME
// the same lookups name the component's own parameters and must compile,
// so the failure is the names' and nothing else's. (A requires-expression
// cannot show it: a consteval call that fails is an error, not a
// substitution failure.)
#include "core_config.hpp"
#include "shm_config.hpp"

std::uint64_t fifo_depth(const ami::Config& c);
std::uint64_t ring_depth(const ami::Config& c);

std::uint64_t fifo_depth(const ami::Config& c) {
#ifdef AMI_KNOWN_NAME
  return c.number(ami::core::Param("AMI_FIFO_DEPTH"));
#else
  return c.number(ami::core::Param("AMI_FIFO_DEPHT"));
#endif
}

std::uint64_t ring_depth(const ami::Config& c) {
#ifdef AMI_KNOWN_NAME
  return c.number(ami::shm::Param("AMI_SHM_RING_DEPTH"));
#else
  return c.number(ami::shm::Param("AMI_FIFO_DEPTH"));
#endif
}
