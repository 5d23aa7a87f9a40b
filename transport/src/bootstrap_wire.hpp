// bootstrap_wire.hpp — the TCP bootstrap's frames (the format is written out
// in bootstrap.hpp): the hello and its answer, the verdicts, the tree's shape,
// and the little-endian words every frame is made of, encoded and decoded the
// same way by a listening rank (bootstrap_listener.cpp) and the ranks that
// connect to it (bootstrap.cpp, bootstrap_tree.cpp). Internal.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "bootstrap.hpp"

namespace ami::bootstrap::wire {

inline constexpr std::uint32_t kMagic = 0x42494d41;  // "AMIB" on the wire
// 2: the hello carries the job's key. 3: rank 0 says why it failed, and
// asks a connection it drops under load to connect again. 4: the table goes
// down a tree, its lengths ahead of its blobs.
inline constexpr std::uint32_t kVersion = 4;
inline constexpr std::uint32_t kFailureMark = 0xffffffff;  // where a table's count is due: the sender failed
inline constexpr std::size_t kMaxHostBytes = 255;          // a parent's address, as text

// A listening rank's answer to a hello: accepted, or why not. It travels back
// so that a refused rank's error says what the listener objected to.
enum class Verdict : std::uint32_t {
  accepted = 0, bad_magic, bad_version, size_mismatch, rank_out_of_range, duplicate_rank, wrong_key, listener_failed,
  busy,
};

inline std::string to_text(Verdict v) {
  switch (v) {
    case Verdict::accepted: return "accepted";
    case Verdict::bad_magic: return "bad magic";
    case Verdict::bad_version: return "bad version";
    case Verdict::size_mismatch: return "size mismatch";
    case Verdict::rank_out_of_range: return "rank out of range";
    case Verdict::duplicate_rank: return "duplicate rank: another peer has already taken this rank";
    case Verdict::wrong_key: return "wrong job key (AMI_JOB_KEY differs)";
    case Verdict::listener_failed: return "the listener failed";
    case Verdict::busy: return "the listener dropped the connection before reading its hello";
  }
  return "unknown verdict " + std::to_string(static_cast<std::uint32_t>(v));
}

using Word = std::array<std::byte, 4>;

inline void put_u32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

inline std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return v;
}

inline void append_u32(Blob& b, std::uint32_t v) {
  Word w;
  put_u32(w.data(), v);
  b.insert(b.end(), w.begin(), w.end());
}

// Where a rank's parent listens, as rank 0 tells it: {host length, host, port}.
inline Blob parent_frame(const std::string& host, std::uint16_t port) {
  Blob b;
  append_u32(b, static_cast<std::uint32_t>(host.size()));
  for (char c : host) b.push_back(static_cast<std::byte>(c));
  append_u32(b, port);
  return b;
}

// The tree the tables travel down: rank r's parent and its children
// [first_child(r), end_of_children(r)), cut at the job's size. In 64 bits, so
// that no rank of a job of 2^32 overflows.
inline std::uint32_t parent_of(std::uint32_t rank) { return (rank - 1) / kTreeFanOut; }
inline std::uint64_t first_child(std::uint32_t rank) { return std::uint64_t{rank} * kTreeFanOut + 1; }
inline std::uint64_t end_of_children(std::uint32_t rank, std::uint32_t size) {
  return std::min<std::uint64_t>(first_child(rank) + kTreeFanOut, size);
}
inline bool has_children(std::uint32_t rank, std::uint32_t size) { return first_child(rank) < size; }

// A hello and its answer share one layout; `word` is the sender's rank in a
// hello and the verdict in an answer.
struct Hello {
  std::uint32_t magic, version, word, size;
};
using HelloFrame = std::array<std::byte, 16>;

inline HelloFrame encode(const Hello& h) {
  HelloFrame f;
  put_u32(&f[0], h.magic);
  put_u32(&f[4], h.version);
  put_u32(&f[8], h.word);
  put_u32(&f[12], h.size);
  return f;
}

inline Hello decode(const HelloFrame& f) {
  return {get_u32(&f[0]), get_u32(&f[4]), get_u32(&f[8]), get_u32(&f[12])};
}

// A listening rank's answer to a hello: {magic, version, verdict, size}.
inline HelloFrame answer_frame(Verdict verdict, std::uint32_t size) {
  return encode({kMagic, kVersion, static_cast<std::uint32_t>(verdict), size});
}

// How a magic (or any word that should have been one) is shown in a message.
inline std::string hex(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

}  // namespace ami::bootstrap::wire
