// Address blobs: what a task tells the others at bootstrap, decoded as the
// untrusted bytes they are.
#include <doctest/doctest.h>

#include <string>

#include "address_blob.hpp"

namespace {

std::vector<std::byte> bytes_of(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

}  // namespace

TEST_CASE("address blobs: round trip, and every malformed one named") {
  ami::AddressBlob a{.job = 77, .task = 3, .contexts = 2, .pid = 1234, .boot_id = "0f0e-boot",
                     .hostname = "node7", .entries = {{1, bytes_of({9, 0, 0, 0})}}};
  const auto bytes = a.encode();
  ami::AddressBlob b;
  REQUIRE(ami::AddressBlob::decode(bytes, b).ok());
  CHECK(b.job == 77);
  CHECK(b.task == 3);
  CHECK(b.contexts == 2);
  CHECK(b.pid == 1234);
  CHECK(b.boot_id == "0f0e-boot");
  CHECK(b.hostname == "node7");
  REQUIRE(b.entries.size() == 1);
  REQUIRE(b.entry(1) != nullptr);
  CHECK(*b.entry(1) == bytes_of({9, 0, 0, 0}));
  CHECK(b.entry(2) == nullptr);

  auto broken = [&](std::size_t at, std::byte value) {
    auto copy = bytes;
    copy[at] = value;
    return std::string(ami::AddressBlob::decode(copy, b).what());
  };
  CHECK(std::string(ami::AddressBlob::decode({bytes.data(), 10}, b).what()) == "address blob is truncated");
  CHECK(broken(0, std::byte{0}) == "address blob has a bad magic");
  CHECK(broken(4, std::byte{9}) == "address blob has an unsupported version");
  CHECK(broken(6, std::byte{0x80}) == "address blob has too many backend entries");
  CHECK(broken(6, std::byte{2}) == "address blob length does not match its backend entries");
  CHECK(broken(6, std::byte{0}) == "address blob length does not match its backend entries");
  auto longer = bytes;
  longer.push_back(std::byte{'x'});
  CHECK(std::string(ami::AddressBlob::decode(longer, b).what()) ==
        "address blob length does not match its backend entries");
  ami::AddressBlob no_contexts = a;
  no_contexts.contexts = 0;
  CHECK(std::string(ami::AddressBlob::decode(no_contexts.encode(), b).what()) == "address blob has no contexts");

  // Entries: any number up to the limit, each id once and in order; the
  // bytes are the backend's own and come back as they went.
  ami::AddressBlob v = a;
  v.entries.push_back({2, bytes_of({1, 2, 3})});
  v.entries.push_back({5, {}});
  const auto vb = v.encode();
  REQUIRE(ami::AddressBlob::decode(vb, b).ok());
  CHECK(b.entries == v.entries);
  auto cut = vb;
  cut.pop_back();
  CHECK(std::string(ami::AddressBlob::decode(cut, b).what()) ==
        "address blob length does not match its backend entries");
  ami::AddressBlob twice = a;
  twice.entries.push_back({1, {}});
  CHECK(std::string(ami::AddressBlob::decode(twice.encode(), b).what()) ==
        "address blob lists its backend entries out of order");
  ami::AddressBlob huge = a;
  huge.entries.push_back({2, std::vector<std::byte>(ami::AddressBlob::kMaxEntryBytes + 1)});
  CHECK(std::string(ami::AddressBlob::decode(huge.encode(), b).what()) ==
        "address blob length does not match its backend entries");
  ami::AddressBlob none = a;
  none.entries.clear();
  REQUIRE(ami::AddressBlob::decode(none.encode(), b).ok());
  CHECK(b.entries.empty());
}
