// ami/client.hpp — one per process per middleware: the job's tasks and the
// contexts of this task.
//
// The Client owns its contexts, its memory registrations table and the
// backends' shared state; destroy every Memory it registered before it.
// Construction throws ami::Error; everything after returns Status.
// Thread-safety: register_memory() may be called from any thread; contexts
// follow the rules in context.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ami/config.hpp"
#include "ami/context.hpp"
#include "ami/memory.hpp"
#include "ami/status.hpp"

namespace ami {

struct ClientOptions {
  std::string name = "ami";
  std::uint16_t contexts = 1;
  Config config = Config::from_environment();
};

class Client {
 public:
  explicit Client(ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& name() const;
  std::uint32_t task() const;   // this process's rank
  std::uint32_t size() const;   // tasks in the job
  std::uint64_t job() const;    // identifies this job in remote keys
  std::uint16_t context_count() const;
  Context& context(std::uint16_t index);
  const Config& config() const;

  // Registers [address, address + length) for local use and remote access.
  Status register_memory(void* address, std::size_t length, Memory& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ami
