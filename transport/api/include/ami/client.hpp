// ami/client.hpp — one per process per middleware: the job's tasks and the
// contexts of this task.
//
// The Client owns its contexts, its memory registrations table and the
// backends' shared state; destroy every Memory it registered before it.
// Construction runs the bootstrap (every task of the job constructs its
// Client at about the same time) and throws ami::Error, naming the peer, when
// it fails; everything after returns Status.
// Thread-safety: register_memory() may be called from any thread; contexts
// follow the rules in context.hpp.
//
// fork(): a child gets a copy of the Client, but its contexts, registrations
// and backends stay the parent's, which goes on using them untouched. In the
// child every call that would use them returns not_supported, naming the
// fork (context.hpp says what each call does there). Destroying the copies
// changes nothing the parent uses: a Memory unmaps and closes the child's
// copy of its buffer; the Client frees nothing, since its verbs objects,
// PMIx session, rings and region table are the parent's (the child keeps
// its copies of the descriptors). A Client made in the child is its own and
// works.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ami/config.hpp"
#include "ami/context.hpp"
#include "ami/memory.hpp"
#include "ami/status.hpp"

namespace ami {

// Where this task sits in its job. Under a PMIx launcher (mpirun, prterun,
// srun --mpi=pmix) leave them unset: rank and size then come from the
// launcher (AMI_BOOTSTRAP_MODE). Otherwise unset fields come from AMI_RANK,
// AMI_SIZE and AMI_BOOTSTRAP; a job of one needs nothing. Setting any of
// them chooses the TCP bootstrap unless AMI_BOOTSTRAP_MODE=pmix.
struct JobOptions {
  std::optional<std::uint32_t> rank;
  std::optional<std::uint32_t> size;
  std::string bootstrap;  // "host:port": rank 0 listens there, the others connect
};

// A fresh random job key (32 hex digits from the kernel's random source),
// for a launcher that starts the ranks of a TCP-bootstrapped job: give it to
// every rank as AMI_JOB_KEY.
std::string make_job_key();

// What each backend of this build finds on this host without a Client, one
// line each ("verbs device: mlx5_0"): for ami_info, which prints it before
// it makes one.
std::string describe_hardware();

// The backends of this build, in the registry's order ("self", "shm",
// "verbs"): what AMI_BACKENDS may name.
std::vector<std::string_view> backend_names();

struct ClientOptions {
  std::string name = "ami";
  std::uint16_t contexts = 1;
  JobOptions job;
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
  std::string_view bootstrap_name() const;  // how the tasks found each other: "tcp" or "pmix"
  // Are peers' addresses learnt on first use (AMI_ADDRESSES), not all at
  // creation? And how many other tasks this one has learnt and joined so
  // far: size() - 1 from creation on when not on first use.
  bool addresses_on_demand() const;
  std::uint32_t peers_joined() const;
  std::uint16_t context_count() const;
  Context& context(std::uint16_t index);
  const Config& config() const;

  // One line per backend in use: its name and how it is set up; then how
  // fences and acknowledgements work ("fence: ...", "acks: ...").
  std::string describe_backends() const;

  // Registers [address, address + length) for local use and remote access.
  Status register_memory(void* address, std::size_t length, Memory& out);
  // Allocates length bytes (zeroed, page-aligned) that peers on this host
  // map, so their PUT and GET are one plain copy; out owns the buffer.
  Status allocate_memory(std::size_t length, Memory& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ami
