// Every public call given invalid arguments: it does nothing, and returns a
// status whose code says what kind of problem and whose text names it.
// Zero-length operations are valid and complete like any other.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ami/ami.hpp"

using namespace ami;

namespace {

struct Expect {
  Status got;
  StatusCode code;
  const char* text;  // the status text contains it
};

void check_all(const std::vector<Expect>& cases) {
  for (const Expect& e : cases) {
    CAPTURE(to_string(e.got));
    CAPTURE(e.text);
    CHECK(e.got == e.code);
    CHECK(std::string(e.got.what()).find(e.text) != std::string::npos);
  }
}

ClientOptions two_contexts() {
  ClientOptions o;
  o.name = "test";
  o.contexts = 2;
  return o;
}

}  // namespace

TEST_CASE("client calls: memory") {
  Client client(two_contexts());
  Memory m;
  std::vector<std::byte> buffer(64);
  check_all({
      {client.register_memory(nullptr, 16, m), StatusCode::invalid_argument, "address is null"},
      {client.register_memory(buffer.data(), 0, m), StatusCode::invalid_argument, "length is zero"},
      {client.allocate_memory(0, m), StatusCode::invalid_argument, "length is zero"},
  });
  CHECK_FALSE(m.valid());
  CHECK_THROWS_AS(client.context(2), std::out_of_range);
}

TEST_CASE("context calls: sends") {
  Client client(two_contexts());
  Context& a = client.context(0);
  std::vector<std::byte> header(200), payload(100);
  Memory m, moved;
  REQUIRE(client.register_memory(payload.data(), 50, m).ok());
  moved = std::move(m);  // m is no registration now
  const std::span<const std::byte> null_payload{static_cast<const std::byte*>(nullptr), 12};
  check_all({
      {a.set_dispatch(kMaxDispatch, {}), StatusCode::invalid_argument, "set_dispatch: id"},
      {a.send({.dest = {1, 0}}), StatusCode::invalid_argument, "send: endpoint task is out of range"},
      {a.send({.dest = {0, 9}}), StatusCode::invalid_argument, "send: endpoint context is out of range"},
      {a.send({.dest = {0, 1}, .dispatch = 300}), StatusCode::invalid_argument, "send: dispatch id"},
      {a.send({.dest = {0, 1}, .header = header}), StatusCode::invalid_argument, "send: header is longer"},
      {a.send({.dest = {0, 1}, .header = {static_cast<const std::byte*>(nullptr), 4}}),
       StatusCode::invalid_argument, "send: header is null"},
      {a.send({.dest = {0, 1}, .payload = null_payload}), StatusCode::invalid_argument, "send: payload is null"},
      {a.send({.dest = {0, 1}, .payload = payload, .memory = &m}), StatusCode::not_registered,
       "send: memory is not a live registration"},
      {a.send({.dest = {0, 1}, .payload = payload, .memory = &moved}), StatusCode::invalid_argument,
       "send: payload lies outside the given memory"},
      {a.send_immediate({.dest = {0, 7}}), StatusCode::invalid_argument, "endpoint context is out of range"},
      {a.send_immediate({.dest = {0, 1}, .payload = null_payload}), StatusCode::invalid_argument,
       "payload is null"},
      {a.send_immediate({.dest = {0, 1}, .payload = std::span(payload).first(a.immediate_limit({0, 1}) + 1)}),
       StatusCode::invalid_argument, "send_immediate: header + payload exceed immediate_limit()"},
      {a.accept(Deferred{12345, {0, 1}, 10}, payload.data(), {}), StatusCode::invalid_argument,
       "accept: no deferred message has that id"},
      {a.fence({3, 0}, {}), StatusCode::invalid_argument, "fence: endpoint is out of range"},
  });
  CHECK(a.immediate_limit({5, 0}) == 0);
  CHECK(a.backend_for({5, 0}).empty());
  CHECK(a.ack_stats({5, 0}).acks_sent == 0);
  CHECK(a.stats().messages_sent == 0);  // nothing went out
}

TEST_CASE("context calls: PUT and GET") {
  Client client(two_contexts());
  Client other(two_contexts());
  Context& a = client.context(0);
  std::vector<std::byte> local(4096), remote(4096), foreign(64);
  Memory lm, rm, fm;
  REQUIRE(client.register_memory(local.data(), local.size(), lm).ok());
  REQUIRE(client.register_memory(remote.data(), remote.size(), rm).ok());
  REQUIRE(other.register_memory(foreign.data(), foreign.size(), fm).ok());
  RemoteKey key = rm.remote_key();
  RemoteKey elsewhere = key;
  elsewhere.task = 1;
  for (bool is_put : {true, false}) {
    CAPTURE(is_put);
    auto call = [&](const RdmaParams& p) { return is_put ? a.put(p) : a.get(p); };
    check_all({
        {call({.dest = {2, 0}, .local = &lm, .remote = key, .bytes = 8}), StatusCode::invalid_argument,
         "endpoint is out of range"},
        {call({.dest = {0, 1}, .local = nullptr, .remote = key, .bytes = 8}), StatusCode::not_registered,
         "local memory is not registered"},
        {call({.dest = {0, 1}, .local = &fm, .remote = key, .bytes = 8}), StatusCode::not_registered,
         "local memory belongs to another client"},
        {call({.dest = {0, 1}, .local = &lm, .local_offset = 4090, .remote = key, .bytes = 8}),
         StatusCode::invalid_argument, "local range exceeds the registration"},
        {call({.dest = {0, 1}, .local = &lm, .remote = elsewhere, .bytes = 8}), StatusCode::invalid_argument,
         "remote key belongs to another task than dest"},
        {call({.dest = {0, 1}, .local = &lm, .remote = key, .remote_offset = 4095, .bytes = 8}),
         StatusCode::remote_access, "range exceeds the remote key's region"},
    });
  }
  CHECK(a.stats().puts == 0);
  CHECK(a.stats().gets == 0);
}

TEST_CASE("zero-length operations are valid and complete") {
  Client client(two_contexts());
  Context &a = client.context(0), &b = client.context(1);
  int arrived = 0, done = 0;
  REQUIRE(b.set_dispatch(1, {+[](void* n, const Incoming& in, Receive*) {
                               CHECK(in.total_bytes == 0);
                               ++*static_cast<int*>(n);
                             }, &arrived}).ok());
  std::vector<std::byte> buffer(64);
  Memory m;
  REQUIRE(client.register_memory(buffer.data(), buffer.size(), m).ok());
  const Callback count{+[](void* n, Status s) {
    CHECK(s.ok());
    ++*static_cast<int*>(n);
  }, &done};
  REQUIRE(a.send({.dest = {0, 1}, .dispatch = 1, .local_done = count, .remote_done = count}).ok());
  REQUIRE(a.send_immediate({.dest = {0, 1}, .dispatch = 1}).ok());
  REQUIRE(a.put({.dest = {0, 1}, .local = &m, .remote = m.remote_key(), .bytes = 0, .local_done = count}).ok());
  REQUIRE(a.get({.dest = {0, 1}, .local = &m, .remote = m.remote_key(), .bytes = 0, .local_done = count}).ok());
  REQUIRE(a.fence({0, 1}, count).ok());
  for (int i = 0; i < 1000 && (done < 5 || arrived < 2); ++i) {
    (void)a.advance();
    (void)b.advance();
  }
  CHECK(arrived == 2);
  CHECK(done == 5);
}

TEST_CASE("a context used after its client is destroyed answers with an error") {
  auto client = std::make_unique<Client>(two_contexts());
  Context& c = client->context(1);
  std::vector<std::byte> buffer(64);
  Memory m;
  REQUIRE(client->register_memory(buffer.data(), buffer.size(), m).ok());
  const RemoteKey key = m.remote_key();
  m = Memory{};
  int ran = 0;
  const Callback count{+[](void* p, Status) { ++*static_cast<int*>(p); }, &ran};
  client.reset();
  const char* text = "context used after its client was destroyed";
  check_all({
      {c.set_dispatch(1, {+[](void*, const Incoming&, Receive*) {}, nullptr}), StatusCode::invalid_argument, text},
      {c.send({.dest = {0, 0}, .dispatch = 1, .local_done = count}), StatusCode::invalid_argument, text},
      {c.send_immediate({.dest = {0, 0}, .dispatch = 1}), StatusCode::invalid_argument, text},
      {c.accept(Deferred{}, buffer.data(), count), StatusCode::invalid_argument, text},
      {c.put({.dest = {0, 0}, .remote = key, .bytes = 8}), StatusCode::invalid_argument, text},
      {c.get({.dest = {0, 0}, .remote = key, .bytes = 8}), StatusCode::invalid_argument, text},
      {c.fence({0, 0}, count), StatusCode::invalid_argument, text},
      {c.fence_all(count), StatusCode::invalid_argument, text},
      {c.post(count), StatusCode::invalid_argument, text},
      {c.peer_status({0, 0}), StatusCode::invalid_argument, text},
  });
  CHECK(c.index() == 1);
  CHECK(c.advance(10) == 0);
  CHECK(c.immediate_limit({0, 0}) == 0);
  CHECK(c.backend_for({0, 0}).empty());
  CHECK(c.describe_lane({0, 0}).empty());
  CHECK(c.stats().packets_sent == 0);
  CHECK_FALSE(c.try_lock());
  c.lock();
  c.unlock();
  c.set_error_handler({});
  CHECK_THROWS_AS((void)c.client(), Error);
  CHECK(ran == 0);  // nothing was taken, so nothing completes
}

// Sizes near 2^64 used to wrap in a size computation: one page was mapped
// for a region that claimed 2^64-1 bytes, and a PUT into it crashed.
TEST_CASE("sizes and ranges that wrap or cannot be backed are refused by name") {
  Client client(two_contexts());
  Memory m;
  check_all({
      {client.allocate_memory(SIZE_MAX, m), StatusCode::invalid_argument, "past the end of the address space"},
      {client.allocate_memory(SIZE_MAX - 4096, m), StatusCode::invalid_argument, "past the end"},
      {client.allocate_memory(std::size_t{64} << 40, m), StatusCode::no_resource, "more than this host's memory"},
  });
  CHECK_FALSE(m.valid());
  std::vector<std::byte> buf(4096);
  check_all({
      {client.register_memory(buf.data(), SIZE_MAX - 100, m), StatusCode::invalid_argument,
       "register_memory: the range runs past the end of the address space"},
      {client.register_memory(buf.data(), SIZE_MAX - reinterpret_cast<std::uintptr_t>(buf.data()) + 1, m),
       StatusCode::invalid_argument, "past the end of the address space"},
  });
  CHECK_FALSE(m.valid());

  // A key made by hand whose region wraps is refused before anything moves.
  Memory local;
  REQUIRE(client.register_memory(buf.data(), buf.size(), local).ok());
  RemoteKey wraps = local.remote_key();
  wraps.address = UINT64_MAX - 100;
  wraps.length = UINT64_MAX - 100;
  Context& a = client.context(0);
  check_all({
      {a.put({.dest = {0, 1}, .local = &local, .remote = wraps, .remote_offset = 200, .bytes = 16}),
       StatusCode::remote_access, "wraps around the address space"},
      {a.get({.dest = {0, 1}, .local = &local, .remote = wraps, .bytes = 16}), StatusCode::remote_access,
       "wraps around the address space"},
  });
  // What a peer deserialises is refused the same way.
  auto bytes = wraps.to_bytes();
  RemoteKey parsed;
  CHECK(RemoteKey::from_bytes(bytes, parsed) == StatusCode::invalid_argument);
}
