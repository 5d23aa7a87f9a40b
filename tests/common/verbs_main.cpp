// verbs_main.cpp — main of the tests that need an active RDMA port: they run
// where there is one (soft-RoCE rxe0 in the tests/rxe VM, a real NIC) and
// print SKIPPED and exit 77 (skipped, for meson) everywhere else. A program
// that runs on the backend AMI_TEST_BACKEND names (backend_under_test.hpp)
// defines needs_rdma_port(): it needs a port only when that backend does.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "verbs_domain.hpp"

[[gnu::weak]] bool needs_rdma_port() { return true; }

int main(int argc, char** argv) {
  const char* devices = std::getenv("AMI_NET_DEVICES");
  std::string why;
  if (needs_rdma_port() && !ami::verbs::VerbsDomain::available(&why, devices != nullptr ? devices : "")) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
