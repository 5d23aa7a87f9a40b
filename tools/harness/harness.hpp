// tools/harness/harness.hpp — the one harness every perftest-like tool runs
// on: options, starting the two sides (server, client, or both with
// --local), the measurement loops and perftest's output tables. A tool's
// main is one call to run().
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ami::tools {

enum class Test { send_lat, send_bw, write_lat, write_bw, read_lat, read_bw, atomic_lat, atomic_bw };

inline bool is_latency(Test t) {
  return t == Test::send_lat || t == Test::write_lat || t == Test::read_lat || t == Test::atomic_lat;
}
inline bool is_atomic(Test t) { return t == Test::atomic_lat || t == Test::atomic_bw; }

struct Options {
  Test test = Test::send_lat;
  std::vector<std::size_t> sizes{2};
  std::size_t iterations = 0;  // 0: the test's default
  std::size_t tx_depth = 128;  // operations in flight for bandwidth tests
  std::string backend = "shm";
  std::string server;          // client mode: the server's host name
  std::uint16_t port = 18515;
  bool port_given = false;     // -p: --local otherwise takes a free loopback port
  bool local = false;          // both sides on this host, from one command
  bool report_gbits = false;
  // Send tests: every measured send asks for remote_done. In the bandwidth
  // test a send leaves the window (-t) when its remote_done runs.
  bool remote_done = false;
  bool stats = false;          // print the context's counters at the end
  // -e: each side sleeps on its context's event_fd() whenever an advance()
  // finds nothing (ami/wait.hpp), as perftest's -e sleeps on a completion
  // channel; otherwise it busy-polls.
  bool events = false;
  unsigned spin_us = 0;        // --spin: with -e, busy-poll this long after the last event first
  std::string out_json;        // "": no JSON report
  // Atomic tests: -A FETCH_AND_ADD (default) or CMP_AND_SWAP, as
  // perftest's ib_atomic_*; each moves one 8-byte word.
  bool compare_swap = false;

  // perftest's device options; each maps to an AMI_* configuration entry
  // (verbs backend only). Unset: the configuration (environment) decides.
  std::string device;                        // -d      AMI_NET_DEVICES
  std::optional<unsigned> ib_port;           // -i      AMI_NET_DEVICES (device:port)
  std::optional<unsigned> gid_index;         // -x      AMI_VERBS_GID_INDEX
  bool rdma_cm = false;                      // -R      AMI_VERBS_CM=on
  std::optional<unsigned> mtu;               // -m      AMI_VERBS_MTU
  bool tx_depth_given = false;               // -t      AMI_VERBS_SQ_DEPTH too
  std::optional<unsigned> cq_moderation;     // -Q      AMI_VERBS_SIGNAL_INTERVAL
  std::optional<unsigned> inline_size;       // -I      AMI_VERBS_MAX_INLINE
  std::optional<unsigned> post_list;         // -l      AMI_VERBS_DOORBELL_BATCH
};

// Parses perftest-style arguments; returns false (after printing why) on a
// bad command line. help is set for -h.
bool parse_options(int argc, char** argv, Test test, Options& out, bool& help);

const char* tool_name(Test t);

// Reads text as a whole number in [min, max] into out; false, after saying
// on stderr that what must be one, when it is not.
bool number(const char* text, std::size_t& out, std::size_t min, std::size_t max, const char* what);

int run(int argc, char** argv, Test test);

}  // namespace ami::tools
