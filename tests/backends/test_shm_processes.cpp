// Jobs of real processes on this host, bootstrapped over TCP, talking
// through the shm backend. Each rank is a forked child that runs a script
// and exits with 0 on success; the parent checks every exit status and that
// nothing is left behind in /dev/shm.
#include <algorithm>
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ami/ami.hpp"
#include "jobs.hpp"
#include "pair.hpp"
#include "shm_device.hpp"

using namespace ami;
using namespace test;

namespace {

std::uint8_t byte_at(std::size_t i, std::uint32_t seed) {
  return static_cast<std::uint8_t>((i * 131 + seed * 7 + (i >> 11)) & 0xFF);
}

// Receives messages into a buffer the handler allocates; checks every byte
// against byte_at(i, seed) where seed travels in the header.
struct Checker {
  int received = 0;
  int bad = 0;
  std::vector<std::uint8_t> storage;
  std::size_t expect = 0;
  std::uint32_t seed = 0;

  void verify(const std::uint8_t* p, std::size_t n) {
    if (n != expect) ++bad;
    for (std::size_t i = 0; i < n; ++i)
      if (p[i] != byte_at(i, seed)) {
        ++bad;
        break;
      }
    ++received;
  }
  static void done(void* c, Status s) {
    auto* k = static_cast<Checker*>(c);
    if (!s.ok()) ++k->bad;
    k->verify(k->storage.data() + 3, k->expect);  // unaligned on purpose
  }
  static void handler(void* c, const Incoming& in, Receive* recv) {
    auto* k = static_cast<Checker*>(c);
    std::uint32_t sizes[2];
    std::memcpy(sizes, in.header.data(), sizeof sizes);
    k->seed = sizes[0];
    k->expect = sizes[1];
    if (recv == nullptr) {
      k->verify(reinterpret_cast<const std::uint8_t*>(in.payload.data()), in.payload.size());
      return;
    }
    k->storage.assign(in.total_bytes + 3, 0);
    recv->buffer = k->storage.data() + 3;
    recv->done = {&Checker::done, k};
  }
};

const std::vector<std::size_t> kSizes = {0, 1, 2, 7, 63, 64, 65, 1000, 4095, 16303, 16384, 65537,
                                         1 << 20, (1 << 20) + 13, 16 << 20};

// Sends every size in sizes to peer from an unaligned buffer, one at a
// time, while receiving the peer's; both ways at once.
int exchange_sizes(Client& client, const std::vector<std::size_t>& sizes) {
  Context& c = client.context(0);
  const Endpoint peer{client.task() ^ 1, 0};
  Checker checker;
  if (!c.set_dispatch(9, {&Checker::handler, &checker}).ok()) return 2;
  std::vector<std::uint8_t> src(*std::max_element(sizes.begin(), sizes.end()) + 8);
  int sent_done = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::uint32_t seed = static_cast<std::uint32_t>(k + client.task() * 100);
    std::uint8_t* p = src.data() + 5;  // unaligned
    for (std::size_t i = 0; i < sizes[k]; ++i) p[i] = byte_at(i, seed);
    const std::uint32_t header[2] = {seed, static_cast<std::uint32_t>(sizes[k])};
    Callback done{+[](void* n, Status s) { *static_cast<int*>(n) += s.ok() ? 1 : 1000; }, &sent_done};
    if (!c.send({.dest = peer, .dispatch = 9, .header = std::as_bytes(std::span(header)),
                 .payload = {reinterpret_cast<const std::byte*>(p), sizes[k]}, .local_done = done})
             .ok())
      return 3;
    if (!progress_until(c, [&] { return sent_done == static_cast<int>(k + 1); })) return 4;
  }
  if (!progress_until(c, [&] { return checker.received == static_cast<int>(sizes.size()); })) return 5;
  // Stay a while so the peer's last packets are drained by us before exit.
  for (int i = 0; i < 1000; ++i) (void)c.advance();
  return checker.bad == 0 && sent_done == static_cast<int>(sizes.size()) ? 0 : 6;
}

int exchange_all_sizes(Client& client) { return exchange_sizes(client, kSizes); }

// The rendezvous sizes: up to 64 MiB.
int exchange_rndv_sizes(Client& client) {
  return exchange_sizes(client, {1, 4097, 65537, (1 << 20) + 13, (16 << 20) + 1, 64 << 20});
}

}  // namespace

TEST_CASE("two processes: active messages both ways, 0 B..16 MiB, odd sizes, unaligned buffers") {
  const auto before = dev_shm();
  const auto codes = run_job(2, Config{}, {exchange_all_sizes, exchange_all_sizes});
  CHECK(codes == std::vector<int>{0, 0});
  CHECK(dev_shm() == before);
}

TEST_CASE("two processes: every rendezvous mode, 1 B..64 MiB both ways") {
  for (const char* mode : {"discard_get", "split_get", "stop_put"}) {
    CAPTURE(mode);
    const Config config = test::config_with({{"AMI_RNDV_MODE", mode}});
    CHECK(run_job(2, config, {exchange_rndv_sizes, exchange_rndv_sizes}) == std::vector<int>{0, 0});
  }
}

TEST_CASE("two processes: many concurrent rendezvous messages into a tiny ring, none lost, none stuck") {
  // Only the receiver's ring running low can stop these messages.
  const Config config = test::config_with({{"AMI_SHM_RING_DEPTH", "8"}, {"AMI_RNDV_CROSSOVER", "1099511627776"},
                                           {"AMI_RNDV_LOW_WATER", "50"}});
  constexpr int kMessages = 400;
  auto sender = [](Client& client) {
    Context& c = client.context(0);
    std::vector<std::vector<std::uint8_t>> payloads(kMessages);
    std::vector<std::uint32_t> index(kMessages);
    int local = 0, remote = 0;
    Callback on_local{+[](void* n, Status s) { *static_cast<int*>(n) += s.ok() ? 1 : 100000; }, &local};
    Callback on_remote{+[](void* n, Status s) { *static_cast<int*>(n) += s.ok() ? 1 : 100000; }, &remote};
    for (int i = 0; i < kMessages; ++i) {
      index[i] = static_cast<std::uint32_t>(i);
      payloads[i].resize(3000 + 97 * static_cast<std::size_t>(i));
      for (std::size_t k = 0; k < payloads[i].size(); ++k) payloads[i][k] = byte_at(k, index[i]);
      Status s;
      while ((s = c.send({.dest = {1, 0}, .dispatch = 1, .header = std::as_bytes(std::span(&index[i], 1)),
                          .payload = std::as_bytes(std::span(payloads[i])), .local_done = on_local,
                          .remote_done = on_remote})) == StatusCode::no_resource)
        (void)c.advance();
      if (!s.ok()) return 2;
    }
    if (!progress_until(c, [&] { return local >= kMessages && remote >= kMessages; })) return 3;
    return local == kMessages && remote == kMessages ? 0 : 4;
  };
  auto receiver = [](Client& client) {
    Context& c = client.context(0);
    struct State {
      std::vector<std::vector<std::uint8_t>> bufs = std::vector<std::vector<std::uint8_t>>(kMessages);
      std::vector<std::uint32_t> sizes = std::vector<std::uint32_t>(kMessages);
      int done = 0;
      int bad = 0;
    } st;
    auto h = +[](void* o, const Incoming& in, Receive* recv) {
      auto* st = static_cast<State*>(o);
      std::uint32_t i = 0;
      std::memcpy(&i, in.header.data(), sizeof i);
      if (i >= kMessages || recv == nullptr) {
        ++st->bad;
        return;
      }
      st->bufs[i].assign(in.total_bytes, 0);
      recv->buffer = st->bufs[i].data();
      recv->done = {+[](void* o, Status s) {
        auto* st = static_cast<State*>(o);
        if (!s.ok()) ++st->bad;
        ++st->done;
      }, st};
    };
    if (!c.set_dispatch(1, {h, &st}).ok()) return 2;
    // Drain slowly, so the ring stays nearly full.
    for (int i = 0; i < 20000000 && st.done < kMessages; ++i) {
      (void)c.advance();
      if (i % 4 == 0) std::this_thread::yield();
    }
    if (st.done != kMessages) return 3;
    for (std::uint32_t i = 0; i < kMessages; ++i)
      for (std::size_t k = 0; k < st.bufs[i].size(); ++k)
        if (st.bufs[i][k] != byte_at(k, i)) return 4;
    for (int i = 0; i < 20000; ++i) (void)c.advance();  // let the last acks go out
    if (c.stats().rndv_stops_by_reason[2] == 0) return 5;  // reception_low never fired
    return st.bad == 0 && c.stats().malformed_packets == 0 ? 0 : 6;
  };
  CHECK(run_job(2, config, {sender, receiver}) == std::vector<int>{0, 0});
}

TEST_CASE("a ring smaller than the window: many outstanding messages, none lost") {
  const Config config = test::config_with({{"AMI_SHM_RING_DEPTH", "4"}, {"AMI_SHM_CELL_SIZE", "256"}});
  constexpr int kMessages = 20000;
  auto sender = [](Client& client) {
    Context& c = client.context(0);
    int acked = 0;
    Callback count{+[](void* n, Status s) { *static_cast<int*>(n) += s.ok() ? 1 : 100000; }, &acked};
    std::vector<std::uint32_t> values(kMessages);
    for (int i = 0; i < kMessages; ++i) {
      values[i] = static_cast<std::uint32_t>(i);
      Status s;
      while ((s = c.send({.dest = {1, 0}, .dispatch = 1, .payload = std::as_bytes(std::span(&values[i], 1)),
                          .remote_done = count})) == StatusCode::no_resource)
        (void)c.advance();
      if (!s.ok()) return 2;
    }
    return progress_until(c, [&] { return acked >= kMessages; }) && acked == kMessages ? 0 : 3;
  };
  auto receiver = [](Client& client) {
    Context& c = client.context(0);
    struct Order {
      std::uint32_t next = 0;
      bool ok = true;
    } order;
    auto h = +[](void* o, const Incoming& in, Receive*) {
      auto* ord = static_cast<Order*>(o);
      std::uint32_t v;
      std::memcpy(&v, in.payload.data(), sizeof v);
      if (v != ord->next++) ord->ok = false;
    };
    if (!c.set_dispatch(1, {h, &order}).ok()) return 2;
    if (!progress_until(c, [&] { return order.next == kMessages; })) return 3;
    for (int i = 0; i < 20000; ++i) (void)c.advance();  // let the last answers go out
    return order.ok ? 0 : 4;
  };
  CHECK(run_job(2, config, {sender, receiver}) == std::vector<int>{0, 0});
}

namespace {

// Rank 1 registers a region and sends its key; rank 0 PUTs a pattern into
// it, GETs it back into another buffer, checks it and tells rank 1, which
// checks its region too.
int rdma_origin(Client& client) {
  Context& c = client.context(0);
  struct KeyBox {
    RemoteKey key;
    bool have = false;
    bool bad = false;
  } box;
  auto on_key = +[](void* b, const Incoming& in, Receive*) {
    auto* k = static_cast<KeyBox*>(b);
    k->bad = !RemoteKey::from_bytes(in.payload, k->key).ok();
    k->have = true;
  };
  if (!c.set_dispatch(1, {on_key, &box}).ok()) return 2;
  if (!progress_until(c, [&] { return box.have; }) || box.bad) return 3;
  const std::size_t n = box.key.length;
  std::vector<std::uint8_t> src(n + 1), back(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) src[i + 1] = byte_at(i, 42);
  Memory sm, bm;
  if (!client.register_memory(src.data(), src.size(), sm).ok()) return 4;
  if (!client.register_memory(back.data(), back.size(), bm).ok()) return 4;
  int done = 0;
  Callback cb{+[](void* d, Status s) { *static_cast<int*>(d) += s.ok() ? 1 : 1000; }, &done};
  // In pieces of odd sizes and unaligned offsets.
  std::size_t off = 0, pieces = 0;
  for (std::size_t len = 1; off < n; len = len * 3 + 1, ++pieces) {
    const std::size_t l = std::min(len, n - off);
    if (!c.put({.dest = {1, 0}, .local = &sm, .local_offset = off + 1, .remote = box.key,
                .remote_offset = off, .bytes = l, .local_done = cb}).ok())
      return 5;
    off += l;
  }
  if (!progress_until(c, [&] { return done == static_cast<int>(pieces); })) return 6;
  if (!c.get({.dest = {1, 0}, .local = &bm, .local_offset = 1, .remote = box.key, .bytes = n,
              .local_done = cb}).ok())
    return 7;
  if (!progress_until(c, [&] { return done == static_cast<int>(pieces) + 1; })) return 8;
  if (std::memcmp(back.data() + 1, src.data() + 1, n) != 0) return 9;
  if (!c.send({.dest = {1, 0}, .dispatch = 2}).ok()) return 10;
  for (int i = 0; i < 1000; ++i) (void)c.advance();
  return 0;
}

bool g_allocate_target = false;  // set before fork: the target's region comes from allocate_memory()

int rdma_target(Client& client) {
  Context& c = client.context(0);
  const std::size_t n = (3 << 20) + 5;
  std::vector<std::uint8_t> storage(g_allocate_target ? 0 : n, 0);
  Memory m;
  if (g_allocate_target) {
    if (!client.allocate_memory(n, m).ok()) return 2;
  } else if (!client.register_memory(storage.data(), n, m).ok()) {
    return 2;
  }
  const auto* region = static_cast<const std::uint8_t*>(m.address());
  bool finished = false;
  if (!c.set_dispatch(2, {+[](void* f, const Incoming&, Receive*) { *static_cast<bool*>(f) = true; }, &finished}).ok())
    return 3;
  const auto key = m.remote_key().to_bytes();
  if (!c.send({.dest = {0, 0}, .dispatch = 1, .payload = key}).ok()) return 4;
  if (!progress_until(c, [&] { return finished; })) return 5;
  for (std::size_t i = 0; i < n; ++i)
    if (region[i] != byte_at(i, 42)) return 6;
  return 0;
}

}  // namespace

TEST_CASE("two processes: PUT and GET with CMA, with CMA refused (forced), and into allocated memory") {
  for (const bool allocate : {false, true})
    for (const char* cma : {"on", "off"}) {
      CAPTURE(cma);
      CAPTURE(allocate);
      g_allocate_target = allocate;
      const Config config = test::config_with({{"AMI_SHM_CMA", cma}});
      CHECK(run_job(2, config, {rdma_origin, rdma_target}) == std::vector<int>{0, 0});
    }
  g_allocate_target = false;
}

TEST_CASE("four processes exchange with everyone") {
  auto all_to_all = [](Client& client) {
    Context& c = client.context(0);
    struct Got {
      int count = 0;
      std::vector<std::vector<std::uint8_t>> buffers;
    } got;
    got.buffers.reserve(16);
    auto handler = +[](void* g, const Incoming& in, Receive* recv) {
      auto* k = static_cast<Got*>(g);
      if (recv == nullptr) {  // a single packet
        k->count += in.payload.size() == 1000 ? 1 : 100;
        return;
      }
      k->buffers.emplace_back(in.total_bytes);
      recv->buffer = k->buffers.back().data();
      recv->done = {+[](void* kk, Status s) { static_cast<Got*>(kk)->count += s.ok() ? 1 : 100; }, k};
    };
    if (!c.set_dispatch(3, {handler, &got}).ok()) return 2;
    std::vector<std::uint8_t> data(1000, static_cast<std::uint8_t>(client.task()));
    for (std::uint32_t t = 0; t < client.size(); ++t)
      if (t != client.task() && !c.send({.dest = {t, 0}, .dispatch = 3, .payload = std::as_bytes(std::span(data))}).ok())
        return 3;
    if (!progress_until(c, [&] { return got.count >= static_cast<int>(client.size() - 1); })) return 4;
    if (got.count != static_cast<int>(client.size() - 1)) return 6;
    if (c.backend_for({(client.task() + 1) % client.size(), 0}) != "shm") return 5;
    for (int i = 0; i < 5000; ++i) (void)c.advance();
    return 0;
  };
  const auto codes = run_job(4, Config{}, {all_to_all, all_to_all, all_to_all, all_to_all});
  CHECK(codes == std::vector<int>{0, 0, 0, 0});
  for (int c : codes) MESSAGE("exit " << c);
}

TEST_CASE("a peer that exits early does not hang or crash the survivor") {
  // Sends to it are taken (into its ring, which nobody drains) until the
  // survivor sees the process gone; from then on they are refused by name.
  auto leaver = [](Client&) { return 0; };
  auto stayer = [](Client& client) {
    Context& c = client.context(0);
    int reported = 0;
    c.set_error_handler({+[](void* n, Endpoint, Status) { ++*static_cast<int*>(n); }, &reported});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the peer is gone by now
    std::uint64_t v = 1;
    int failed = 0;
    for (int i = 0; i < 200000 && failed == 0; ++i) {
      Status s = c.send_immediate({.dest = {1, 0}, .dispatch = 1, .payload = std::as_bytes(std::span(&v, 1))});
      if (s == StatusCode::peer_failed) ++failed;
      else if (!s.ok() && s != StatusCode::no_resource) return 2;
      (void)c.advance();
    }
    return failed == 1 && reported == 1 ? 0 : 3;
  };
  const auto before = dev_shm();
  CHECK(run_job(2, Config{}, {stayer, leaver}, std::chrono::seconds(30)) == std::vector<int>{0, 0});
  CHECK(dev_shm() == before);
}

namespace {

// The lowest layer, between real processes: shm domains joined by hand
// through pipes, a device draining the parent's ring into a sink.
struct Sink final : ami::device::PacketSink {
  std::vector<std::pair<Endpoint, std::string>> packets;
  std::vector<std::pair<Endpoint, Status>> failed;
  void on_packet(Endpoint origin, std::span<const std::byte> bytes) override {
    packets.emplace_back(origin, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }
  // shm carries no immediates: every packet comes whole.
  void on_compact_packet(Endpoint, std::uint32_t, std::span<const std::byte>) override { ++compact; }
  int compact = 0;
  void on_lane_failed(Endpoint peer, Status why) override { failed.emplace_back(peer, why); }
};

bool write_all(int fd, const void* p, std::size_t n) { return ::write(fd, p, n) == static_cast<ssize_t>(n); }
bool read_all(int fd, void* p, std::size_t n) { return ::read(fd, p, n) == static_cast<ssize_t>(n); }

// Children still running when a test ends early (a failed REQUIRE) are
// killed and reaped; wait() reaps one for the test and forgets it.
struct Children {
  std::vector<pid_t> pids;
  int wait(pid_t pid) {
    int status = -1;
    if (waitpid(pid, &status, 0) == pid) std::erase(pids, pid);
    return status;
  }
  ~Children() {
    for (pid_t p : pids) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
};

// A child of the parent's job of three: joins task 0's ring, does what
// act says with it, and never returns.
template <typename Act>
pid_t child_task(std::uint32_t task, const ami::shm::PeerAddress& parent, int to_parent, Act act) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  ami::device::RegionTable regions(1, task, 4);
  ami::shm::ShmDomain d(task, 3, 1, {.queue_depth = 16, .cell_bytes = 256}, regions);
  const ami::shm::PeerAddress mine{task, static_cast<std::uint32_t>(getpid()), d.segment_fd(), 1};
  if (!d.learn(parent).ok() || !d.map(0).ok() || !write_all(to_parent, &mine, sizeof mine)) _exit(2);
  act(d.peer_queue(0, 0));
  _exit(3);
}

}  // namespace

TEST_CASE("a process killed while holding a cell of a peer's ring: the ring goes on past it") {
  // Task 1 reserves a cell of task 0's ring and is killed before it commits
  // it; task 2's packet, behind that cell, must still arrive, and task 0
  // must hear of task 1's end, which waits for the ring to pass its cells.
  ami::device::RegionTable regions(1, 0, 4);
  ami::shm::ShmDomain d0(0, 3, 1, {.queue_depth = 16, .cell_bytes = 256, .stall_timeout_ms = 200}, regions);
  const ami::shm::PeerAddress parent{0, static_cast<std::uint32_t>(getpid()), d0.segment_fd(), 1};
  int up[2], go[2], go2[2];  // go: to the holder, go2: to the sender
  REQUIRE(pipe(up) == 0);
  REQUIRE(pipe(go) == 0);
  REQUIRE(pipe(go2) == 0);
  Children children;
  const pid_t holder = child_task(1, parent, up[1], [&](ami::device::ReceptionQueue& q) {
    char c = 0;
    if (!read_all(go[0], &c, 1)) _exit(4);
    if (!q.reserve()) _exit(5);
    (void)write_all(up[1], "r", 1);
    kill(getpid(), SIGKILL);  // dies holding the cell
  });
  children.pids.push_back(holder);
  const pid_t sender = child_task(2, parent, up[1], [&](ami::device::ReceptionQueue& q) {
    char c = 0;
    if (!read_all(go2[0], &c, 1)) _exit(4);
    auto r = q.reserve();
    if (!r) _exit(5);
    std::memcpy(r.data(), "behind", 6);
    if (!q.commit(r, 6, {2, 0, 0})) _exit(6);
    (void)write_all(up[1], "c", 1);
    _exit(read_all(go2[0], &c, 1) ? 0 : 7);  // alive until the parent is done
  });
  children.pids.push_back(sender);
  for (int i = 0; i < 2; ++i) {
    ami::shm::PeerAddress a{};
    REQUIRE(read_all(up[0], &a, sizeof a));
    REQUIRE(d0.learn(a).ok());
  }
  ami::shm::ShmDevice device(d0, 0, 16);
  REQUIRE(device.lane({2, 0}) != nullptr);  // none to task 1 yet: one is made (and failed) when its death is seen
  char r = 0;
  REQUIRE(write_all(go[1], "g", 1));
  REQUIRE(read_all(up[0], &r, 1));  // the cell is held
  int status = children.wait(holder);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  REQUIRE(write_all(go2[1], "g", 1));
  REQUIRE(read_all(up[0], &r, 1));  // task 2's packet is behind the held cell

  Sink sink;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sink.packets.empty() && std::chrono::steady_clock::now() < deadline) (void)device.progress(sink, 64);
  REQUIRE(sink.packets.size() == 1);
  CHECK(sink.packets[0].first == Endpoint{2, 0});
  CHECK(sink.compact == 0);
  CHECK(sink.packets[0].second == "behind");
  // A lane to the dead task, made now (as the engine does for a send),
  // fails at once: the ring has passed its cell.
  REQUIRE(device.lane({1, 0}) != nullptr);
  while (sink.failed.empty() && std::chrono::steady_clock::now() < deadline) (void)device.progress(sink, 64);
  REQUIRE(sink.failed.size() == 1);
  CHECK(sink.failed[0].first == Endpoint{1, 0});
  CHECK(sink.failed[0].second == StatusCode::peer_failed);
  CHECK(device.cells_skipped() == 1);
  REQUIRE(write_all(go2[1], "g", 1));
  status = children.wait(sender);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  for (int fd : {up[0], up[1], go[0], go[1], go2[0], go2[1]}) ::close(fd);
}

TEST_CASE("kill -9 of either side leaves nothing in /dev/shm") {
  auto streamer = [](Client& client) {
    Context& c = client.context(0);
    std::uint64_t v = client.task();
    if (!c.set_dispatch(1, {+[](void*, const Incoming&, Receive*) {}, nullptr}).ok()) return 2;
    for (;;) {  // until killed
      (void)c.send_immediate({.dest = {client.task() ^ 1, 0}, .dispatch = 1,
                              .payload = std::as_bytes(std::span(&v, 1))});
      (void)c.advance();
    }
  };
  for (int victim = 0; victim < 2; ++victim) {
    CAPTURE(victim);
    const auto before = dev_shm();
    const auto pids = spawn(2, Config{}, {streamer, streamer});
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    kill(pids[victim], SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill(pids[victim ^ 1], SIGKILL);
    const auto codes = wait_all(pids, std::chrono::seconds(10));
    CHECK(codes == std::vector<int>{-SIGKILL, -SIGKILL});
    CHECK(dev_shm() == before);
  }
}

namespace {

// The acknowledgement stream between two processes: rank 1 sends count
// 8-byte messages with remote-done in bursts of irregular length (every
// 97th a 40 KB message the receiver may stop, every 500th followed by a
// fence) and stops abruptly after the last, without telling rank 0.
// Message i carries i; its remote-done marks answered[i].
struct AckStream {
  static constexpr std::uint32_t kCount = 20011;
  std::vector<int> answered = std::vector<int>(kCount, 0);
  int failed = 0;
  int fences = 0;
  struct Token {
    AckStream* stream;
    std::uint32_t index;
  };
  std::vector<Token> tokens;
};

// Rank 0: takes every message, and acks; reports what it acked once rank 1
// says (by a last message) that every remote-done ran at its side.
int ack_receiver(Client& client) {
  Context& c = client.context(0);
  struct State {
    std::vector<int> seen = std::vector<int>(AckStream::kCount, 0);
    bool bye = false;
    std::vector<std::uint8_t> big;
  } st;
  const Dispatch take{+[](void* p, const Incoming& in, Receive* recv) {
    auto* s = static_cast<State*>(p);
    std::uint32_t i = 0;
    std::memcpy(&i, in.header.data(), sizeof i);
    if (i == ~0u) {
      s->bye = true;
      return;
    }
    if (i < AckStream::kCount) ++s->seen[i];
    if (recv != nullptr) {
      s->big.resize(in.total_bytes);
      recv->buffer = s->big.data();
    }
  }, &st};
  if (!c.set_dispatch(1, take).ok()) return 2;
  if (!progress_until(c, [&] { return st.bye; })) return 3;
  for (int n : st.seen)
    if (n != 1) return 4;  // every message dispatched exactly once
  const AckPeerStats acked = c.ack_stats({1, 0});
  const std::uint64_t wanted = AckStream::kCount + AckStream::kCount / 500;  // messages and fences
  if (acked.messages_acked != wanted || c.stats().messages_acked != wanted) return 5;
  std::printf("acks: %llu messages answered by %llu acks\n",
              static_cast<unsigned long long>(acked.messages_acked),
              static_cast<unsigned long long>(acked.acks_sent));
  if (acked.acks_sent >= acked.messages_acked / 4) return 6;  // coalesced, not one each
  for (int i = 0; i < 1000; ++i) (void)c.advance();
  return 0;
}

int ack_sender(Client& client) {
  Context& c = client.context(0);
  AckStream s;
  s.tokens.reserve(AckStream::kCount);
  std::vector<std::uint8_t> big(40000, 7);
  const std::uint64_t word = 1;
  std::uint32_t next = 0;
  std::uint32_t burst = 1;
  while (next < AckStream::kCount) {
    burst = (burst * 1103515245u + 12345u) >> 8;  // irregular bursts of 1..64
    for (std::uint32_t k = 0, n = 1 + burst % 64; k < n && next < AckStream::kCount; ++k) {
      s.tokens.push_back({&s, next});
      const std::span<const std::byte> payload =
          next % 97 == 0 ? std::as_bytes(std::span(big)) : std::as_bytes(std::span(&word, 1));
      Status st = c.send({.dest = {0, 0}, .dispatch = 1, .header = std::as_bytes(std::span(&next, 1)),
                          .payload = payload,
                          .remote_done = {+[](void* t, Status r) {
                            auto* tok = static_cast<AckStream::Token*>(t);
                            ++tok->stream->answered[tok->index];
                            if (!r.ok()) ++tok->stream->failed;
                          }, &s.tokens.back()}});
      if (st == StatusCode::no_resource) {  // every request waits for an answer
        s.tokens.pop_back();
        break;
      }
      if (!st.ok()) return 2;
      ++next;
      if (next % 500 == 0 &&
          !c.fence({0, 0}, {+[](void* p, Status r) { ++static_cast<AckStream*>(p)->fences; if (!r.ok()) ++static_cast<AckStream*>(p)->failed; }, &s})
               .ok())
        return 3;
    }
    for (std::uint32_t k = 0; k < burst % 8; ++k) (void)c.advance();
  }
  // Stopped: the last answers come in the receiver's lull.
  if (!progress_until(c, [&] { return s.fences == static_cast<int>(AckStream::kCount / 500) &&
                                      std::all_of(s.answered.begin(), s.answered.end(),
                                                  [](int n) { return n >= 1; }); }))
    return 4;
  for (int i = 0; i < 1000; ++i) (void)c.advance();  // nothing more may come
  for (int n : s.answered)
    if (n != 1) return 5;
  if (s.failed != 0) return 6;
  if (c.stats().messages_ack_received != AckStream::kCount + AckStream::kCount / 500) return 7;
  const std::uint32_t bye = ~0u;
  if (!c.send({.dest = {0, 0}, .dispatch = 1, .header = std::as_bytes(std::span(&bye, 1))}).ok()) return 8;
  for (int i = 0; i < 1000; ++i) (void)c.advance();
  return 0;
}

}  // namespace

TEST_CASE("two processes: a stream that stops abruptly is acknowledged exactly once, in few acks") {
  const auto before = dev_shm();
  CHECK(run_job(2, Config{}, {ack_receiver, ack_sender}, std::chrono::seconds(90)) == std::vector<int>{0, 0});
  CHECK(dev_shm() == before);
}

TEST_CASE("two processes: a sender that exits right after its stream leaves the receiver unharmed") {
  // Rank 1 sends 5000 messages with remote-done and exits once the last has
  // left (local done), without waiting for a single answer; rank 0 takes
  // every one, answers into a ring nobody drains any more, sees the peer
  // gone, and exits cleanly.
  auto quitter = [](Client& client) {
    Context& c = client.context(0);
    const std::uint64_t word = 1;
    int posted = 0, left = 0;
    while (posted < 5000) {
      Status s = c.send({.dest = {0, 0}, .dispatch = 1, .payload = std::as_bytes(std::span(&word, 1)),
                         .local_done = {+[](void* n, Status) { ++*static_cast<int*>(n); }, &left},
                         .remote_done = {+[](void*, Status) {}, nullptr}});
      if (s.ok()) ++posted;
      else if (s != StatusCode::no_resource) return 2;
      (void)c.advance();
    }
    return progress_until(c, [&] { return left == 5000; }) ? 0 : 3;
  };
  auto survivor = [](Client& client) {
    Context& c = client.context(0);
    int got = 0, failed = 0;
    if (!c.set_dispatch(1, {+[](void* n, const Incoming&, Receive*) { ++*static_cast<int*>(n); }, &got}).ok())
      return 2;
    c.set_error_handler({+[](void* n, Endpoint, Status) { ++*static_cast<int*>(n); }, &failed});
    if (!progress_until(c, [&] { return got == 5000; })) return 3;
    if (!progress_until(c, [&] { return failed == 1; })) return 4;
    return c.stats().messages_received == 5000 ? 0 : 5;
  };
  const auto before = dev_shm();
  CHECK(run_job(2, Config{}, {survivor, quitter}, std::chrono::seconds(60)) == std::vector<int>{0, 0});
  CHECK(dev_shm() == before);
}

// Peers' segments are mapped on first use: connect() only learns a peer.
namespace {

// The shm line of describe_backends(): "shm: N peer task(s) on this host,
// M segment(s) mapped, ...".
std::string shm_line(const Client& client) {
  const std::string all = client.describe_backends();
  const std::size_t at = all.find("shm: ");
  return at == std::string::npos ? std::string() : all.substr(at, all.find('\n', at) - at);
}

bool says(const std::string& line, const std::string& words) { return line.find(words) != std::string::npos; }

// Posts a packet of these bytes on the lane, as the engine would.
bool post_packet(ami::device::Lane& lane, std::span<const std::byte> bytes, Callback cb = {}) {
  ami::device::Descriptor* d = lane.fifo().try_reserve();
  if (d == nullptr) return false;
  d->kind = ami::device::DescriptorKind::packet;
  d->packet = ami::device::PacketDescriptor{};
  d->packet.inline_len = static_cast<std::uint16_t>(bytes.size());
  std::memcpy(d->packet.inline_data, bytes.data(), bytes.size());
  lane.fifo().commit(cb);
  lane.ring();
  return true;
}

}  // namespace

TEST_CASE("four processes on shm, each talking only to its neighbour, map one peer segment each") {
  // Tasks 0 and 1 talk, and 2 and 3, both ways and from every context: each
  // context sends to the next context of its neighbour, whose segment no
  // context has mapped yet. A message of 100 KB is stopped and fetched by
  // GET, from a peer the receiver mapped when its first packet came.
  constexpr std::uint16_t kContexts = 3;
  constexpr std::size_t kSmall = 1000, kLarge = 100000;
  auto neighbours = [](Client& client) {
    const std::string before = shm_line(client);
    if (!says(before, "3 peer task(s) on this host, 0 segment(s) mapped")) {
      std::fprintf(stderr, "task %u at start: %s\n", client.task(), before.c_str());
      return 2;
    }
    const std::uint32_t neighbour = client.task() ^ 1;
    struct Got {
      int whole = 0;
      int bad = 0;
      std::size_t bytes = 0;
      std::vector<std::vector<std::uint8_t>> buffers;
    } got[kContexts];
    // (Cells of 256 B: the 1000-byte message comes in packets too.)
    auto handler = +[](void* g, const Incoming& in, Receive* recv) {
      auto* k = static_cast<Got*>(g);
      k->bytes += in.total_bytes;
      if (recv == nullptr) {
        ++k->whole;
        return;
      }
      k->buffers.emplace_back(in.total_bytes);
      recv->buffer = k->buffers.back().data();
      recv->done = {+[](void* kk, Status s) { ++(s.ok() ? static_cast<Got*>(kk)->whole : static_cast<Got*>(kk)->bad); }, k};
    };
    for (std::uint16_t c = 0; c < kContexts; ++c) {
      got[c].buffers.reserve(4);
      if (!client.context(c).set_dispatch(3, {handler, &got[c]}).ok()) return 3;
    }
    std::vector<std::uint8_t> small(kSmall, 1), large(kLarge, 2);
    int sent = 0, failed = 0;
    const Callback done{+[](void* n, Status s) { *static_cast<int*>(n) += s.ok() ? 1 : 1000; }, &sent};
    for (std::uint16_t c = 0; c < kContexts; ++c) {
      const Endpoint to{neighbour, static_cast<std::uint16_t>((c + 1) % kContexts)};
      for (const auto* payload : {&small, &large})
        if (!client.context(c).send({.dest = to, .dispatch = 3, .payload = std::as_bytes(std::span(*payload)),
                                     .local_done = done}).ok())
          ++failed;
    }
    if (failed != 0) return 4;
    auto all_in = [&] {
      for (const Got& g : got)
        if (g.whole < 2) return false;
      return sent >= 2 * kContexts;
    };
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!all_in() && std::chrono::steady_clock::now() < end)
      for (std::uint16_t c = 0; c < kContexts; ++c) (void)client.context(c).advance();
    if (!all_in()) return 5;
    for (const Got& g : got)
      if (g.bad != 0 || g.whole != 2 || g.bytes != kSmall + kLarge || sent != 2 * kContexts) return 6;
    // The neighbour's last packets are drained before it goes.
    for (int i = 0; i < 3000; ++i)
      for (std::uint16_t c = 0; c < kContexts; ++c) (void)client.context(c).advance();
    const std::string after = shm_line(client);
    if (!says(after, "3 peer task(s) on this host, 1 segment(s) mapped")) {
      std::fprintf(stderr, "task %u at the end: %s\n", client.task(), after.c_str());
      return 7;
    }
    return 0;
  };
  const Config config = test::config_with({{"AMI_JOB_KEY", make_job_key()}});
  const auto pids = spawn_ranks(4, [&](std::uint32_t r, const std::string& address) {
    ClientOptions o = job(r, 4, address, config);
    o.contexts = kContexts;
    return o;
  }, {neighbours, neighbours, neighbours, neighbours});
  const auto codes = wait_all(pids, std::chrono::seconds(60));
  for (int c : codes) MESSAGE("exit " << c);
  CHECK(codes == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("a ring-copy PUT and GET from an origin the target never sent to: the target maps it and serves") {
  // The key goes from rank 1 to rank 0 through a pipe, so rank 1 has never
  // used rank 0 when the first PUT cell comes. With CMA off, the PUT and
  // the GET travel through the rings and rank 1 answers them.
  int key_pipe[2], done_pipe[2];
  REQUIRE(pipe(key_pipe) == 0);
  REQUIRE(pipe(done_pipe) == 0);
  constexpr std::size_t kBytes = 100003;
  auto origin = [&](Client& client) {
    Context& c = client.context(0);
    std::array<std::byte, RemoteKey::kSerializedSize> bytes{};
    RemoteKey key;
    if (!read_all(key_pipe[0], bytes.data(), bytes.size()) || !RemoteKey::from_bytes(bytes, key).ok()) return 2;
    std::vector<std::uint8_t> src(kBytes), back(kBytes, 0);
    for (std::size_t i = 0; i < kBytes; ++i) src[i] = byte_at(i, 5);
    Memory sm, bm;
    if (!client.register_memory(src.data(), kBytes, sm).ok() || !client.register_memory(back.data(), kBytes, bm).ok())
      return 3;
    int done = 0, bad = 0;
    const Callback cb{+[](void* d, Status s) { *static_cast<int*>(d) += s.ok() ? 1 : 1000; }, &done};
    if (!c.put({.dest = {1, 0}, .local = &sm, .remote = key, .bytes = kBytes, .local_done = cb}).ok()) return 4;
    if (!progress_until(c, [&] { return done != 0; }) || done != 1) return 5;
    if (!c.get({.dest = {1, 0}, .local = &bm, .remote = key, .bytes = kBytes, .local_done = cb}).ok()) return 6;
    if (!progress_until(c, [&] { return done != 1; }) || done != 2) return 7;
    if (std::memcmp(src.data(), back.data(), kBytes) != 0) ++bad;
    if (!says(shm_line(client), "1 segment(s) mapped, ring 256 x 256 B, PUT/GET by ring-copy")) ++bad;
    if (!write_all(done_pipe[1], "d", 1)) return 8;
    return bad == 0 ? 0 : 9;
  };
  auto target = [&](Client& client) {
    Context& c = client.context(0);
    std::vector<std::uint8_t> region(kBytes, 0);
    Memory m;
    if (!client.register_memory(region.data(), kBytes, m).ok()) return 2;
    if (!says(shm_line(client), "0 segment(s) mapped")) return 3;
    const auto key = m.remote_key().to_bytes();
    if (!write_all(key_pipe[1], key.data(), key.size())) return 4;
    pollfd done{done_pipe[0], POLLIN, 0};
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (::poll(&done, 1, 0) == 0 && std::chrono::steady_clock::now() < end)
      for (int i = 0; i < 100; ++i) (void)c.advance();
    if (done.revents == 0) return 5;
    for (std::size_t i = 0; i < kBytes; ++i)
      if (region[i] != byte_at(i, 5)) return 6;
    if (!says(shm_line(client), "1 segment(s) mapped")) return 7;
    return 0;
  };
  const Config config = test::config_with({{"AMI_SHM_CMA", "off"}});
  CHECK(run_job(2, config, {origin, target}) == std::vector<int>{0, 0});
  for (int fd : {key_pipe[0], key_pipe[1], done_pipe[0], done_pipe[1]}) ::close(fd);
}

TEST_CASE("two contexts of one task racing to map the same peer map it once") {
  // Task 1's segment is this process's own; task 0's two contexts make a
  // lane to it at the same moment from two threads, round after round, each
  // round with a fresh domain. Each lane must work: a packet through each
  // arrives in task 1's rings.
  ami::device::RegionTable regions1(1, 1, 4);
  ami::shm::ShmDomain d1(1, 2, 2, {.queue_depth = 16, .cell_bytes = 256}, regions1);
  ami::shm::ShmDevice into0(d1, 0, 16), into1(d1, 1, 16);
  const ami::shm::PeerAddress task1{1, static_cast<std::uint32_t>(getpid()), d1.segment_fd(), 2};
  const std::size_t fds = open_fds();
  for (int round = 0; round < 1000; ++round) {
    CAPTURE(round);
    ami::device::RegionTable regions0(1, 0, 4);
    ami::shm::ShmDomain d0(0, 2, 2, {.queue_depth = 16, .cell_bytes = 256}, regions0);
    REQUIRE(d0.learn(task1).ok());
    ami::shm::ShmDevice a(d0, 0, 16), b(d0, 1, 16);
    std::atomic<int> ready{0};
    ami::device::Lane* lanes[2] = {};
    auto make = [&](ami::shm::ShmDevice& device, int i) {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      lanes[i] = device.lane({1, static_cast<std::uint16_t>(i)});
    };
    std::thread other(make, std::ref(b), 1);
    make(a, 0);
    other.join();
    REQUIRE(lanes[0] != nullptr);
    REQUIRE(lanes[1] != nullptr);
    CHECK(d0.segments_mapped() == 1);
    for (int i = 0; i < 2; ++i) {
      const std::byte word[4] = {std::byte{'l'}, std::byte{'a'}, std::byte{'n'}, std::byte(i)};
      REQUIRE(post_packet(*lanes[i], word));
    }
    Sink s0, s1;
    for (int i = 0; i < 4 && (s0.packets.empty() || s1.packets.empty()); ++i) {
      (void)into0.progress(s0, 8);
      (void)into1.progress(s1, 8);
    }
    REQUIRE(s0.packets.size() == 1);
    REQUIRE(s1.packets.size() == 1);
    CHECK(s0.packets[0].first == Endpoint{0, 0});
    CHECK(s1.packets[0].first == Endpoint{0, 1});
    CHECK(s0.packets[0].second == std::string("lan\0", 4));
    CHECK(s1.packets[0].second == std::string("lan\1", 4));
    CHECK(s0.failed.empty());
    CHECK(s1.failed.empty());
  }
  CHECK(open_fds() == fds);  // every round's segment and pidfd closed with its domain
}

TEST_CASE("a peer that exited before it was first used: its lane fails with the reason, nothing hangs") {
  // The peer is learnt while alive and exits before anything maps it; then
  // a packet is posted to it. The lane is made failed: the packet's
  // callback and the sink hear peer_failed, and no segment is mapped.
  for (const bool reaped : {true, false}) {
    CAPTURE(reaped);
    int up[2];
    REQUIRE(pipe(up) == 0);
    Children children;
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ami::device::RegionTable regions(1, 1, 4);
      ami::shm::ShmDomain d(1, 2, 1, {.queue_depth = 16, .cell_bytes = 256}, regions);
      const ami::shm::PeerAddress mine{1, static_cast<std::uint32_t>(getpid()), d.segment_fd(), 1};
      _exit(write_all(up[1], &mine, sizeof mine) ? 0 : 2);
    }
    children.pids.push_back(pid);
    ami::shm::PeerAddress a{};
    REQUIRE(read_all(up[0], &a, sizeof a));
    ami::device::RegionTable regions(1, 0, 4);
    ami::shm::ShmDomain d0(0, 2, 1, {.queue_depth = 16, .cell_bytes = 256}, regions);
    REQUIRE(d0.learn(a).ok());  // alive and well now
    if (reaped) {
      const int status = children.wait(pid);
      REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    } else {  // a zombie: gone, but its pid still names it
      siginfo_t info{};
      REQUIRE(waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) == 0);
    }
    ami::shm::ShmDevice device(d0, 0, 16);
    CHECK(device.can_reach({1, 0}));
    ami::device::Lane* lane = device.lane({1, 0});
    REQUIRE(lane != nullptr);
    CHECK(lane->max_packet() > 0);
    struct Heard {
      Status status;
      int calls = 0;
    } heard;
    const std::byte word[4] = {};
    REQUIRE(post_packet(*lane, word, {+[](void* h, Status s) {
      static_cast<Heard*>(h)->status = s;
      ++static_cast<Heard*>(h)->calls;
    }, &heard}));
    Sink sink;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (sink.failed.empty() && std::chrono::steady_clock::now() < deadline) (void)device.progress(sink, 64);
    REQUIRE(sink.failed.size() == 1);
    CHECK(sink.failed[0].first == Endpoint{1, 0});
    CHECK(sink.failed[0].second == StatusCode::peer_failed);
    CHECK(std::string(sink.failed[0].second.what()) == "shm: the peer process exited before its segment was mapped");
    CHECK(heard.calls == 1);
    CHECK(heard.status == StatusCode::peer_failed);
    CHECK(d0.segments_mapped() == 0);
    for (int i = 0; i < 100; ++i) (void)device.progress(sink, 64);
    CHECK(sink.failed.size() == 1);  // once
    ::close(up[0]);
    ::close(up[1]);
  }
}
