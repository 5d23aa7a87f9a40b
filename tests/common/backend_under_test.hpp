// backend_under_test.hpp — the backend on which a test program built once
// runs its job cases, named by AMI_TEST_BACKEND:
//   shm (the default), verbs, or ofi:PROVIDER (PROVIDER as AMI_OFI_PROVIDER
//   names it: tcp;ofi_rxm, shm, verbs;ofi_rxm).
// The program's cases that do not depend on the backend run once, in the
// default run, and are skipped (as doctest skips, and counts) in the others:
// TEST_CASE("..." * test::any_backend()). Such a program's main is
// verbs_main.cpp, which asks needs_rdma_port() (defined by
// AMI_TEST_NEEDS_RDMA_PORT_FROM_BACKEND) whether it must find an RDMA port.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ami/ami.hpp"

namespace test {

struct BackendUnderTest {
  std::string name = "shm";
  std::string backends = "self,shm";  // AMI_BACKENDS
  std::string provider;               // AMI_OFI_PROVIDER, for ofi

  bool is_default() const { return name == "shm"; }
  bool needs_rdma() const { return backends == "self,verbs" || provider.rfind("verbs", 0) == 0; }
  void configure(ami::Config& c) const {
    REQUIRE(c.set("AMI_BACKENDS", backends).ok());
    if (!provider.empty()) REQUIRE(c.set("AMI_OFI_PROVIDER", provider).ok());
  }
};

inline const BackendUnderTest& backend_under_test() {
  static const BackendUnderTest b = [] {
    BackendUnderTest out;
    const char* v = std::getenv("AMI_TEST_BACKEND");
    const std::string name = v != nullptr && *v != '\0' ? v : "shm";
    out.name = name;
    if (name == "verbs") {
      out.backends = "self,verbs";
    } else if (name.rfind("ofi:", 0) == 0 && name.size() > 4) {
      out.backends = "self,ofi";
      out.provider = name.substr(4);
    } else if (name != "shm") {
      std::fprintf(stderr, "AMI_TEST_BACKEND=%s: expected shm, verbs or ofi:PROVIDER\n", name.c_str());
      std::exit(2);
    }
    return out;
  }();
  return b;
}

// The decorator of the cases that run once, in the default (shm) run.
inline doctest::skip any_backend() { return doctest::skip(!backend_under_test().is_default()); }

}  // namespace test

// verbs_main.cpp's question, answered by the backend under test.
#define AMI_TEST_NEEDS_RDMA_PORT_FROM_BACKEND \
  bool needs_rdma_port() { return test::backend_under_test().needs_rdma(); }
