// Never linked: the config_name_checked test compiles this file twice. A
// lookup by a name the configuration table lacks must not compile; with
// -DAMI_KNOWN_NAME the same lookup names a real parameter and must, so the
// failure is the name's and nothing else's. (A requires-expression cannot
// show it: a consteval call that fails is an error, not a substitution
// failure.)
#include "ami/config.hpp"

std::uint64_t fifo_depth(const ami::Config& c);

std::uint64_t fifo_depth(const ami::Config& c) {
#ifdef AMI_KNOWN_NAME
  return c.number("AMI_FIFO_DEPTH");
#else
  return c.number("AMI_FIFO_DEPHT");
#endif
}
