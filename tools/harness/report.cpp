// tools/harness/report.cpp — perftest's banner and result tables.
#include "report.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string_view>

namespace ami::tools {

namespace {

const char* title(Test t) {
  switch (t) {
    case Test::send_lat: return "Send Latency Test";
    case Test::send_bw: return "Send BW Test";
    case Test::write_lat: return "RDMA_Write Latency Test";
    case Test::write_bw: return "RDMA_Write BW Test";
    case Test::read_lat: return "RDMA_Read Latency Test";
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
  std::printf("%s", backend_lines.c_str());
  if (!is_latency(o.test)) std::printf(" TX depth        : %zu\n", o.tx_depth);
  if (o.cq_moderation) std::printf(" CQ Moderation   : %u\n", *o.cq_moderation);
  if (o.post_list) std::printf(" Post List       : %u\n", *o.post_list);
  std::printf(" Iterations      : %zu\n", o.iterations);
  std::printf("%s", kRule);
}

void print_latency_header() {
  std::printf(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
              "t_stdev[usec]   99%% percentile[usec]   99.9%% percentile[usec] \n");
}

Row print_latency_row(std::size_t bytes, std::vector<double> s) {
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
  return {bytes,
          s.size(),
          {{"t_min", s.front()},
           {"t_max", s.back()},
           {"t_typical", percentile(s, 0.5)},
           {"t_avg", avg},
           {"t_stdev", stdev},
           {"t_99", percentile(s, 0.99)},
           {"t_99.9", percentile(s, 0.999)}}};
}

void print_bandwidth_header(bool gbits) {
  const char* unit = gbits ? "Gb/sec" : "MiB/sec";
  std::printf(" #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n", unit, unit);
}

Row print_bandwidth_row(std::size_t bytes, std::size_t iterations, double seconds, double peak_seconds,
                        std::size_t block_ops, bool gbits) {
  auto rate = [&](std::size_t ops, double secs) {
    const double b = static_cast<double>(bytes) * static_cast<double>(ops) / secs;
    return gbits ? b * 8 / 1e9 : b / (1024.0 * 1024.0);
  };
  const double avg = rate(iterations, seconds);
  const double peak = std::max(avg, rate(block_ops, peak_seconds));
  const double mpps = static_cast<double>(iterations) / seconds / 1e6;
  std::printf(" %-10zu %-10zu     %-10.2f         %-10.2f            %-.6f\n", bytes, iterations, peak, avg, mpps);
  std::fflush(stdout);
  return {bytes, iterations, {{"bw_peak", peak}, {"bw_average", avg}, {"msg_rate_mpps", mpps}}};
}

void print_footer() { std::printf("%s", kRule); }

void print_acks(const AckFigures& a) {
  char ratio[32] = "n/a";  // no message answered: no ratio
  if (a.messages_acked > 0)
    std::snprintf(ratio, sizeof ratio, "%.4f",
                  static_cast<double>(a.acks_sent) / static_cast<double>(a.messages_acked));
  std::printf("# acks: %llu messages answered by %llu acks (%s acks per message), idle threshold %llu, window %llu\n",
              static_cast<unsigned long long>(a.messages_acked), static_cast<unsigned long long>(a.acks_sent), ratio,
              static_cast<unsigned long long>(a.idle_threshold), static_cast<unsigned long long>(a.window));
  std::fflush(stdout);
}

namespace {

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(ch));
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

}  // namespace

bool write_json(const Options& o, const std::string& backend_lines, const std::vector<Row>& rows,
                const std::vector<std::pair<std::string, AckFigures>>& acks) {
  std::string out = "{\n  \"test\": " + json_string(title(o.test)) + ",\n  \"tool\": " +
                    json_string(tool_name(o.test)) + ",\n  \"backend\": " + json_string(o.backend) + ",\n";
  // The banner's "name : value" lines become an object.
  out += "  \"setup\": {";
  const char* sep = "";
  std::string_view lines = backend_lines;
  while (!lines.empty()) {
    const std::size_t end = lines.find('\n');
    const std::string_view line = lines.substr(0, end);
    lines = end == std::string_view::npos ? std::string_view{} : lines.substr(end + 1);
    const std::size_t colon = line.find(" : ");
    if (colon == std::string_view::npos) continue;
    out += sep;
    out += "\n    " + json_string(trim(line.substr(0, colon))) + ": " + json_string(trim(line.substr(colon + 3)));
    sep = ",";
  }
  out += "\n  },\n";
  if (is_latency(o.test)) out += "  \"t_unit\": \"usec\",\n";
  else out += std::string("  \"bw_unit\": ") + (o.report_gbits ? "\"Gb/sec\"" : "\"MiB/sec\"") + ",\n";
  out += "  \"results\": [";
  sep = "";
  for (const Row& r : rows) {
    char field[96];
    std::snprintf(field, sizeof field, "%s\n    {\"bytes\": %zu, \"iterations\": %zu", sep, r.bytes, r.iterations);
    out += field;
    for (const auto& [name, value] : r.values) {
      if (std::isfinite(value)) std::snprintf(field, sizeof field, ", \"%s\": %.6g", name, value);
      else std::snprintf(field, sizeof field, ", \"%s\": null", name);  // JSON has no inf or nan
      out += field;
    }
    out += "}";
    sep = ",";
  }
  out += "\n  ]";
  if (!acks.empty()) {
    out += ",\n  \"acks\": {";
    sep = "";
    for (const auto& [side, a] : acks) {
      char field[320];
      char ratio[32] = "null";  // no message answered: no ratio
      if (a.messages_acked > 0)
        std::snprintf(ratio, sizeof ratio, "%.6g",
                      static_cast<double>(a.acks_sent) / static_cast<double>(a.messages_acked));
      std::snprintf(field, sizeof field,
                    "%s\n    %s: {\"messages_acked\": %llu, \"acks_sent\": %llu, \"acks_per_message\": %s, "
                    "\"remote_done_sent\": %llu, \"idle_threshold\": %llu, \"window\": %llu}",
                    sep, json_string(side).c_str(), static_cast<unsigned long long>(a.messages_acked),
                    static_cast<unsigned long long>(a.acks_sent), ratio,
                    static_cast<unsigned long long>(a.remote_done_sent),
                    static_cast<unsigned long long>(a.idle_threshold), static_cast<unsigned long long>(a.window));
      out += field;
      sep = ",";
    }
    out += "\n  }";
  }
  out += "\n}\n";
  std::FILE* f = std::fopen(o.out_json.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok) std::fprintf(stderr, "error: cannot write the JSON report to %s: %s\n", o.out_json.c_str(),
                        std::strerror(errno));
  return ok;
}

}  // namespace ami::tools
