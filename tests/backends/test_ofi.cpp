// The libfabric backend's own parts: what refuses a provider, and how.
// (Everything else it does runs in the conformance suite, test_backends, on
// tcp;ofi_rxm and shm here and on verbs;ofi_rxm in the rxe VM.)
#include <doctest/doctest.h>

#include <fcntl.h>
#include <rdma/fabric.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <string>
#include <thread>
#include <vector>

#include "ami/ami.hpp"
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
  // (FI_OFI_RXM_BUFFER_SIZE, 16 KiB unless set), no more.
  if (std::getenv("FI_OFI_RXM_BUFFER_SIZE") == nullptr)
    CHECK(fabric.max_packet() + ami::ofi::kHeaderBytes == 16384);
  CHECK(has(d, "receives reordered by sequence"));  // rxm completes a large message late
  // The address entry: the provider, then one endpoint name per context.
  CHECK(ami::ofi::OfiFabric::provider_of(fabric.local_address()) == "tcp;ofi_rxm");
  std::vector<std::byte> cut = fabric.local_address();
  cut.pop_back();
  CHECK(ami::ofi::OfiFabric::provider_of(cut).empty());  // truncated: refused
}

TEST_CASE("many contexts a side: every context reaches every context of the peer (names of several lengths)") {
  // shm's endpoint names are strings that grow with the process's endpoint
  // count: twelve contexts a side give names of two lengths.
  constexpr std::uint16_t kContexts = 12;
  for (const char* provider : {"shm", "tcp;ofi_rxm"}) {
    CAPTURE(provider);
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

TEST_CASE("shm: a receiver that falls behind a sender injecting into two small buffers gets every message, in order") {
  // The receiver stops now and then while the sender, on its own thread,
  // fills shm's command queue: the receiver's next progress fills both
  // buffers and leaves the rest unexpected, each holding one of the receive
  // entries a buffer needs to be posted again.
  test::JobPair pair(test::config_with({{"AMI_OFI_PROVIDER", "shm"}, {"AMI_OFI_PACKET_SIZE", "4096"},
                                        {"AMI_OFI_RECV_BUFFER_SIZE", "65536"}, {"AMI_OFI_RECV_BUFFERS", "2"}}),
                     "self,ofi", 1);
  constexpr std::uint32_t kMessages = 20000;
  struct Seen {
    std::uint32_t count = 0;
    std::uint32_t out_of_order = 0;
  } seen;
  REQUIRE(pair.b().set_dispatch(7, {+[](void* c, const ami::Incoming& in, ami::Receive*) {
    auto* s = static_cast<Seen*>(c);
    std::uint32_t index = 0;
    std::memcpy(&index, in.payload.data(), sizeof index);
    if (index != s->count) ++s->out_of_order;
    ++s->count;
  }, &seen}).ok());
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
