// ami/device/log.hpp — how a backend reports what
// no caller can be told (a completion that failed after its operation was
// given up, a resource that would not close): one line on stderr,
// "ami: <backend>: <text>".
#pragma once

#include <cstdarg>
#include <cstdio>

namespace ami::device {

// A backend's log(format, ...) starts its va_list and hands it here.
inline void vlog(const char* backend, const char* format, std::va_list args) {
  char line[512];
  std::vsnprintf(line, sizeof line, format, args);
  std::fprintf(stderr, "ami: %s: %s\n", backend, line);
}

}  // namespace ami::device
