// tests/core/test_modules.cpp — backends built as modules of their own
// (fabric_backend/ofi_module.cpp): a task that never asks for ofi never
// loads libfabric, whose providers' constructors cost Debian's tasks about
// 0.2 s each at start; one that asks loads the module, and libfabric with
// it, once. A process of its own, so that nothing else loaded it first.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "ami/ami.hpp"

namespace {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(library) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("libfabric is loaded only once a task asks for the ofi backend") {
  CHECK_FALSE(mapped("libfabric.so"));
  CHECK_FALSE(mapped("libami-ofi.so"));
  {
    ami::ClientOptions o;
    o.contexts = 2;
    ami::Client client(o);
    CHECK(client.context(0).advance() == 0);
  }
  CHECK_FALSE(mapped("libfabric.so"));

  // The hardware survey asks every backend, ofi too: the module is loaded
  // and says what libfabric offers here.
  const std::string survey = ami::describe_hardware();
  CAPTURE(survey);
  CHECK(survey.find("ofi") != std::string::npos);
  CHECK(survey.find("cannot load") == std::string::npos);
  CHECK(mapped("libami-ofi.so"));
  CHECK(mapped("libfabric.so"));
}
