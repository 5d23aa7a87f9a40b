// address_blob.hpp — what a task tells every other task at bootstrap: who it
// is, which backends it offers and how to reach it with each.
//
// Encoded little-endian with a magic and version; decode() treats the bytes
// as untrusted (they come off a socket) and names the first problem it finds.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ami/status.hpp"

namespace ami {

struct AddressBlob {
  static constexpr std::uint32_t kMagic = 0x42494D41;  // "AMIB"
  static constexpr std::uint16_t kVersion = 1;
  static constexpr std::size_t kBootIdBytes = 40;
  static constexpr std::size_t kMaxHostname = 255;
  static constexpr std::size_t kMaxVerbsBytes = 32 * 1024;
  enum Backend : std::uint16_t { kShm = 1u << 0, kVerbs = 1u << 1 };

  std::uint64_t job = 0;  // rank 0's choice is the job's
  std::uint32_t task = 0;
  std::uint16_t contexts = 0;
  std::uint16_t backends = 0;
  std::uint32_t pid = 0;
  std::int32_t shm_fd = -1;
  std::string boot_id;   // the host's /proc/sys/kernel/random/boot_id
  std::string hostname;
  std::vector<std::byte> verbs;  // the verbs backend's address (kVerbs), opaque here

  std::vector<std::byte> encode() const;
  static Status decode(std::span<const std::byte> bytes, AddressBlob& out);
};

// This host's boot id, or "" when it cannot be read.
std::string read_boot_id();

}  // namespace ami
