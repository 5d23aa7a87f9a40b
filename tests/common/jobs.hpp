// jobs.hpp — jobs of real processes on this host for the tests: each rank
// a forked child that builds its Client (bootstrapped over TCP on a free
// port) and runs a script, exiting with the script's code; the parent waits
// with a deadline and kills what overstays.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <rdma/rdma_cma.h>

#include "ami/ami.hpp"
#include "pair.hpp"

namespace test {

using namespace ami;

using Script = std::function<int(Client&)>;

// ami's files in /dev/shm (it maps memfds and should leave none); other
// programs' (UCX, MPI, other jobs running meanwhile) are not its business.
inline std::set<std::string> dev_shm() {
  std::set<std::string> names;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().find("ami") != std::string::npos) names.insert(e.path().string());
  return names;
}

inline ClientOptions job(std::uint32_t rank, std::uint32_t size, const std::string& address, const Config& c) {
  return ClientOptions{.name = "test", .contexts = 1,
                       .job = {.rank = rank, .size = size, .bootstrap = address}, .config = c};
}

inline std::size_t open_fds() {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// How rank r of a job bootstrapped at address builds its Client.
using RankOptions = std::function<ClientOptions(std::uint32_t rank, const std::string& address)>;
// What a rank whose Client threw exits with, given the error's text.
using OnError = std::function<int(const std::string& what)>;

// Forks one child per rank; each builds its Client and runs its script
// (on_error when the Client throws: by default the text on stderr and 101),
// and exits 102 when the Client left a file descriptor open.
inline std::vector<pid_t> spawn_ranks(std::uint32_t size, const RankOptions& options,
                                      const std::vector<Script>& scripts, const OnError& on_error = {}) {
  const std::string address = "127.0.0.1:" + std::to_string(test::free_port());
  std::vector<pid_t> pids;
  for (std::uint32_t r = 0; r < size; ++r) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 100;
      // librdmacm opens the RDMA devices once per process, on first use, and
      // keeps them until exit: done here first, so the count below sees
      // only what the Client itself opens and closes.
      {
        int n = 0;
        if (ibv_context** devices = rdma_get_devices(&n)) rdma_free_devices(devices);
      }
      const std::size_t fds = open_fds();
      try {
        Client client(options(r, address));
        rc = scripts[r](client);
      } catch (const std::exception& e) {
        if (on_error) {
          rc = on_error(e.what());
        } else {
          std::fprintf(stderr, "rank %u: %s\n", r, e.what());
          rc = 101;
        }
      }
      // The Client gave back every descriptor it opened (sockets, segments,
      // pidfds, RDMA device contexts), whatever happened to its peers.
      if (rc == 0 && open_fds() != fds) {
        std::fprintf(stderr, "rank %u: %zu file descriptors open before the Client, %zu after\n", r, fds,
                     open_fds());
        rc = 102;
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  return pids;
}

// The same for ranks of one configuration with one context each.
inline std::vector<pid_t> spawn(std::uint32_t size, const Config& given, const std::vector<Script>& scripts) {
  Config config = given;  // every job its own key, as a launcher gives it
  if (config.origin(ami::ParamName::lookup("AMI_JOB_KEY")) == "default") REQUIRE(config.set("AMI_JOB_KEY", make_job_key()).ok());
  return spawn_ranks(size, [&](std::uint32_t r, const std::string& address) { return job(r, size, address, config); },
                     scripts);
}

// Waits for every child; returns their exit codes (-signal when killed;
// 124 when the deadline passed and the child was killed).
inline std::vector<int> wait_all(const std::vector<pid_t>& pids, std::chrono::seconds deadline) {
  std::vector<int> codes(pids.size(), -1000);
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::size_t left = pids.size();
  while (left > 0) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -1000) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > end) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (codes[i] == -1000) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          codes[i] = 124;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

inline std::vector<int> run_job(std::uint32_t size, const Config& config, const std::vector<Script>& scripts,
                         std::chrono::seconds deadline = std::chrono::seconds(60)) {
  return wait_all(spawn(size, config, scripts), deadline);
}

// Advances until pred holds or 30 s pass.
inline bool progress_until(Context& c, const std::function<bool()>& pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!pred()) {
    (void)c.advance();
    if (std::chrono::steady_clock::now() > end) return false;
  }
  return true;
}

}  // namespace test
