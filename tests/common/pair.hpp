// pair.hpp — two contexts that talk through one backend, for the tests that
// every backend must pass (TEST_CASE_TEMPLATE over the pair types).
//
// SelfPair: two contexts of one Client (self backend). ShmPair, VerbsPair:
// two Clients of a job of two in this process, reaching each other by shm or
// by verbs.
#pragma once

#include <doctest/doctest.h>

#include <utility>  // before Asio: 1.74 uses std::exchange without it

#include <boost/asio.hpp>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "ami/ami.hpp"
#include "ports.hpp"

namespace test {

inline ami::Config config_with(std::initializer_list<std::pair<const char*, std::string>> values) {
  ami::Config c;
  for (auto& [k, v] : values) REQUIRE(c.set(k, v).ok());
  return c;
}

struct SelfPair {
  static constexpr const char* kBackend = "self";
  // What a PUT or GET with a key the target refuses (a stale one) ends with.
  static constexpr ami::StatusCode kRefusedKey = ami::StatusCode::remote_access;
  static constexpr bool kOrdered = true;  // its lanes deliver in order: a fence is a message
  explicit SelfPair(const ami::Config& config)
      : client_(ami::ClientOptions{.name = "test", .contexts = 2, .job = {}, .config = config}) {}

  ami::Client& client_a() { return client_; }
  ami::Client& client_b() { return client_; }
  ami::Context& a() { return client_.context(0); }
  ami::Context& b() { return client_.context(1); }
  ami::Endpoint to_a() const { return {0, 0}; }
  ami::Endpoint to_b() const { return {0, 1}; }

 private:
  ami::Client client_;
};

// Two Clients of a job of two, bootstrapped over loopback TCP inside this
// process, limited to the given backends (AMI_BACKENDS).
class JobPair {
 public:
  JobPair(const ami::Config& config, const char* backends, std::uint16_t contexts = 1) {
    ami::Config c = config;
    REQUIRE(c.set("AMI_BACKENDS", backends).ok());
    const std::string address = "127.0.0.1:" + std::to_string(free_port());
    auto options = [&](std::uint32_t rank) {
      return ami::ClientOptions{.name = "test", .contexts = contexts,
                                .job = {.rank = rank, .size = 2, .bootstrap = address},
                                .config = c};
    };
    std::exception_ptr error;
    std::thread peer([&] {
      try {
        b_ = std::make_unique<ami::Client>(options(1));
      } catch (...) {
        error = std::current_exception();
      }
    });
    try {
      a_ = std::make_unique<ami::Client>(options(0));
    } catch (...) {
      peer.join();
      throw;
    }
    peer.join();
    if (error) std::rethrow_exception(error);
  }
  ami::Client& client_a() { return *a_; }
  ami::Client& client_b() { return *b_; }
  ami::Context& a() { return a_->context(0); }
  ami::Context& b() { return b_->context(0); }
  ami::Endpoint to_a() const { return {0, 0}; }
  ami::Endpoint to_b() const { return {1, 0}; }

 private:
  std::unique_ptr<ami::Client> a_, b_;
};

// The shm backend for real (each Client's memfd segment mapped by the
// other: rings, CMA), driven from one thread.
struct ShmPair : JobPair {
  static constexpr const char* kBackend = "shm";
  static constexpr ami::StatusCode kRefusedKey = ami::StatusCode::remote_access;
  static constexpr bool kOrdered = true;
  explicit ShmPair(const ami::Config& config) : JobPair(config, "self,shm") {}
};

// The verbs backend for real: RC queue pairs on the RDMA port, connected by
// rdma_cm or the address exchange as configured. Needs an active port.
struct VerbsPair : JobPair {
  static constexpr const char* kBackend = "verbs";
  static constexpr ami::StatusCode kRefusedKey = ami::StatusCode::remote_access;
  static constexpr bool kOrdered = true;
  explicit VerbsPair(const ami::Config& config) : JobPair(with_packets(config), "self,verbs") {}

  // The suite's message sizes are chosen to span several packets: the
  // 8 KiB packets of a NIC, unless the case sets its own (soft-RoCE's
  // default, 128 KiB, would carry most of them whole).
  static ami::Config with_packets(ami::Config c) {
    if (c.origin(ami::ParamName::lookup("AMI_VERBS_BOUNCE_SIZE")) == "default") REQUIRE(c.set("AMI_VERBS_BOUNCE_SIZE", "8192").ok());
    return c;
  }
};

// The libfabric backend for real, on one provider (AMI_OFI_PROVIDER, unless
// the case sets its own): tcp;ofi_rxm and shm run on any host.
template <const char* Provider, bool Ordered, bool RefusesKeys>
struct OfiPair : JobPair {
  static constexpr const char* kBackend = "ofi";
  static constexpr const char* kProvider = Provider;
  static constexpr bool kOrdered = Ordered;  // the provider's transmit order covers PUTs
  // A provider that drops a PUT or GET its target refuses, without an
  // error, ends it by ami's stall watch (AMI_OFI_TIMEOUT, short here).
  static constexpr ami::StatusCode kRefusedKey =
      RefusesKeys ? ami::StatusCode::remote_access : ami::StatusCode::timeout;
  explicit OfiPair(const ami::Config& config) : JobPair(with_provider(config), "self,ofi") {}

  static ami::Config with_provider(ami::Config c) {
    if (c.origin(ami::ParamName::lookup("AMI_OFI_PROVIDER")) == "default") REQUIRE(c.set("AMI_OFI_PROVIDER", Provider).ok());
    // The suite's message sizes are chosen to span several 8 KiB packets
    // (shm's own default, 64 KiB, would carry most of them whole).
    if (c.origin(ami::ParamName::lookup("AMI_OFI_PACKET_SIZE")) == "default") REQUIRE(c.set("AMI_OFI_PACKET_SIZE", "8192").ok());
    if (!RefusesKeys && c.origin(ami::ParamName::lookup("AMI_OFI_TIMEOUT")) == "default")
      REQUIRE(c.set("AMI_OFI_TIMEOUT", "1000").ok());
    return c;
  }
};
inline constexpr char kOfiTcp[] = "tcp;ofi_rxm";
inline constexpr char kOfiShm[] = "shm";
inline constexpr char kOfiVerbs[] = "verbs;ofi_rxm";
using OfiTcpPair = OfiPair<kOfiTcp, true, true>;
// Its transmits keep only send-after-send order; in libfabric 1.17 it drops
// a PUT or GET whose key the target refuses (prov/shm smr_progress_cmd_rma).
using OfiShmPair = OfiPair<kOfiShm, false, false>;
using OfiVerbsPair = OfiPair<kOfiVerbs, true, true>;

}  // namespace test

// The pairs by name in the template cases' names ("...<OfiVerbsPair>"), so
// that a run can pick or leave out one backend's cases by name.
TYPE_TO_STRING_AS("SelfPair", test::SelfPair);
TYPE_TO_STRING_AS("ShmPair", test::ShmPair);
TYPE_TO_STRING_AS("VerbsPair", test::VerbsPair);
TYPE_TO_STRING_AS("OfiTcpPair", test::OfiTcpPair);
TYPE_TO_STRING_AS("OfiShmPair", test::OfiShmPair);
TYPE_TO_STRING_AS("OfiVerbsPair", test::OfiVerbsPair);
