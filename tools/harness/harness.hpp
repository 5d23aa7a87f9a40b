// tools/harness/harness.hpp — the one harness every perftest-like tool runs
// on: options, starting the two sides (server, client, or both with
// --local), the measurement loops and perftest's output tables. A tool's
// main is one call to run().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ami::tools {

enum class Test { send_lat, send_bw, write_bw, read_bw };

struct Options {
  Test test = Test::send_lat;
  std::vector<std::size_t> sizes{2};
  std::size_t iterations = 0;  // 0: the test's default
  std::size_t tx_depth = 128;  // operations in flight for bandwidth tests
  std::string backend = "shm";
  std::string server;          // client mode: the server's host name
  std::uint16_t port = 18515;
  bool local = false;          // both sides on this host, from one command
  bool report_gbits = false;
};

// Parses perftest-style arguments; returns false (after printing why) on a
// bad command line. help is set for -h.
bool parse_options(int argc, char** argv, Test test, Options& out, bool& help);

int run(int argc, char** argv, Test test);

}  // namespace ami::tools
