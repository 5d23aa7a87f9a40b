// fuzz_address_blob.cpp — libFuzzer target: arbitrary bytes as a peer's
// bootstrap address blob, and as the verbs backend's address inside one.
// What must hold: no crash or sanitizer report, and an address a parser
// accepts encodes back to bytes it accepts again, with the same contents.
#include <cstddef>
#include <cstdint>
#include <span>

#include "address_blob.hpp"
#include "verbs_address.hpp"

namespace {

void check_verbs(std::span<const std::byte> bytes) {
  ami::verbs::DomainAddress a;
  if (!ami::verbs::DomainAddress::decode(bytes, a).ok()) return;
  const auto again = a.encode();
  ami::verbs::DomainAddress b;
  if (!ami::verbs::DomainAddress::decode(again, b).ok()) __builtin_trap();
  if (b.task != a.task || b.tasks != a.tasks || b.contexts != a.contexts || b.gid != a.gid ||
      b.lanes.size() != a.lanes.size() || b.nonce != a.nonce || b.cm_port != a.cm_port)
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  check_verbs(std::as_bytes(std::span(data, size)));
  ami::AddressBlob blob;
  if (!ami::AddressBlob::decode(std::as_bytes(std::span(data, size)), blob).ok()) return 0;
  // Every entry as the verbs address it may be (the others are a few bytes).
  for (const ami::AddressBlob::Entry& e : blob.entries) check_verbs(e.bytes);
  const auto again = blob.encode();
  ami::AddressBlob copy;
  if (!ami::AddressBlob::decode(again, copy).ok()) __builtin_trap();
  if (copy.job != blob.job || copy.task != blob.task || copy.contexts != blob.contexts ||
      copy.pid != blob.pid || copy.boot_id != blob.boot_id || copy.hostname != blob.hostname ||
      copy.entries != blob.entries)
    __builtin_trap();
  return 0;
}
