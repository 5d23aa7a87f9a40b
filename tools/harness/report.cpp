// tools/harness/report.cpp — perftest's banner and result tables.
#include "report.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ami::tools {

namespace {

const char* title(const Options& o) {
  switch (o.test) {
    case Test::send_lat: return "Send Latency Test";
    case Test::send_bw: return "Send BW Test";
    case Test::write_lat: return "RDMA_Write Latency Test";
    case Test::write_bw: return "RDMA_Write BW Test";
    case Test::read_lat: return "RDMA_Read Latency Test";
    case Test::read_bw: return "RDMA_Read BW Test";
    case Test::atomic_lat: return o.compare_swap ? "Atomic CMP_AND_SWAP Latency Test" : "Atomic FETCH_AND_ADD Latency Test";
    case Test::atomic_bw: return o.compare_swap ? "Atomic CMP_AND_SWAP BW Test" : "Atomic FETCH_AND_ADD BW Test";
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
  std::printf("                    %s\n", title(o));
  std::printf(" Backend         : %s\n", o.backend.c_str());
  std::printf("%s", backend_lines.c_str());
  if (!is_latency(o.test)) std::printf(" TX depth        : %zu\n", o.tx_depth);
  if (is_atomic(o.test)) std::printf(" Atomic Type     : %s\n", o.compare_swap ? "CMP_AND_SWAP" : "FETCH_AND_ADD");
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

void print_stats(const ContextStats& s) {
  auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf("# stats: messages sent %llu received %llu, packets sent %llu received %llu, puts %llu gets %llu\n",
              u(s.messages_sent), u(s.messages_received), u(s.packets_sent), u(s.packets_received), u(s.puts),
              u(s.gets));
  std::printf("# stats: rendezvous: stoppable %llu, stopped %llu, whole eagerly %llu, PUT bytes %llu, GET bytes %llu, "
              "late eager bytes %llu\n",
              u(s.rndv_sent), u(s.rndv_stopped), u(s.rndv_eager_complete), u(s.rndv_put_bytes), u(s.rndv_get_bytes),
              u(s.rndv_late_bytes));
  std::string reasons, modes;
  for (std::size_t i = 0; i < s.rndv_stops_by_reason.size(); ++i)
    reasons += " " + std::string(stop_reason_name(i)) + " " + std::to_string(s.rndv_stops_by_reason[i]);
  for (std::size_t i = 0; i < s.rndv_stops_by_mode.size(); ++i)
    modes += " " + std::string(stop_mode_name(i)) + " " + std::to_string(s.rndv_stops_by_mode[i]);
  std::printf("# stats: stops by reason:%s; by mode:%s\n", reasons.c_str(), modes.c_str());
  std::printf("# stats: acks sent %llu received %llu, fences by message %llu by flush %llu, malformed packets %llu\n",
              u(s.acks_sent), u(s.acks_received), u(s.fences_by_message), u(s.fences_by_flush),
              u(s.malformed_packets));
  std::printf("# stats: atomics posted %llu, done here for peers %llu\n", u(s.atomics), u(s.atomics_executed));
  std::fflush(stdout);
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// JSON has no inf or nan: such a figure is null.
nlohmann::ordered_json figure(double value) {
  if (!std::isfinite(value)) return nullptr;
  return value;
}

}  // namespace

bool write_json(const Options& o, const std::string& backend_lines, const std::vector<Row>& rows,
                const std::vector<std::pair<std::string, AckFigures>>& acks) {
  // ordered_json keeps the members in the order written here, which is the
  // order of perftest's banner and table.
  nlohmann::ordered_json report;
  report["test"] = title(o);
  report["tool"] = tool_name(o.test);
  report["backend"] = o.backend;
  // The banner's "name : value" lines become an object.
  nlohmann::ordered_json setup = nlohmann::ordered_json::object();
  std::string_view lines = backend_lines;
  while (!lines.empty()) {
    const std::size_t end = lines.find('\n');
    const std::string_view line = lines.substr(0, end);
    lines = end == std::string_view::npos ? std::string_view{} : lines.substr(end + 1);
    const std::size_t colon = line.find(" : ");
    if (colon == std::string_view::npos) continue;
    setup[std::string(trim(line.substr(0, colon)))] = std::string(trim(line.substr(colon + 3)));
  }
  report["setup"] = std::move(setup);
  if (is_latency(o.test)) report["t_unit"] = "usec";
  else report["bw_unit"] = o.report_gbits ? "Gb/sec" : "MiB/sec";
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const Row& r : rows) {
    nlohmann::ordered_json row;
    row["bytes"] = r.bytes;
    row["iterations"] = r.iterations;
    for (const auto& [name, value] : r.values) row[name] = figure(value);
    results.push_back(std::move(row));
  }
  report["results"] = std::move(results);
  if (!acks.empty()) {
    nlohmann::ordered_json sides = nlohmann::ordered_json::object();
    for (const auto& [side, a] : acks) {
      nlohmann::ordered_json figures;
      figures["messages_acked"] = a.messages_acked;
      figures["acks_sent"] = a.acks_sent;
      // no message answered: no ratio
      figures["acks_per_message"] =
          a.messages_acked > 0
              ? figure(static_cast<double>(a.acks_sent) / static_cast<double>(a.messages_acked))
              : nlohmann::ordered_json(nullptr);
      figures["remote_done_sent"] = a.remote_done_sent;
      figures["idle_threshold"] = a.idle_threshold;
      figures["window"] = a.window;
      sides[side] = std::move(figures);
    }
    report["acks"] = std::move(sides);
  }
  // Strings from the banner are the library's own text; should one hold
  // bytes that are not UTF-8, they are replaced rather than failing the run.
  const std::string out = report.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::FILE* f = std::fopen(o.out_json.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok) std::fprintf(stderr, "error: cannot write the JSON report to %s: %s\n", o.out_json.c_str(),
                        std::strerror(errno));
  return ok;
}

}  // namespace ami::tools
