// tools/harness/report.cpp — perftest's banner and result tables.
#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace ami::tools {

namespace {

const char* title(Test t) {
  switch (t) {
    case Test::send_lat: return "Send Latency Test";
    case Test::send_bw: return "Send BW Test";
    case Test::write_bw: return "RDMA_Write BW Test";
    case Test::read_bw: return "RDMA_Read BW Test";
  }
  return "";
}

constexpr const char* kRule =
    "---------------------------------------------------------------------------------------\n";

double percentile(const std::vector<double>& sorted, double p) {
  const auto i = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(i, sorted.size() - 1)];
}

}  // namespace

void print_banner(const Options& o, const std::string& backend_lines) {
  std::printf("%s", kRule);
  std::printf("                    %s\n", title(o.test));
  std::printf(" Backend         : %s\n", o.backend.c_str());
  std::size_t start = 0;
  while (start < backend_lines.size()) {
    const std::size_t end = backend_lines.find('\n', start);
    std::printf("   %s\n", backend_lines.substr(start, end - start).c_str());
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (o.test != Test::send_lat) std::printf(" TX depth        : %zu\n", o.tx_depth);
  std::printf(" Iterations      : %zu\n", o.iterations);
  std::printf("%s", kRule);
}

void print_latency_header() {
  std::printf(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
              "t_stdev[usec]   99%% percentile[usec]   99.9%% percentile[usec] \n");
}

void print_latency_row(std::size_t bytes, std::vector<double> s) {
  std::sort(s.begin(), s.end());
  const double avg = std::accumulate(s.begin(), s.end(), 0.0) / static_cast<double>(s.size());
  double var = 0;
  for (double x : s) var += (x - avg) * (x - avg);
  const double stdev = std::sqrt(var / static_cast<double>(s.size()));
  std::printf(" %-7zu %-10zu     %-7.2f        %-7.2f      %-7.2f            %-7.2f        %-7.2f"
              "         %-7.2f                %-7.2f\n",
              bytes, s.size(), s.front(), s.back(), percentile(s, 0.5), avg, stdev,
              percentile(s, 0.99), percentile(s, 0.999));
  std::fflush(stdout);
}

void print_bandwidth_header(bool gbits) {
  const char* unit = gbits ? "Gb/sec" : "MiB/sec";
  std::printf(" #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n", unit, unit);
}

void print_bandwidth_row(std::size_t bytes, std::size_t iterations, double seconds, double peak_seconds,
                         std::size_t block_ops, bool gbits) {
  auto rate = [&](std::size_t ops, double secs) {
    const double b = static_cast<double>(bytes) * static_cast<double>(ops) / secs;
    return gbits ? b * 8 / 1e9 : b / (1024.0 * 1024.0);
  };
  const double avg = rate(iterations, seconds);
  const double peak = std::max(avg, rate(block_ops, peak_seconds));
  std::printf(" %-10zu %-10zu     %-10.2f         %-10.2f            %-.6f\n", bytes, iterations, peak, avg,
              static_cast<double>(iterations) / seconds / 1e6);
  std::fflush(stdout);
}

void print_footer() { std::printf("%s", kRule); }

}  // namespace ami::tools
