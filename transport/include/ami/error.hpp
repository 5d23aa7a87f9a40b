// ami/error.hpp — the exception thrown by constructors, and only by them.
//
// The data path never throws: it returns Status. A constructor that cannot
// build its object (a device that will not open, a bootstrap that times out)
// throws Error naming the failing call and, where there is one, errno's text.
#pragma once

#include <stdexcept>
#include <string>

namespace ami {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  // "<call>: <strerror(err)>"
  Error(const std::string& call, int err);
};

}  // namespace ami
