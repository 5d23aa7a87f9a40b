// wireup_sim.cpp — the TCP bootstrap's allgather at job sizes one host can
// hold: N ranks of the real TcpBootstrap on loopback, each a thread, spread
// over processes of at most --ranks-per-process ranks so that no process runs
// out of descriptors (rank 0 has a process of its own: it alone holds a
// socket per rank). bench/wireup_scale.sh runs it for a range of N.
//
// Each process stands for a host and has an address of its own on loopback
// (127.0.0.1 for rank 0, 127.0.0.2 for the next, ...; Options::local_host):
// on one address, the 16383 connections to rank 0 of a job of 16384 and the
// 8191 parents' listening ports would all share one range of ephemeral
// ports, which they then exhaust; on a cluster every host has its own.
//
// Each repetition, every rank passes a barrier, times one allgather_table()
// of --blob-bytes bytes, checks every blob of the table against what its
// rank sent (a hash of the content, which every rank can compute), and drops
// the table at once: the ranks of one host would otherwise hold N tables of
// N blobs, and since they all finish at about the same time, dropping early
// is the only saving there is.
//
// Prints one tab-separated row (--header prints the column names):
//   n              ranks
//   blob_bytes     the size of every blob
//   reps           repetitions timed
//   time_s         the median over repetitions of the allgather's time: from
//                  the first rank entering it to the last one leaving it
//   busiest_rank   the rank that sent the most in one allgather, and
//   busiest_bytes  how many bytes (the most any rank sent)
//   mean_bytes     the mean over ranks of the bytes sent in one allgather
//   wireup_bytes   the most any rank sent to form the job (hellos, answers,
//                  where parents listen), before any allgather
//   rss_kib        per rank after the last allgather, tables dropped: the
//                  worker processes' resident memory over the ranks they host
//   peak_rss_kib   per rank, the same processes' peak resident memory
//                  (tables included) over their ranks
//   rank0_rss_kib  rank 0's process after the last allgather
//   fds_per_rank   descriptors open per rank in the worker processes once
//                  the job has formed
//   rank0_fds      descriptors open in rank 0's process then
//   processes      processes the ranks were spread over
//   peak_total_mib the most resident memory all of them held at once,
//                  sampled every 50 ms (see below)
// On any failure it prints how many ranks failed and the earliest errors
// (the later ones are mostly consequences: timeouts waiting for the failed),
// and exits 1.
//
// The ranks of one host may need more memory than it has: the coordinator
// samples its processes' resident memory every 50 ms and, past
// --memory-budget-mib (by default 80% of MemAvailable when it starts), stops
// them all and says so, with the figures, exiting 3: a shared host is not
// driven into its OOM killer.
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>
#include <utility>  // before Asio: 1.74 uses std::exchange without it

#include <boost/asio.hpp>

#include "ami/error.hpp"
#include "bootstrap.hpp"

namespace {

using ami::bootstrap::TcpBootstrap;
using Clock = std::chrono::steady_clock;

struct Args {
  std::uint32_t ranks = 64;
  std::size_t blob_bytes = 192;
  int repeats = 3;
  std::uint32_t ranks_per_process = 1024;
  std::chrono::milliseconds timeout{600000};
  std::uint64_t memory_budget_kib = 0;  // 0: 80% of MemAvailable at the start
};

constexpr auto kMemorySample = std::chrono::milliseconds(50);

constexpr std::size_t kStackBytes = 256 * 1024;  // per rank thread: the bootstrap needs little

std::int64_t now_ns() {  // CLOCK_MONOTONIC: one clock for every process of the host
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// ---- what a rank sends and how the table is checked ---------------------

// Rank r's blob in repetition i: bytes every rank can compute.
void fill_blob(std::vector<std::byte>& blob, std::uint32_t rank, int rep) {
  std::uint64_t x = (std::uint64_t{rank} << 20) ^ static_cast<std::uint64_t>(rep) ^ 0x9e3779b97f4a7c15ULL;
  for (std::byte& b : blob) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    b = static_cast<std::byte>(x >> 56);
  }
}

// A hash of a blob, word by word: checking a table costs about what
// receiving it did.
std::uint64_t hash_of(std::span<const std::byte> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ bytes.size();
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = (h ^ word) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  for (; i < bytes.size(); ++i) h = (h ^ std::to_integer<std::uint64_t>(bytes[i])) * 0x100000001b3ULL;
  return h;
}

// ---- one process's ranks ------------------------------------------------

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

std::uint64_t status_kib(const std::string& field, const std::string& process = "self") {  // VmRSS, VmHWM
  std::ifstream status("/proc/" + process + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with(field + ":")) return std::stoull(line.substr(field.size() + 1));
  return 0;
}

// The loopback address standing for process p's host.
std::string host_of(std::uint32_t process) {
  return "127.0." + std::to_string(process / 250) + "." + std::to_string(process % 250 + 1);
}

struct RankResult {
  std::uint64_t wireup_bytes = 0, allgather_bytes = 0;
  std::vector<std::int64_t> starts, ends;
  std::string error;
  std::int64_t failed_ns = 0;
};

// What every rank thread of a process shares.
struct Process {
  Process(const Args& a, std::uint16_t p, std::string h, std::uint32_t first, std::uint32_t count)
      : args(a), port(p), host(std::move(h)), first_rank(first), results(count), formed(count, [this]() noexcept { fds = open_fds(); }),
        finished(count, [this]() noexcept {
          rss_kib = status_kib("VmRSS");
          hwm_kib = status_kib("VmHWM");
        }) {
    expected.resize(static_cast<std::size_t>(a.repeats) * a.ranks);
    std::vector<std::byte> blob(a.blob_bytes);
    for (int rep = 0; rep < a.repeats; ++rep)
      for (std::uint32_t r = 0; r < a.ranks; ++r) {
        fill_blob(blob, r, rep);
        expected[static_cast<std::size_t>(rep) * a.ranks + r] = hash_of(blob);
      }
  }
  const Args& args;
  std::uint16_t port;
  std::string host;  // this process's own address
  std::uint32_t first_rank;
  std::vector<std::uint64_t> expected;  // by repetition, then rank
  std::vector<RankResult> results;
  std::size_t fds = 0;
  std::uint64_t rss_kib = 0, hwm_kib = 0;
  // Every thread arrives (or drops out, failing): once the job has formed,
  // and after the last allgather, before any bootstrap is torn down.
  std::barrier<std::function<void()>> formed, finished;
};

// The table's every blob, as rank `from` sent it in repetition `rep`.
std::string check(const ami::bootstrap::Table& table, const Process& p, int rep) {
  if (table.size() != p.args.ranks) return "a table of " + std::to_string(table.size()) + " blobs";
  for (std::uint32_t r = 0; r < table.size(); ++r)
    if (table[r].size() != p.args.blob_bytes ||
        hash_of(table[r]) != p.expected[static_cast<std::size_t>(rep) * p.args.ranks + r])
      return "the blob of rank " + std::to_string(r) + " differs from what it sent";
  return "";
}

void run_rank(Process& p, std::uint32_t index) {
  RankResult& out = p.results[index];
  const std::uint32_t rank = p.first_rank + index;
  bool formed = false;
  try {
    TcpBootstrap boot({.rank = rank, .size = p.args.ranks, .host = host_of(0),
                       .local_host = rank == 0 ? "" : p.host, .port = p.port, .timeout = p.args.timeout,
                       .key = "wireup_sim"});
    out.wireup_bytes = boot.bytes_sent();
    formed = true;
    p.formed.arrive_and_wait();
    std::vector<std::byte> mine(p.args.blob_bytes);
    for (int rep = 0; rep < p.args.repeats; ++rep) {
      fill_blob(mine, rank, rep);
      boot.barrier();
      const std::uint64_t before = boot.bytes_sent();
      out.starts.push_back(now_ns());
      ami::bootstrap::Table table = boot.allgather_table(mine);
      out.ends.push_back(now_ns());
      out.allgather_bytes = boot.bytes_sent() - before;
      if (std::string bad = check(table, p, rep); !bad.empty())
        throw ami::Error("rank " + std::to_string(rank) + ", repetition " + std::to_string(rep) + ": " + bad);
    }  // each table is dropped as its repetition ends
    p.finished.arrive_and_wait();
  } catch (const std::exception& e) {
    out.failed_ns = now_ns();
    out.error = e.what();
    if (!formed) p.formed.arrive_and_drop();
    p.finished.arrive_and_drop();
  }
}

void* rank_thread(void* arg) {
  auto* job = static_cast<std::pair<Process*, std::uint32_t>*>(arg);
  run_rank(*job->first, job->second);
  return nullptr;
}

// Runs ranks [first, first + count) as threads and writes what they saw to
// `out`, a line per fact (see read_report).
void host_ranks(const Args& args, std::uint16_t port, std::uint32_t process, std::uint32_t first,
                std::uint32_t count, int out) {
  Process p(args, port, host_of(process), first, count);
  std::vector<pthread_t> threads(count);
  std::vector<std::pair<Process*, std::uint32_t>> jobs(count);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kStackBytes);
  std::uint32_t started = 0;
  std::string report;
  for (; started < count; ++started) {
    jobs[started] = {&p, started};
    if (const int rc = pthread_create(&threads[started], &attr, rank_thread, &jobs[started]); rc != 0) {
      report += "error " + std::to_string(now_ns()) + " rank " + std::to_string(first + started) +
                ": cannot start its thread: " + std::strerror(rc) + "\n";
      break;
    }
  }
  pthread_attr_destroy(&attr);
  for (std::uint32_t i = 0; i < started; ++i) pthread_join(threads[i], nullptr);
  report += "process " + std::to_string(count) + " " + std::to_string(p.fds) + " " + std::to_string(p.rss_kib) + " " +
            std::to_string(p.hwm_kib) + "\n";
  for (std::uint32_t i = 0; i < started; ++i) {
    const RankResult& r = p.results[i];
    if (!r.error.empty()) report += "error " + std::to_string(r.failed_ns) + " " + r.error + "\n";
    report += "rank " + std::to_string(first + i) + " " + std::to_string(r.wireup_bytes) + " " +
              std::to_string(r.allgather_bytes);
    for (std::size_t k = 0; k < r.starts.size(); ++k)
      report += " " + std::to_string(r.starts[k]) + " " + std::to_string(r.ends[k]);
    report += "\n";
  }
  for (std::size_t done = 0; done < report.size();) {
    const ssize_t n = ::write(out, report.data() + done, report.size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
}

// ---- the coordinator ----------------------------------------------------

// A port below the kernel's ephemeral range, free when tried: rank 0 listens
// on it a moment later, and no outgoing connection is handed it meanwhile.
std::uint16_t free_port() {
  namespace asio = boost::asio;
  asio::io_context io;
  int low = 32768, high = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low >> high;
  std::mt19937 pick{std::random_device{}()};
  std::uniform_int_distribution<int> below(std::max(1024, low - 10000), low - 1);
  for (int tries = 0; tries < 64; ++tries) {
    const auto port = static_cast<std::uint16_t>(below(pick));
    boost::system::error_code ec;
    asio::ip::tcp::acceptor a(io);
    a.open(asio::ip::tcp::v4(), ec);
    if (!ec) a.bind({asio::ip::make_address("127.0.0.1"), port}, ec);
    if (!ec) return port;
  }
  throw ami::Error("wireup_sim: no free port below the ephemeral range");
}

struct Totals {
  std::uint32_t processes = 0, worker_ranks = 0;
  std::uint64_t worker_fds = 0, worker_rss = 0, worker_hwm = 0, rank0_rss = 0, rank0_fds = 0;
  std::vector<std::int64_t> first_start, last_end;  // by repetition
  std::uint32_t busiest_rank = 0, ranks_reported = 0;
  std::uint64_t busiest_bytes = 0, sum_bytes = 0, wireup_bytes = 0;
  std::vector<std::pair<std::int64_t, std::string>> errors;  // when, what
  std::uint32_t failed = 0;
};

void read_report(const std::string& text, bool rank0_process, Totals& t) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "error") {
      ++t.failed;
      std::int64_t when = 0;
      in >> when;
      std::string what;
      std::getline(in >> std::ws, what);
      t.errors.emplace_back(when, what);
    } else if (kind == "process") {
      std::uint64_t ranks, fds, rss, hwm;
      in >> ranks >> fds >> rss >> hwm;
      ++t.processes;
      if (rank0_process) {
        t.rank0_rss = rss;
        t.rank0_fds = fds;
      } else {
        t.worker_ranks += static_cast<std::uint32_t>(ranks), t.worker_fds += fds, t.worker_rss += rss,
            t.worker_hwm += hwm;
      }
    } else if (kind == "rank") {
      std::uint32_t rank;
      std::uint64_t wireup, bytes;
      in >> rank >> wireup >> bytes;
      ++t.ranks_reported;
      t.wireup_bytes = std::max(t.wireup_bytes, wireup);
      t.sum_bytes += bytes;
      if (bytes > t.busiest_bytes) t.busiest_bytes = bytes, t.busiest_rank = rank;
      std::int64_t start, end;
      for (std::size_t k = 0; in >> start >> end; ++k) {
        if (t.first_start.size() <= k) t.first_start.push_back(start), t.last_end.push_back(end);
        t.first_start[k] = std::min(t.first_start[k], start);
        t.last_end[k] = std::max(t.last_end[k], end);
      }
    }
  }
}

std::uint64_t mem_available_kib() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.starts_with("MemAvailable:")) return std::stoull(line.substr(13));
  return 0;
}

// Reads every process's report while watching the sum of their resident
// memory. Returns "" or why it stopped them.
std::string collect(const std::vector<pid_t>& pids, const std::vector<int>& fds, std::vector<std::string>& texts,
                    std::uint64_t budget_kib, std::uint64_t& peak_sum_kib) {
  std::vector<bool> open(fds.size(), true);
  std::size_t left = fds.size();
  auto next_sample = Clock::now();
  while (left > 0) {
    std::vector<pollfd> watched;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < fds.size(); ++i)
      if (open[i]) watched.push_back({fds[i], POLLIN, 0}), which.push_back(i);
    (void)::poll(watched.data(), watched.size(), static_cast<int>(kMemorySample.count()));
    for (std::size_t k = 0; k < watched.size(); ++k) {
      if (watched[k].revents == 0) continue;
      char buffer[65536];
      const ssize_t n = ::read(fds[which[k]], buffer, sizeof buffer);
      if (n > 0) texts[which[k]].append(buffer, static_cast<std::size_t>(n));
      else open[which[k]] = false, --left;
    }
    if (Clock::now() < next_sample) continue;
    next_sample = Clock::now() + kMemorySample;
    std::uint64_t sum = 0;
    for (pid_t pid : pids) sum += status_kib("VmRSS", std::to_string(pid));
    peak_sum_kib = std::max(peak_sum_kib, sum);
    if (sum > budget_kib) {
      for (pid_t pid : pids) ::kill(pid, SIGKILL);
      return "stopped: the ranks' processes reached " + std::to_string(sum / 1024) + " MiB resident, over the " +
             std::to_string(budget_kib / 1024) + " MiB this run allows itself";
    }
  }
  return "";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int coordinate(const Args& args) {
  const std::uint64_t budget_kib = args.memory_budget_kib ? args.memory_budget_kib : mem_available_kib() / 5 * 4;
  const std::uint16_t port = free_port();
  // Process 0 hosts rank 0 alone; the others hold the ranks after it in order.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> spans{{0, 1}};
  for (std::uint32_t r = 1; r < args.ranks; r += args.ranks_per_process)
    spans.emplace_back(r, std::min(args.ranks_per_process, args.ranks - r));
  std::vector<pid_t> pids;
  std::vector<int> reports;
  for (std::uint32_t process = 0; process < spans.size(); ++process) {
    const auto [first, count] = spans[process];
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) throw ami::Error("wireup_sim: pipe: " + std::string(std::strerror(errno)));
    const pid_t pid = ::fork();
    if (pid < 0) throw ami::Error("wireup_sim: fork: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      ::close(pipe_fds[0]);
      for (int fd : reports) ::close(fd);
      ::close(STDIN_FILENO);
      host_ranks(args, port, process, first, count, pipe_fds[1]);
      _exit(0);
    }
    ::close(pipe_fds[1]);
    pids.push_back(pid);
    reports.push_back(pipe_fds[0]);
  }
  std::vector<std::string> texts(pids.size());
  std::uint64_t peak_sum_kib = 0;
  const std::string stopped = collect(pids, reports, texts, budget_kib, peak_sum_kib);
  for (int fd : reports) ::close(fd);
  if (!stopped.empty()) {
    for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
    std::fprintf(stderr, "wireup_sim: N=%u: %s\n", args.ranks, stopped.c_str());
    return 3;
  }
  Totals t;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    const std::string& text = texts[i];
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      t.errors.emplace_back(0, "the process of ranks " + std::to_string(spans[i].first) + ".." +
                                   std::to_string(spans[i].first + spans[i].second - 1) +
                                   " ended abnormally (status " + std::to_string(status) + ")");
    read_report(text, i == 0, t);
  }
  if (t.errors.empty() && t.ranks_reported != args.ranks) t.errors.emplace_back(0, "not every rank reported");
  if (!t.errors.empty()) {
    std::sort(t.errors.begin(), t.errors.end());
    std::fprintf(stderr, "wireup_sim: N=%u: %u rank(s) failed; the earliest errors:\n", args.ranks, t.failed);
    for (std::size_t i = 0; i < t.errors.size() && i < 5; ++i)
      std::fprintf(stderr, "wireup_sim:   %s\n", t.errors[i].second.substr(0, 400).c_str());
    return 1;
  }
  std::vector<double> times;
  for (std::size_t k = 0; k < t.first_start.size(); ++k) times.push_back((t.last_end[k] - t.first_start[k]) / 1e9);
  const double per_worker = t.worker_ranks ? double(t.worker_ranks) : 1.0;
  std::printf("%u\t%zu\t%d\t%.4f\t%u\t%llu\t%.0f\t%llu\t%.0f\t%.0f\t%llu\t%.2f\t%llu\t%u\t%llu\n", args.ranks,
              args.blob_bytes, args.repeats, median(times), t.busiest_rank,
              static_cast<unsigned long long>(t.busiest_bytes), double(t.sum_bytes) / args.ranks,
              static_cast<unsigned long long>(t.wireup_bytes), double(t.worker_rss) / per_worker,
              double(t.worker_hwm) / per_worker, static_cast<unsigned long long>(t.rank0_rss),
              double(t.worker_fds) / per_worker, static_cast<unsigned long long>(t.rank0_fds), t.processes,
              static_cast<unsigned long long>(peak_sum_kib / 1024));
  return 0;
}

bool parse(const char* text, auto& value) {
  const char* end = text + std::strlen(text);
  const auto [p, ec] = std::from_chars(text, end, value);
  return ec == std::errc{} && p == end && value > 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: wireup_sim --ranks N [--blob-bytes B (192)] [--repeats R (3)]\n"
               "                  [--ranks-per-process P (1024)] [--timeout-ms T (600000)]\n"
               "                  [--memory-budget-mib M (80%% of MemAvailable)]\n"
               "       wireup_sim --header\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--header") {
      std::printf("n\tblob_bytes\treps\ttime_s\tbusiest_rank\tbusiest_bytes\tmean_bytes\twireup_bytes\trss_kib\t"
                  "peak_rss_kib\trank0_rss_kib\tfds_per_rank\trank0_fds\tprocesses\tpeak_total_mib\n");
      return 0;
    }
    if (i + 1 == argc) return usage();
    const char* value = argv[++i];
    long long ms = 0;
    std::uint64_t mib = 0;
    bool ok = false;
    if (flag == "--ranks") ok = parse(value, args.ranks);
    else if (flag == "--blob-bytes") ok = parse(value, args.blob_bytes);
    else if (flag == "--repeats") ok = parse(value, args.repeats);
    else if (flag == "--ranks-per-process") ok = parse(value, args.ranks_per_process);
    else if (flag == "--timeout-ms") ok = parse(value, ms), args.timeout = std::chrono::milliseconds(ms);
    else if (flag == "--memory-budget-mib") ok = parse(value, mib), args.memory_budget_kib = mib * 1024;
    if (!ok) return usage();
  }
  if (args.blob_bytes > ami::bootstrap::kMaxBlobBytes) {
    std::fprintf(stderr, "wireup_sim: --blob-bytes is at most %zu\n", ami::bootstrap::kMaxBlobBytes);
    return 2;
  }
  try {
    return coordinate(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
