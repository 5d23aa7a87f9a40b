// bootstrap_wire.hpp — the TCP bootstrap's frames (the format is written out
// in bootstrap.hpp): the hello and its answer, the verdicts, and the
// little-endian words every frame is made of, encoded and decoded the same
// way by rank 0 (bootstrap_listener.cpp) and the ranks that connect to it
// (bootstrap.cpp). Internal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "bootstrap.hpp"

namespace ami::bootstrap::wire {

inline constexpr std::uint32_t kMagic = 0x42494d41;  // "AMIB" on the wire
// 2: the hello carries the job's key. 3: rank 0 says why it failed, and
// asks a connection it drops under load to connect again.
inline constexpr std::uint32_t kVersion = 3;
inline constexpr std::uint32_t kFailureMark = 0xffffffff;  // where a table's count is due: rank 0 failed

// Rank 0's answer to a hello: accepted, or why not. It travels back so that
// a refused rank's error says what rank 0 objected to.
enum class Verdict : std::uint32_t {
  accepted = 0, bad_magic, bad_version, size_mismatch, rank_out_of_range, duplicate_rank, wrong_key, rank0_failed,
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
    case Verdict::rank0_failed: return "rank 0 failed";
    case Verdict::busy: return "rank 0 dropped the connection before reading its hello";
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

// Rank 0's answer to a hello: {magic, version, verdict, size}.
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
