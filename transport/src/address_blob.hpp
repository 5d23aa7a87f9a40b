// address_blob.hpp — what a task tells every other task at bootstrap: who it
// is (job, task, contexts, process, host) and, for each backend it uses, the
// bytes a peer needs to reach it that way.
//
// Encoded little-endian with a magic and version: the common fields, then a
// list of (backend id, bytes) entries. The bytes of an entry are the
// backend's own, opaque here; which id is which backend is the registry's
// (backends.hpp). decode() treats the bytes as untrusted (they come off a
// socket) and names the first problem it finds.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ami/status.hpp"

namespace ami {

struct AddressBlob {
  static constexpr std::uint32_t kMagic = 0x42494D41;  // "AMIB"
  static constexpr std::uint16_t kVersion = 2;
  static constexpr std::size_t kBootIdBytes = 40;
  static constexpr std::size_t kMaxHostname = 255;
  static constexpr std::size_t kMaxEntries = 16;
  static constexpr std::size_t kMaxEntryBytes = 32 * 1024;

  struct Entry {
    std::uint16_t backend = 0;  // the registry's id of the backend
    std::vector<std::byte> bytes;
    bool operator==(const Entry&) const = default;
  };

  std::uint64_t job = 0;  // rank 0's choice is the job's
  std::uint32_t task = 0;
  std::uint16_t contexts = 0;
  std::uint32_t pid = 0;
  std::string boot_id;   // the host's /proc/sys/kernel/random/boot_id
  std::string hostname;
  std::vector<Entry> entries;  // in increasing backend id, each id once

  // The entry of that backend, or nullptr when the task does not use it.
  const std::vector<std::byte>* entry(std::uint16_t backend) const;

  std::vector<std::byte> encode() const;
  static Status decode(std::span<const std::byte> bytes, AddressBlob& out);
};

// This host's boot id, or "" when it cannot be read.
std::string read_boot_id();

}  // namespace ami
