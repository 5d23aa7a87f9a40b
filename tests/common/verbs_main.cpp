// verbs_main.cpp — main of the tests that need an active RDMA port: they run
// where there is one (soft-RoCE rxe0 in the tests/rxe VM, a real NIC) and
// print SKIPPED and exit 77 (skipped, for meson) everywhere else.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "verbs_domain.hpp"

int main(int argc, char** argv) {
  const char* devices = std::getenv("AMI_NET_DEVICES");
  std::string why;
  if (!ami::verbs::VerbsDomain::available(&why, devices != nullptr ? devices : "")) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
