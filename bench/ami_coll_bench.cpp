// bench/ami_coll_bench.cpp — latency of ami's barrier, 8-byte allreduce and
// 1 MiB allreduce (sums of doubles) over the world of a job; its twin for
// MPI is bench/mpi_coll_bench.c, and bench/coll_vs_mpi.sh runs both.
//
// Every task runs it, placed by AMI_RANK, AMI_SIZE and AMI_BOOTSTRAP. For
// each collective: warm-up iterations, then repetitions of back-to-back
// iterations, each repetition starting after a barrier; task 0 prints the
// median over repetitions of the time per iteration, one line each:
//   barrier <usec>
//   allreduce_8 <usec>
//   allreduce_1m <usec>
//   allreduce_<bytes> <usec>     for each size of --sweep
//
// usage: ami_coll_bench [--iters N] [--large-iters N] [--reps R] [--yield]
//                       [--spin USEC] [--sweep BYTES,BYTES,...]
//   --yield: sched_yield() whenever an advance finds nothing to do (for
//   jobs with more tasks than cores).
//   --spin: busy-poll for USEC after the last event, then sleep on the
//   context's event_fd() until the next (ami::wait_until; docs/DESIGN.md,
//   "Event-driven progress"): a waiting task gives its core to the peer it
//   waits for. With --yield too, it yields the core while it spins.
//   --sweep: allreduce at these sizes too (multiples of 8 up to 1 MiB),
//   each with N * 64 / bytes iterations, at least the large ones.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ami/ami.hpp"
#include "ami/wait.hpp"

namespace {

constexpr std::uint16_t kDispatch = 60;

constexpr std::size_t kLargeCount = 131072;  // doubles: 1 MiB

struct Options {
  int iters = 10000;
  int large_iters = 200;
  int reps = 11;
  bool yield = false;
  long spin_us = -1;  // -1: no sleeping (busy-poll, or --yield)
  std::vector<std::size_t> sweep;  // bytes
};

// "64,512,4096" -> sizes; false unless every one is a multiple of 8 in 8..1 MiB.
bool parse_sizes(const std::string& list, std::vector<std::size_t>& out) {
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, end - at);
    char* rest = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &rest, 10);
    if (item.empty() || *rest != '\0' || v < 8 || v > kLargeCount * 8 || v % 8 != 0) return false;
    out.push_back(static_cast<std::size_t>(v));
    at = end + 1;
  }
  return true;
}

// Iterations of a sweep size: iters at 64 B, fewer in proportion above, at
// least large_iters.
int sweep_iters(const Options& o, std::size_t bytes) {
  const auto n = static_cast<long long>(o.iters) * 64 / static_cast<long long>(bytes);
  return static_cast<int>(std::clamp<long long>(n, o.large_iters, std::max(o.iters, o.large_iters)));
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--iters" && has_value) {
      o.iters = std::atoi(argv[++i]);
    } else if (a == "--large-iters" && has_value) {
      o.large_iters = std::atoi(argv[++i]);
    } else if (a == "--reps" && has_value) {
      o.reps = std::atoi(argv[++i]);
    } else if (a == "--yield") {
      o.yield = true;
    } else if (a == "--spin" && has_value) {
      o.spin_us = std::atol(argv[++i]);
      if (o.spin_us < 0) return false;
    } else if (a == "--sweep" && has_value && parse_sizes(argv[i + 1], o.sweep)) {
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--iters N] [--large-iters N] [--reps R] [--yield] [--spin USEC] "
                   "[--sweep BYTES,...]\n",
                   argv[0]);
      return false;
    }
  }
  return o.iters > 0 && o.large_iters > 0 && o.reps > 0;
}

class Bench {
 public:
  Bench(ami::Client& client, const Options& o)
      : c_(client.context(0)), coll_(c_, kDispatch), w_(coll_.world()), o_(o) {}

  // One collective, waited for.
  void barrier() { finish(w_.barrier(callback())); }
  void allreduce(const double* send, double* recv, std::size_t count) {
    finish(w_.allreduce(send, recv, count, ami::DataType::float64, ami::ReduceOp::sum, callback()));
  }

  // Median over repetitions of the time per iteration of op, in usec.
  template <typename Op>
  double measure(int iters, Op op) {
    for (int i = 0; i < std::max(iters / 10, 10); ++i) op();  // warm-up
    std::vector<double> per_iter;
    for (int r = 0; r < o_.reps; ++r) {
      barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) op();
      const auto t1 = std::chrono::steady_clock::now();
      per_iter.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
    }
    std::sort(per_iter.begin(), per_iter.end());
    return per_iter[per_iter.size() / 2];
  }

  std::uint32_t rank() const { return w_.rank(); }

  // Before exiting: every peer has heard this task's last acknowledgements.
  void farewell() {
    barrier();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    while (std::chrono::steady_clock::now() < until) (void)c_.advance();
  }

 private:
  ami::Callback callback() {
    done_ = false;
    return {+[](void* p, ami::Status s) {
      auto* b = static_cast<Bench*>(p);
      b->done_ = true;
      b->status_ = s;
    }, this};
  }
  void finish(ami::Status posted) {
    if (!posted.ok()) fail(posted);
    if (o_.spin_us >= 0) {
      const ami::Status s = ami::wait_until(
          c_, [&] { return done_; }, {.spin = std::chrono::microseconds(o_.spin_us), .yield = o_.yield});
      if (!s.ok()) fail(s);
    }
    while (!done_)
      if (c_.advance() == 0 && o_.yield) sched_yield();
    if (!status_.ok()) fail(status_);
  }
  [[noreturn]] static void fail(ami::Status s) {
    std::fprintf(stderr, "ami_coll_bench: %s\n", ami::to_string(s).c_str());
    std::exit(1);
  }

  ami::Context& c_;
  ami::Collectives coll_;
  ami::Geometry& w_;
  Options o_;
  bool done_ = false;
  ami::Status status_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;
  try {
    ami::Client client;
    Bench b(client, o);
    const double x = 1.0 + b.rank();
    double y = 0;
    std::vector<double> send(kLargeCount, 1.0 + b.rank()), recv(send.size());
    const double barrier = b.measure(o.iters, [&] { b.barrier(); });
    const double small = b.measure(o.iters, [&] { b.allreduce(&x, &y, 1); });
    const double large = b.measure(o.large_iters, [&] { b.allreduce(send.data(), recv.data(), send.size()); });
    std::vector<double> swept;
    for (std::size_t bytes : o.sweep)
      swept.push_back(b.measure(sweep_iters(o, bytes), [&] { b.allreduce(send.data(), recv.data(), bytes / 8); }));
    b.farewell();
    if (b.rank() == 0) {
      std::printf("barrier %.3f\nallreduce_8 %.3f\nallreduce_1m %.3f\n", barrier, small, large);
      for (std::size_t i = 0; i < o.sweep.size(); ++i) std::printf("allreduce_%zu %.3f\n", o.sweep[i], swept[i]);
      const double n = static_cast<double>(client.size());
      if (y != n * (n + 1) / 2 || recv[12345] != y) {
        std::fprintf(stderr, "ami_coll_bench: wrong allreduce result\n");
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ami_coll_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
