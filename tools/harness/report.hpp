// tools/harness/report.hpp — perftest's banner and result tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ami/stats.hpp"
#include "harness.hpp"

namespace ami::tools {

// One row of a result table, kept for the JSON report.
struct Row {
  std::size_t bytes = 0;
  std::size_t iterations = 0;
  std::vector<std::pair<const char*, double>> values;  // column name, value
};

// backend_lines: "name : value" lines describing the backend and the lane.
void print_banner(const Options& o, const std::string& backend_lines);
void print_latency_header();
// samples in microseconds: half round trips (send, write) or whole
// operations (read), as perftest reports them.
Row print_latency_row(std::size_t bytes, std::vector<double> samples);
void print_bandwidth_header(bool gbits);
// seconds: the whole run; peak_seconds: the fastest block of block_ops operations.
Row print_bandwidth_row(std::size_t bytes, std::size_t iterations, double seconds,
                        double peak_seconds, std::size_t block_ops, bool gbits);
void print_footer();

// The acks one side sent (--remote_done): its own counters toward its peer,
// and its ack dispatcher's configuration.
struct AckFigures {
  std::uint64_t messages_acked = 0;
  std::uint64_t acks_sent = 0;
  std::uint64_t remote_done_sent = 0;  // the context's remote-done answers
  std::uint64_t idle_threshold = 0;    // AMI_ACK_IDLE_THRESHOLD
  std::uint64_t window = 0;            // AMI_ACK_MAX_UNACKED
};
// "# acks: M messages answered by A acks (R acks per message), idle threshold T, window W"
void print_acks(const AckFigures& a);

// "# stats: ..." lines: the context's counters a reader of a benchmark
// asks about (messages, packets, the rendezvous's stops by reason and
// mode, acks, fences, malformed packets).
void print_stats(const ContextStats& s);

// Writes the banner facts and the rows as JSON (with nlohmann/json) to o.out_json, with the acks
// each named side sent ("server", "client") when there are any; false
// (after printing why) when the file cannot be written.
bool write_json(const Options& o, const std::string& backend_lines, const std::vector<Row>& rows,
                const std::vector<std::pair<std::string, AckFigures>>& acks = {});

}  // namespace ami::tools
