// tools/harness/report.hpp — perftest's banner and result tables.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "harness.hpp"

namespace ami::tools {

void print_banner(const Options& o, const std::string& backend_lines);
void print_latency_header();
// samples: one-way latencies in microseconds (half round trips).
void print_latency_row(std::size_t bytes, std::vector<double> samples);
void print_bandwidth_header(bool gbits);
// seconds: the whole run; peak_seconds: the fastest block of block_ops operations.
void print_bandwidth_row(std::size_t bytes, std::size_t iterations, double seconds,
                         double peak_seconds, std::size_t block_ops, bool gbits);
void print_footer();

}  // namespace ami::tools
