// bench/ami_wireup_ring.cpp — what wire-up on first use costs a task that
// talks only to its two ring neighbours: the queue pairs (and segments) it
// made, and the first round trip to its right neighbour (which connects the
// lane) against warm round trips on the same lane. bench/wireup_scale.sh runs
// it as a job of 8 processes in the soft-RoCE VM.
//
// Every task runs it, placed by AMI_RANK, AMI_SIZE and AMI_BOOTSTRAP or by a
// PMIx launcher, and prints one line:
//   rank <r> queue_pairs <n> first_rtt_us <t> warm_rtt_us <median> segments_mapped <m> addresses_learnt <a>
// (queue pairs the verbs backend made, segments the shm backend mapped; -1
// for a backend not in use; the peer tasks whose address it learnt: all of
// them when addresses are exchanged at start, its neighbours when they are
// fetched on first use, under PMIx).
// A task that finds nothing to do yields its core (sched_yield): the job
// has more tasks than the host has cores, and a peer that is not running
// answers nothing.
// usage: ami_wireup_ring [--warm N]
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ami/ami.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint16_t kPing = 21, kPong = 22, kDone = 23;

struct Ring {
  ami::Context* ctx = nullptr;
  std::uint32_t pongs = 0;
  std::uint32_t dones = 0;
};

void on_ping(void* cookie, const ami::Incoming& in, ami::Receive*) {
  auto* r = static_cast<Ring*>(cookie);
  for (;;) {  // a pong is tiny and the FIFO deep: no_resource only if the peer stalls
    const ami::Status s = r->ctx->send_immediate({.dest = in.origin, .dispatch = kPong, .header = in.header});
    if (s != ami::StatusCode::no_resource) return;
    (void)r->ctx->advance();
  }
}
void on_pong(void* cookie, const ami::Incoming&, ami::Receive*) { ++static_cast<Ring*>(cookie)->pongs; }
void on_done(void* cookie, const ami::Incoming&, ami::Receive*) { ++static_cast<Ring*>(cookie)->dones; }

void must(ami::Status s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "ami_wireup_ring: %s: %s\n", what, ami::to_string(s).c_str());
  std::exit(1);
}

void send(Ring& r, ami::Endpoint to, std::uint16_t dispatch) {
  const std::byte header[8] = {};
  for (;;) {
    const ami::Status s = r.ctx->send_immediate({.dest = to, .dispatch = dispatch, .header = header});
    if (s.ok()) return;
    if (s != ami::StatusCode::no_resource) must(s, "send");
    (void)r.ctx->advance();
  }
}

template <typename Done>
void advance_until(Ring& r, Done done) {
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (r.ctx->advance() == 0) sched_yield();
    if (Clock::now() > end) {
      std::fprintf(stderr, "ami_wireup_ring: no answer in 60 s\n");
      std::exit(1);
    }
  }
}

// One round trip to dest, in microseconds.
double round_trip(Ring& r, ami::Endpoint dest) {
  const std::uint32_t before = r.pongs;
  const auto t0 = Clock::now();
  send(r, dest, kPing);
  advance_until(r, [&] { return r.pongs > before; });
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// The number just before " words" in text ("3 queue pair(s) made"), or -1.
long number_before(const std::string& text, const char* words) {
  const std::size_t at = text.find(std::string(" ") + words);
  if (at == std::string::npos) return -1;
  std::size_t from = at;
  while (from > 0 && text[from - 1] >= '0' && text[from - 1] <= '9') --from;
  return from == at ? -1 : std::stol(text.substr(from, at - from));
}

}  // namespace

int main(int argc, char** argv) {
  int warm = 1000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--warm") == 0 && i + 1 < argc) {
      warm = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: ami_wireup_ring [--warm N]\n");
      return 2;
    }
  }
  try {
    ami::Client client({.name = "wireup_ring"});
    Ring r;
    r.ctx = &client.context(0);
    must(r.ctx->set_dispatch(kPing, {on_ping, &r}), "set_dispatch");
    must(r.ctx->set_dispatch(kPong, {on_pong, &r}), "set_dispatch");
    must(r.ctx->set_dispatch(kDone, {on_done, &r}), "set_dispatch");
    const std::uint32_t n = client.size(), me = client.task();
    const ami::Endpoint right{(me + 1) % n, 0}, left{(me + n - 1) % n, 0};
    const double first = round_trip(r, right);
    std::vector<double> rtts;
    for (int i = 0; i < warm; ++i) rtts.push_back(round_trip(r, right));
    std::nth_element(rtts.begin(), rtts.begin() + static_cast<long>(rtts.size() / 2), rtts.end());
    const double median = rtts.empty() ? 0 : rtts[rtts.size() / 2];
    // Done with both neighbours: each has served us and been served.
    send(r, left, kDone);
    send(r, right, kDone);
    advance_until(r, [&] { return r.dones == 2; });
    const std::string backends = client.describe_backends();
    std::printf("rank %u queue_pairs %ld first_rtt_us %.1f warm_rtt_us %.1f segments_mapped %ld addresses_learnt %u\n",
                me, number_before(backends, "queue pair(s) made"), first, median,
                number_before(backends, "segment(s) mapped"), client.peers_joined());
    // Linger: the neighbours' last words to us still need our advance.
    const auto until = Clock::now() + std::chrono::milliseconds(300);
    while (Clock::now() < until)
      if (r.ctx->advance() == 0) sched_yield();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ami_wireup_ring: %s\n", e.what());
    return 1;
  }
  return 0;
}
