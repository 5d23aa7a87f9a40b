// fuzz_address_blob.cpp — libFuzzer target: arbitrary bytes as a peer's
// bootstrap address blob, as the verbs backend's address inside one, and as
// a verbs connection handshake message (what a UD queue pair receives).
// What must hold: no crash or sanitizer report, and an address a parser
// accepts encodes back to bytes it accepts again, with the same contents.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "address_blob.hpp"
#include "verbs_address.hpp"
#include "verbs_handshake.hpp"

namespace {

void check_verbs(std::span<const std::byte> bytes) {
  ami::verbs::DomainAddress a;
  if (!ami::verbs::DomainAddress::decode(bytes, a).ok()) return;
  const auto again = a.encode();
  ami::verbs::DomainAddress b;
  if (!ami::verbs::DomainAddress::decode(again, b).ok()) __builtin_trap();
  if (b.task != a.task || b.tasks != a.tasks || b.contexts != a.contexts || b.gid != a.gid ||
      b.rendezvous != a.rendezvous || b.nonce != a.nonce || b.ip_family != a.ip_family || b.ip != a.ip)
    __builtin_trap();
}

void check_handshake(std::span<const std::byte> bytes) {
  using ami::verbs::Handshake;
  const auto m = Handshake::decode(bytes);
  if (!m) return;
  std::array<std::byte, Handshake::kBytes> again;
  m->encode(again);
  const auto n = Handshake::decode(again);
  if (!n || n->type != m->type || n->task != m->task || n->context != m->context ||
      n->peer_context != m->peer_context || n->nonce != m->nonce || n->qpn != m->qpn || n->psn != m->psn)
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  check_verbs(std::as_bytes(std::span(data, size)));
  check_handshake(std::as_bytes(std::span(data, size)));
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
