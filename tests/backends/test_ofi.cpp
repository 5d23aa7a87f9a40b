// The libfabric backend's own parts: what refuses a provider, and how.
// (Everything else it does runs in the conformance suite, test_backends, on
// tcp;ofi_rxm and shm here and on verbs;ofi_rxm in the rxe VM.)
#include <doctest/doctest.h>

#include <fcntl.h>
#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ami/ami.hpp"
#include "ami/device/device.hpp"
#include "ofi_device.hpp"
#include "ofi_fabric.hpp"
#include "pair.hpp"

namespace {

struct FreeInfo {
  void operator()(fi_info* i) const { fi_freeinfo(i); }
};

bool has(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a provider's entry that lacks what ami needs: each lack is named") {
  std::unique_ptr<fi_info, FreeInfo> info(fi_allocinfo());
  REQUIRE(info != nullptr);
  info->caps = FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  info->mode = FI_CONTEXT | FI_MSG_PREFIX;
  info->tx_attr->msg_order = 0;
  info->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_RAW;
  info->domain_attr->cq_data_size = 0;
  info->domain_attr->mr_key_size = 16;
  const std::string lacks = ami::ofi::missing_needs(*info);
  INFO(lacks);
  CHECK(has(lacks, "FI_MULTI_RECV"));
  CHECK(!has(lacks, "FI_RMA"));           // it has that
  CHECK(has(lacks, "FI_MSG_PREFIX"));     // a mode ami does not give
  CHECK(!has(lacks, "FI_CONTEXT,"));      // one it gives
  CHECK(has(lacks, "FI_ORDER_SAS"));
  CHECK(has(lacks, "FI_MR_RAW"));
  CHECK(has(lacks, "CQ data"));
  CHECK(has(lacks, "at most 8 bytes"));

  // What meets every need has nothing named.
  info->caps |= FI_MULTI_RECV;
  info->mode = FI_CONTEXT;
  info->tx_attr->msg_order = FI_ORDER_SAS;
  info->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_LOCAL;
  info->domain_attr->cq_data_size = 8;
  info->domain_attr->mr_key_size = 8;
  CHECK(ami::ofi::missing_needs(*info) == "something fi_getinfo does not say");
}

TEST_CASE("AMI_BACKENDS naming ofi with a provider this host lacks stops the client, naming the provider") {
  ami::Config c = test::config_with({{"AMI_BACKENDS", "self,ofi"}, {"AMI_OFI_PROVIDER", "no-such-provider"}});
  try {
    ami::Client client(ami::ClientOptions{.name = "test", .contexts = 1, .job = {}, .config = c});
    FAIL("the client was made");
  } catch (const ami::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(has(what, "ofi"));
    CHECK(has(what, "no-such-provider"));
    CHECK(has(what, "not on this host"));
  }
}

TEST_CASE("the provider in use, its limits and registration modes are described") {
  ami::Config c = test::config_with({{"AMI_OFI_PROVIDER", "tcp;ofi_rxm"}});
  const ami::ofi::OfiOptions o = ami::ofi::OfiOptions::from(c);
  ami::ofi::OfiFabric fabric(0, 2, 1, o, 3);
  const std::string d = fabric.describe();
  INFO(d);
  CHECK(has(d, "provider tcp;ofi_rxm"));
  CHECK(has(d, "inject"));
  CHECK(has(d, "largest message"));
  CHECK(has(d, "mr_mode ["));
  CHECK(has(d, "fence by message"));  // rxm keeps the order ami's fence message needs
  CHECK(fabric.facts().ordered);
  // A packet, its sequence header included, fills rxm's eager size
  // (FI_OFI_RXM_BUFFER_SIZE, which ami sets, unless the user did, to 16 KiB
  // of message and the headers), no more.
  const char* eager = std::getenv("FI_OFI_RXM_BUFFER_SIZE");
  REQUIRE(eager != nullptr);
  CHECK(fabric.max_packet() + ami::ofi::kHeaderBytes == std::strtoull(eager, nullptr, 10));
  if (std::string_view(eager) == std::to_string(16384 + ami::ofi::kHeadroom + ami::ofi::kHeaderBytes))
    CHECK(fabric.max_packet() - ami::ofi::kHeadroom == ami::ofi::kRxmPacketBytes);  // a power of two of message
  CHECK(has(d, "receives reordered by sequence"));  // rxm completes a large message late
  // The address entry: the provider, then one endpoint name per context.
  CHECK(ami::ofi::OfiFabric::provider_of(fabric.local_address()) == "tcp;ofi_rxm");
  std::vector<std::byte> cut = fabric.local_address();
  cut.pop_back();
  CHECK(ami::ofi::OfiFabric::provider_of(cut).empty());  // truncated: refused
}

TEST_CASE("receive buffers: auto spans 2 packets on shm, 1 MiB elsewhere; a size set is kept, and described") {
  struct Case {
    const char* provider;
    const char* size;  // AMI_OFI_RECV_BUFFER_SIZE
    std::uint64_t expected;
  };
  for (const Case& k : {Case{"shm", "auto", 2 * 65536}, Case{"tcp;ofi_rxm", "auto", 1 << 20},
                        Case{"shm", "2097152", 2 << 20}, Case{"tcp;ofi_rxm", "262144", 256 << 10}}) {
    CAPTURE(k.provider);
    CAPTURE(k.size);
    ami::Config c = test::config_with({{"AMI_OFI_PROVIDER", k.provider}, {"AMI_OFI_RECV_BUFFER_SIZE", k.size}});
    ami::ofi::OfiFabric fabric(0, 2, 1, ami::ofi::OfiOptions::from(c), 3);
    CHECK(fabric.recv_buffer_bytes() == k.expected);
    CHECK(fabric.recv_buffer_bytes() >= 2 * std::uint64_t{fabric.max_packet() - ami::ofi::kHeadroom});
    CHECK(has(fabric.describe(), ("receive buffers 4 x " + std::to_string(k.expected)).c_str()));
    // The memory the client is told the backend takes is at least that.
    CHECK(ami::ofi::OfiFabric::recv_buffer_bytes_bound(ami::ofi::OfiOptions::from(c)) >= k.expected);
  }
  // Fewer than 2 packets a buffer: refused, naming both settings.
  ami::Config c = test::config_with({{"AMI_OFI_PROVIDER", "shm"}, {"AMI_OFI_RECV_BUFFER_SIZE", "65536"}});
  CHECK_THROWS_WITH_AS(ami::ofi::OfiFabric(0, 2, 1, ami::ofi::OfiOptions::from(c), 3),
                       doctest::Contains("AMI_OFI_RECV_BUFFER_SIZE holds fewer than 2 packets"), ami::Error);
}

TEST_CASE("many contexts a side: every context reaches every context of the peer (names of several lengths)") {
  // shm's endpoint names are strings that grow with the process's endpoint
  // count: twelve contexts a side give names of two lengths.
  constexpr std::uint16_t kContexts = 12;
  for (const char* provider : {"shm", "tcp;ofi_rxm"}) {
    CAPTURE(std::string(provider));
    test::JobPair pair(test::config_with({{"AMI_OFI_PROVIDER", provider}}), "self,ofi", kContexts);
    struct Seen {
      int messages = 0;
      std::vector<ami::Endpoint> from;
    };
    std::vector<Seen> seen_a(kContexts), seen_b(kContexts);
    for (std::uint16_t i = 0; i < kContexts; ++i) {
      for (auto [client, seen] : {std::pair{&pair.client_a(), &seen_a[i]}, std::pair{&pair.client_b(), &seen_b[i]}})
        REQUIRE(client->context(i).set_dispatch(7, {+[](void* c, const ami::Incoming& in, ami::Receive*) {
          auto* s = static_cast<Seen*>(c);
          ++s->messages;
          s->from.push_back(in.origin);
        }, seen}).ok());
    }
    const std::byte payload[5] = {};
    for (std::uint16_t i = 0; i < kContexts; ++i)
      for (std::uint16_t j = 0; j < kContexts; ++j) {
        REQUIRE(pair.client_a().context(i).send({.dest = {1, j}, .dispatch = 7, .payload = payload}).ok());
        REQUIRE(pair.client_b().context(i).send({.dest = {0, j}, .dispatch = 7, .payload = payload}).ok());
      }
    auto all = [&] {
      for (std::uint16_t i = 0; i < kContexts; ++i)
        if (seen_a[i].messages != kContexts || seen_b[i].messages != kContexts) return false;
      return true;
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!all() && std::chrono::steady_clock::now() < deadline)
      for (std::uint16_t i = 0; i < kContexts; ++i) {
        (void)pair.client_a().context(i).advance();
        (void)pair.client_b().context(i).advance();
      }
    REQUIRE(all());
    for (std::uint16_t j = 0; j < kContexts; ++j)
      for (std::uint16_t i = 0; i < kContexts; ++i) {
        CHECK(seen_b[j].from[i].task == 0);
        CHECK(seen_a[j].from[i].task == 1);
      }
  }
}

TEST_CASE("shm: a segment a dead process left under this process's pid does not stop the provider") {
  // libfabric's shm names a segment "<pid>:<uid>:<endpoint count>"; a task
  // killed with -9 leaves its segments, and a later process given the same
  // pid finds them. Leave such segments (zeroed: not of this libfabric) for
  // every count this process may reach next, then start a pair on shm.
  struct Left {
    std::vector<std::string> names;
    ~Left() {
      for (const std::string& name : names) shm_unlink(name.c_str());  // those no endpoint took over
    }
  } left;
  for (int k = 0; k < 256; ++k) {
    const std::string name =
        std::to_string(getpid()) + ":" + std::to_string(getuid()) + ":" + std::to_string(k);
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, S_IRUSR | S_IWUSR);
    if (fd < 0) continue;  // a live endpoint of this process
    REQUIRE(ftruncate(fd, 4096) == 0);
    close(fd);
    left.names.push_back(name);
  }
  REQUIRE(!left.names.empty());
  {
    test::JobPair pair(test::config_with({{"AMI_OFI_PROVIDER", "shm"}}), "self,ofi", 1);
    int seen = 0;
    for (ami::Client* client : {&pair.client_a(), &pair.client_b()})
      REQUIRE(client->context(0).set_dispatch(7, {+[](void* c, const ami::Incoming&, ami::Receive*) {
        ++*static_cast<int*>(c);
      }, &seen}).ok());
    const std::byte payload[5] = {};
    REQUIRE(pair.client_a().context(0).send({.dest = {1, 0}, .dispatch = 7, .payload = payload}).ok());
    REQUIRE(pair.client_b().context(0).send({.dest = {0, 0}, .dispatch = 7, .payload = payload}).ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (seen < 2 && std::chrono::steady_clock::now() < deadline) {
      (void)pair.client_a().context(0).advance();
      (void)pair.client_b().context(0).advance();
    }
    CHECK(seen == 2);
  }
}

namespace {
// Messages whose payload starts with their index (a uint32_t), counted as
// they arrive on one dispatch, with those that came out of order.
struct InOrder {
  std::uint32_t count = 0;
  std::uint32_t out_of_order = 0;
  ami::Status listen(ami::Context& c, std::uint16_t dispatch) {
    return c.set_dispatch(dispatch, {+[](void* self, const ami::Incoming& in, ami::Receive*) {
      auto* s = static_cast<InOrder*>(self);
      std::uint32_t index = 0;
      std::memcpy(&index, in.payload.data(), sizeof index);
      if (index != s->count) ++s->out_of_order;
      ++s->count;
    }, this});
  }
};
}  // namespace

TEST_CASE("shm: a receiver that falls behind a sender injecting into two small buffers gets every message, in order") {
  // The receiver stops now and then while the sender, on its own thread,
  // fills shm's command queue: the receiver's next progress fills both
  // buffers and leaves the rest unexpected, each holding one of the receive
  // entries a buffer needs to be posted again.
  test::JobPair pair(test::config_with({{"AMI_OFI_PROVIDER", "shm"}, {"AMI_OFI_PACKET_SIZE", "4096"},
                                        {"AMI_OFI_RECV_BUFFER_SIZE", "65536"}, {"AMI_OFI_RECV_BUFFERS", "2"}}),
                     "self,ofi", 1);
  constexpr std::uint32_t kMessages = 20000;
  InOrder seen;
  REQUIRE(seen.listen(pair.b(), 7).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    // Payloads in a ring as deep as what may be in flight: a send may read
    // its payload until it leaves, and the FIFO holds at most 256.
    std::vector<std::vector<std::byte>> payloads(4096, std::vector<std::byte>(2048));
    for (std::uint32_t sent = 0; sent < kMessages && !stop;) {
      std::vector<std::byte>& payload = payloads[sent % payloads.size()];
      std::memcpy(payload.data(), &sent, sizeof sent);
      if (pair.a().send({.dest = pair.to_b(), .dispatch = 7, .payload = payload}).ok()) ++sent;
      (void)pair.a().advance();
    }
    while (!stop) (void)pair.a().advance();
  });
  for (std::uint32_t pauses = 0; seen.count < kMessages && std::chrono::steady_clock::now() < deadline;) {
    (void)pair.b().advance();
    if (seen.count / 2000 > pauses) {
      ++pauses;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  stop = true;
  sender.join();
  CHECK(seen.count == kMessages);
  CHECK(seen.out_of_order == 0);
}

TEST_CASE("a completion queue of the least entries overflows and loses nothing: every message and callback, in order") {
  // The receiver advances only when the sender can send no more: its
  // provider's command queue (shm) or socket (tcp) is full, and the
  // receiver's next progress can move more than the queue's 64 entries
  // into it (shm's moves every queued command at once); every send asks
  // for a completion too (local_done). What does not fit waits in the
  // provider's overflow list.
  for (const char* provider : {"shm", "tcp;ofi_rxm"}) {
    CAPTURE(std::string(provider));
    test::JobPair pair(test::config_with({{"AMI_OFI_PROVIDER", provider}, {"AMI_OFI_CQ_SIZE", "64"},
                                          {"AMI_OFI_BUNDLE", "1"}}),
                       "self,ofi", 1);
    constexpr std::uint32_t kMessages = 5000;
    InOrder seen;
    REQUIRE(seen.listen(pair.b(), 7).ok());
    std::uint32_t done = 0;
    std::vector<std::array<std::byte, 64>> payloads(kMessages);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::uint32_t sent = 0;
    while ((seen.count < kMessages || done < kMessages) && std::chrono::steady_clock::now() < deadline) {
      while (sent < kMessages) {
        std::memcpy(payloads[sent].data(), &sent, sizeof sent);
        const ami::Status s = pair.a().send({.dest = pair.to_b(), .dispatch = 7, .payload = payloads[sent],
                                             .local_done = {+[](void* c, ami::Status st) {
                                               if (st.ok()) ++*static_cast<std::uint32_t*>(c);
                                             }, &done}});
        if (!s.ok()) {
          REQUIRE(s.code() == ami::StatusCode::no_resource);
          break;
        }
        ++sent;
        (void)pair.a().advance();
      }
      (void)pair.b().advance();
      (void)pair.a().advance();
    }
    CHECK(seen.count == kMessages);
    CHECK(seen.out_of_order == 0);
    CHECK(done == kMessages);
  }
}

// ---- the device itself: two tasks of a job of two in this process ---------

namespace {

using ami::Callback;
using ami::Endpoint;
using ami::Status;
using ami::device::Descriptor;
using ami::device::DescriptorKind;
using ami::device::Lane;
using ami::ofi::OfiDevice;
using ami::ofi::OfiFabric;
using ami::ofi::OfiOptions;

struct Sink final : ami::device::PacketSink {
  std::vector<std::vector<std::byte>> packets;
  void on_packet(Endpoint, std::span<const std::byte> bytes) override { packets.emplace_back(bytes.begin(), bytes.end()); }
  void on_compact_packet(Endpoint, std::uint32_t, std::span<const std::byte> rest) override {
    packets.emplace_back(rest.begin(), rest.end());
  }
  int failed = 0;
  void on_lane_failed(Endpoint, Status) override { ++failed; }
};

std::byte pattern(std::size_t i, unsigned seed) { return static_cast<std::byte>((i * 131u + seed * 7u + 1u) & 0xFF); }

// A packet of inline bytes and payload, each filled from seed; committed
// and rung, as the engine does for each.
void post_packet(Lane& lane, std::size_t inline_len, std::span<const std::byte> payload, unsigned seed,
                 Callback cb = {}) {
  Descriptor* d = lane.fifo().try_reserve();
  REQUIRE(d != nullptr);
  d->kind = DescriptorKind::packet;
  d->packet.compact_prefix = 0;
  d->packet.immediate = 0;
  d->packet.inline_len = static_cast<std::uint16_t>(inline_len);
  for (std::size_t i = 0; i < inline_len; ++i) d->packet.inline_data[i] = pattern(i, seed);
  d->packet.payload = payload.data();
  d->packet.payload_len = static_cast<std::uint32_t>(payload.size());
  d->packet.payload_keyed = false;
  d->packet.await_delivery = false;
  lane.fifo().commit(cb);
  lane.ring();
}

struct DevicePair {
  explicit DevicePair(const char* provider, std::uint32_t bundle) {
    OfiFabric::set_universe(2);
    OfiOptions o;
    o.provider = provider;
    o.packet_bytes = 8192;
    o.bundle = bundle;
    for (std::uint32_t t = 0; t < 2; ++t) fabric[t] = std::make_unique<OfiFabric>(t, 2, 1, o, 3);
    for (std::uint32_t t = 0; t < 2; ++t) {
      const Status s = fabric[t]->connect(1 - t, fabric[1 - t]->local_address());
      REQUIRE_MESSAGE(s.ok(), ami::to_string(s));
    }
    for (std::uint32_t t = 0; t < 2; ++t) device[t] = std::make_unique<OfiDevice>(*fabric[t], 0, 64);
    lane = device[0]->lane({1, 0});
    REQUIRE(lane != nullptr);
    // One packet there first, its burst ended: a provider may say
    // -FI_EAGAIN until it reaches the peer (rxm connects on the first send).
    post_packet(*lane, 16, {}, 0);
    device[0]->flush();
    REQUIRE(run_until([&] { return sink[1].packets.size() == 1; }));
    sink[1].packets.clear();
  }
  ~DevicePair() {
    for (auto& d : device) d.reset();
  }
  void advance() {
    for (int t = 0; t < 2; ++t) (void)device[t]->progress(sink[t], 64);
    lane->fifo().complete();
  }
  template <typename Done>
  bool run_until(Done done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      advance();
    }
    return true;
  }
  std::unique_ptr<OfiFabric> fabric[2];
  std::unique_ptr<OfiDevice> device[2];
  Sink sink[2];
  Lane* lane = nullptr;
};

}  // namespace

TEST_CASE("bundles: a burst's small packets go together, in order and whole; the first and large ones alone") {
  for (const char* provider : {"shm", "tcp;ofi_rxm"}) {
    CAPTURE(std::string(provider));
    DevicePair p(provider, 8);
    auto* lane = static_cast<ami::ofi::OfiLane*>(p.lane);
    const std::uint64_t base = lane->posted();
    const OfiDevice::Counters& sent = p.device[0]->counters();
    const OfiDevice::Counters& got = p.device[1]->counters();

    // Small payloads join bundles; a packet of which two do not fit in one
    // (8 KiB packets; 4 KiB on shm, its inject size) goes alone.
    std::vector<std::byte> small(200), large(5000);
    for (std::size_t i = 0; i < small.size(); ++i) small[i] = pattern(i, 99);
    for (std::size_t i = 0; i < large.size(); ++i) large[i] = pattern(i, 98);
    constexpr std::size_t kPackets = 30;
    auto inline_len = [](std::size_t k) { return 16 + k % 5; };
    auto payload = [&](std::size_t k) -> std::span<const std::byte> {
      if (k == 12 || k == 20) return large;
      return k % 3 == 0 ? std::span<const std::byte>(small) : std::span<const std::byte>{};
    };
    int done[2] = {0, 0};  // callbacks: succeeded, failed
    const Callback cb{+[](void* c, Status s) { ++static_cast<int*>(c)[s.ok() ? 0 : 1]; }, done};
    int callbacks = 0;
    auto post = [&](std::size_t k) {
      const bool with = k < 9 || k % 2 == 0;
      callbacks += with ? 1 : 0;
      post_packet(*p.lane, inline_len(k), payload(k), unsigned(k), with ? cb : Callback{});
    };
    // The burst's first packet leaves in its ring(); the next ones wait
    // for a bundle's worth (8), then go as one.
    post(0);
    CHECK(lane->posted() == base + 1);
    for (std::size_t k = 1; k < 8; ++k) post(k);
    CHECK(lane->posted() == base + 1);
    post(8);
    CHECK(lane->posted() == base + 9);
    // A packet no bundle takes (12, 20) is not held: it goes at once, and
    // what waits goes before it. So 9-11 go with 12 (alone), 13-19 with 20,
    // 21-28 when eight are ready, and 29 alone at the end of the advance.
    for (std::size_t k = 9; k < 12; ++k) post(k);
    CHECK(lane->posted() == base + 9);
    post(12);
    CHECK(lane->posted() == base + 13);
    for (std::size_t k = 13; k < kPackets; ++k) post(k);
    CHECK(lane->posted() == base + 29);
    p.device[0]->flush();
    CHECK(lane->posted() == base + kPackets);
    REQUIRE(p.run_until([&] { return p.sink[1].packets.size() >= kPackets && done[0] + done[1] == callbacks; }));
    CHECK(done[1] == 0);
    CHECK(sent.bundles_sent == 4);
    CHECK(sent.bundled == kPackets - 4);
    CHECK(got.bundles_received == 4);
    CHECK(got.dropped == 0);
    REQUIRE(p.sink[1].packets.size() == kPackets);
    for (std::size_t k = 0; k < kPackets; ++k) {
      CAPTURE(k);
      const std::vector<std::byte>& bytes = p.sink[1].packets[k];
      REQUIRE(bytes.size() == inline_len(k) + payload(k).size());
      bool same = payload(k).empty() ||
                  std::memcmp(bytes.data() + inline_len(k), payload(k).data(), payload(k).size()) == 0;
      for (std::size_t i = 0; i < inline_len(k); ++i) same = same && bytes[i] == pattern(i, unsigned(k));
      CHECK(same);
    }
  }
}

TEST_CASE("bundles: AMI_OFI_BUNDLE=1 sends every packet on its own, at once") {
  DevicePair p("shm", 1);
  auto* lane = static_cast<ami::ofi::OfiLane*>(p.lane);
  const std::uint64_t base = lane->posted();
  for (std::size_t k = 0; k < 20; ++k) {
    post_packet(*p.lane, 16, {}, unsigned(k));
    CHECK(lane->posted() == base + k + 1);
  }
  REQUIRE(p.run_until([&] { return p.sink[1].packets.size() == 20; }));
  CHECK(p.device[0]->counters().bundles_sent == 0);
  CHECK(p.device[1]->counters().bundles_received == 0);
}

TEST_CASE("bundles: a malformed bundle delivers the packets before the fault and drops the rest, counted") {
  // shm keeps each origin's order: its packets carry no sequence header,
  // so a bundle written here needs none.
  DevicePair p("shm", 8);
  ami::ofi::ContextEndpoint& ep = p.fabric[0]->endpoint(0);
  const fi_addr_t to = ep.peers[1][0];
  const std::uint64_t origin = ami::ofi::origin_word(0, 0);
  auto send_raw = [&](std::vector<std::byte> bytes, std::uint64_t flags) {
    iovec iov{bytes.data(), bytes.size()};
    void* desc = nullptr;
    const fi_msg msg{.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = to, .context = nullptr,
                     .data = origin | flags};
    ssize_t rc;
    do {
      rc = fi_sendmsg(ep.ep.get(), &msg, FI_REMOTE_CQ_DATA | FI_INJECT);
      p.advance();
    } while (rc == -FI_EAGAIN);
    REQUIRE(rc == 0);
  };
  auto entry = [](std::vector<std::byte>& out, std::uint32_t length, std::size_t bytes) {
    const auto* l = reinterpret_cast<const std::byte*>(&length);
    out.insert(out.end(), l, l + 4);
    out.insert(out.end(), bytes, std::byte{0x5A});
  };
  std::vector<std::byte> overrun, zero, tail;
  entry(overrun, 3, 3);
  entry(overrun, 1000, 10);  // says 1000, has 10
  entry(zero, 2, 2);
  entry(zero, 0, 0);
  entry(tail, 4, 4);
  tail.push_back(std::byte{1});  // a length cut short
  send_raw(overrun, ami::ofi::kBundle);
  send_raw(zero, ami::ofi::kBundle);
  send_raw(tail, ami::ofi::kBundle);
  send_raw({}, ami::ofi::kBundle);                                    // empty
  send_raw(std::vector<std::byte>(8), ami::ofi::kBundle | ami::ofi::kCompact);  // both forms at once
  const OfiDevice::Counters& got = p.device[1]->counters();
  REQUIRE(p.run_until([&] { return got.dropped == 5; }));
  REQUIRE(p.sink[1].packets.size() == 3);
  CHECK(p.sink[1].packets[0].size() == 3);
  CHECK(p.sink[1].packets[1].size() == 2);
  CHECK(p.sink[1].packets[2].size() == 4);
  CHECK(p.sink[1].failed == 0);
}
