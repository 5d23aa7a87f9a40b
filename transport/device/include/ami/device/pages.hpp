// ami/device/pages.hpp — whole pages of memory for a device's own buffers
// (receive buffers, staging, handshake buffers): page-aligned, so that a
// buffer registered with a NIC or copied by process_vm_readv touches as few
// pages as its length needs.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace ami::device {

namespace detail {
struct FreePages {
  void operator()(std::byte* p) const { std::free(p); }
};
}  // namespace detail

using PageBuffer = std::unique_ptr<std::byte[], detail::FreePages>;

inline std::size_t page_size() {
  static const std::size_t size = [] {
    const long s = ::sysconf(_SC_PAGESIZE);
    return s > 0 ? static_cast<std::size_t>(s) : std::size_t{4096};
  }();
  return size;
}

// bytes rounded up to whole pages, page-aligned, not zeroed (a caller that
// wants every page mapped before the first arrival writes them); throws
// std::bad_alloc.
inline PageBuffer allocate_pages(std::size_t bytes) {
  const std::size_t page = page_size();
  bytes = (bytes + page - 1) / page * page;
  void* p = std::aligned_alloc(page, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return PageBuffer(static_cast<std::byte*>(p));
}

}  // namespace ami::device
