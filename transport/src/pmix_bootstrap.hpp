// pmix_bootstrap.hpp — the bootstrap of a job started by a PMIx launcher
// (Open MPI's mpirun, prterun, Slurm's srun --mpi=pmix): rank and size come
// from the launcher, blobs travel through its key-value store.
//
// Each rank PMIx_Puts one blob per allgather or publish(), commits it, and
// a PMIx_Fence that collects data brings every rank's blob to every node's
// PMIx server. allgather() then reads every rank's blob with PMIx_Get;
// after publish(), fetch() reads one, from the node's server, when it is
// needed, so a rank decodes and keeps only the addresses it uses. (Direct
// modex, a fence that collects nothing and each get asking the peer's own
// server, would spare the servers too; Slurm 22.05's PMIx across two nodes
// answered such gets "not found", so it is not relied on.) The fence and
// each get are bounded by the timeout (PMIX_TIMEOUT).
// Every failing PMIx call becomes an ami::Error naming the call and
// PMIx_Error_string. PMIx is initialised for the bootstrap's life and
// finalised by its destructor (PMIx counts nested initialisations, so an MPI
// library in the same process keeps its own).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "bootstrap.hpp"

namespace ami::bootstrap {

// True when the environment says a PMIx launcher started this process:
// PMIX_NAMESPACE and PMIX_RANK are both set.
bool launched_by_pmix();

class PmixBootstrap final : public Bootstrap {
 public:
  // Connects to the launcher's PMIx server and learns rank and job size.
  explicit PmixBootstrap(std::chrono::milliseconds timeout);
  ~PmixBootstrap() override;  // PMIx_Finalize; never throws
  PmixBootstrap(const PmixBootstrap&) = delete;
  PmixBootstrap& operator=(const PmixBootstrap&) = delete;

  std::uint32_t rank() const override;
  std::uint32_t size() const override;
  std::vector<Blob> allgather(std::span<const std::byte> mine) override;
  void barrier() override;  // PMIx_Fence without data
  bool fetches() const override { return true; }
  void publish(std::span<const std::byte> mine) override;
  Blob fetch(std::uint32_t rank) const override;
  std::string_view name() const override { return "pmix"; }
  // PMIX_LOCAL_SIZE (asked as optional: not waited for) against the job size.
  std::optional<bool> spans_hosts() const override;
  const std::string& nspace() const;  // the job's PMIx namespace

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ami::bootstrap
