// Address blobs: what a task tells the others at bootstrap, decoded as the
// untrusted bytes they are.
#include <doctest/doctest.h>

#include <string>

#include "transport/src/address_blob.hpp"

TEST_CASE("address blobs: round trip, and every malformed one named") {
  ami::AddressBlob a{.job = 77, .task = 3, .contexts = 2, .backends = ami::AddressBlob::kShm,
                     .pid = 1234, .shm_fd = 9, .boot_id = "0f0e-boot", .hostname = "node7"};
  const auto bytes = a.encode();
  ami::AddressBlob b;
  REQUIRE(ami::AddressBlob::decode(bytes, b).ok());
  CHECK(b.job == 77);
  CHECK(b.task == 3);
  CHECK(b.contexts == 2);
  CHECK(b.pid == 1234);
  CHECK(b.shm_fd == 9);
  CHECK(b.boot_id == "0f0e-boot");
  CHECK(b.hostname == "node7");

  auto broken = [&](std::size_t at, std::byte value) {
    auto copy = bytes;
    copy[at] = value;
    return std::string(ami::AddressBlob::decode(copy, b).what());
  };
  CHECK(std::string(ami::AddressBlob::decode({bytes.data(), 10}, b).what()) == "address blob is truncated");
  CHECK(broken(0, std::byte{0}) == "address blob has a bad magic");
  CHECK(broken(4, std::byte{9}) == "address blob has an unsupported version");
  CHECK(broken(6, std::byte{0x80}) == "address blob offers unknown backends");
  auto longer = bytes;
  longer.push_back(std::byte{'x'});
  CHECK(std::string(ami::AddressBlob::decode(longer, b).what()) ==
        "address blob length does not match its hostname");
  ami::AddressBlob no_segment = a;
  no_segment.shm_fd = -1;
  CHECK(std::string(ami::AddressBlob::decode(no_segment.encode(), b).what()) ==
        "address blob offers shm without a segment");

  ami::AddressBlob v = a;
  v.backends |= ami::AddressBlob::kVerbs;
  v.verbs = {std::byte{1}, std::byte{2}, std::byte{3}};
  const auto vb = v.encode();
  REQUIRE(ami::AddressBlob::decode(vb, b).ok());
  CHECK(b.verbs == v.verbs);
  auto cut = vb;
  cut.pop_back();
  CHECK(std::string(ami::AddressBlob::decode(cut, b).what()) ==
        "address blob length does not match its verbs address");
}
