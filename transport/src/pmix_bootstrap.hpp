// pmix_bootstrap.hpp — the bootstrap of a job started by a PMIx launcher
// (Open MPI's mpirun, prterun, Slurm's srun --mpi=pmix): rank and size come
// from the launcher, blobs travel through its key-value store.
//
// Each rank PMIx_Puts one blob per allgather, commits it, and a PMIx_Fence
// that collects data brings every rank's blob to every rank, read with
// PMIx_Get. publish() puts and commits the same way, but its fence collects
// nothing: it only says every rank has published. A later fetch() of one
// rank is a PMIx_Get that the local server answers from what it holds, or
// asks the rank's own server for (PMIx's direct modex), so a rank reads the
// addresses it uses and no others. The fence and each get are bounded by the timeout (PMIX_TIMEOUT).
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
  const std::string& nspace() const;  // the job's PMIx namespace

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ami::bootstrap
