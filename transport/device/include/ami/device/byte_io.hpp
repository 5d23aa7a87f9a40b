// byte_io.hpp — reading and writing fixed-size fields of little-endian wire
// structures (remote keys, address blobs) one after another. Internal.
#pragma once

#include <cstddef>
#include <cstring>

namespace ami::detail {

template <typename T>
void store(std::byte*& p, T v) {
  std::memcpy(p, &v, sizeof v);
  p += sizeof v;
}

template <typename T>
T load(const std::byte*& p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}

}  // namespace ami::detail
