// job_bootstrap.cpp — the choice between the TCP and the PMIx bootstrap, and
// the checks on what the job description says.
#include "job_bootstrap.hpp"

#include <chrono>
#include <string>

#include "ami/error.hpp"
#include "core_config.hpp"
#include "pmix_bootstrap.hpp"

namespace ami::bootstrap {

namespace {

using core::Param;

std::uint32_t u32(const Config& c, ParamName name) { return static_cast<std::uint32_t>(c.number(name)); }

bool from_config(const Config& c, ParamName name) { return c.origin(name) != "default"; }

Options tcp_options(const JobOptions& job, const Config& config, std::chrono::milliseconds timeout) {
  Options b;
  b.rank = job.rank.value_or(u32(config, Param("AMI_RANK")));
  b.size = job.size.value_or(u32(config, Param("AMI_SIZE")));
  b.timeout = timeout;
  b.key = config.text(Param("AMI_JOB_KEY"));
  if (b.size == 0) throw Error("Client: the job size must be at least 1");
  // A size given in code meets the bound AMI_SIZE has.
  const std::uint64_t max_size = Param("AMI_SIZE").spec().max;
  if (b.size > max_size)
    throw Error("Client: a job of " + std::to_string(b.size) + " tasks is more than ami serves (at most " +
                std::to_string(max_size) + ", as AMI_SIZE)");
  if (b.rank >= b.size)
    throw Error("Client: rank " + std::to_string(b.rank) + " is not below the job size " + std::to_string(b.size));
  if (b.size == 1) return b;
  const std::string& address = job.bootstrap.empty() ? config.text(Param("AMI_BOOTSTRAP")) : job.bootstrap;
  if (!parse_address(address, b.host, b.port))
    throw Error("Client: a job of " + std::to_string(b.size) +
                " needs a bootstrap address host:port (AMI_BOOTSTRAP), not '" + address + "'");
  return b;
}

// With AMI_BOOTSTRAP_MODE=pmix, a rank or size also given by hand must be
// the launcher's.
void check_agrees(const PmixBootstrap& boot, const JobOptions& job, const Config& config) {
  auto given = [&](const std::optional<std::uint32_t>& option, ParamName name) -> std::optional<std::uint32_t> {
    if (option) return option;
    if (from_config(config, name)) return u32(config, name);
    return std::nullopt;
  };
  const auto rank = given(job.rank, Param("AMI_RANK"));
  const auto size = given(job.size, Param("AMI_SIZE"));
  if (rank && *rank != boot.rank())
    throw Error("Client: the job gives rank " + std::to_string(*rank) + ", but the PMIx launcher says rank " +
                std::to_string(boot.rank()) + " (AMI_BOOTSTRAP_MODE=pmix)");
  if (size && *size != boot.size())
    throw Error("Client: the job gives size " + std::to_string(*size) + ", but the PMIx launcher says " +
                std::to_string(boot.size()) + " tasks (AMI_BOOTSTRAP_MODE=pmix)");
}

}  // namespace

Kind choose(Mode mode, bool launched, bool given) {
  switch (mode) {
    case Mode::tcp: return Kind::tcp;
    case Mode::pmix:
      if (!launched)
        throw Error("Client: AMI_BOOTSTRAP_MODE=pmix, but no PMIx launcher started this process "
                    "(PMIX_NAMESPACE and PMIX_RANK are not set): start it with mpirun, prterun or "
                    "srun --mpi=pmix, or use AMI_BOOTSTRAP_MODE=auto or tcp");
      return Kind::pmix;
    case Mode::automatic: return launched && !given ? Kind::pmix : Kind::tcp;
  }
  return Kind::tcp;
}

bool job_given(const JobOptions& job, const Config& config) {
  return job.rank || job.size || !job.bootstrap.empty() || from_config(config, Param("AMI_RANK")) ||
         from_config(config, Param("AMI_SIZE")) || from_config(config, Param("AMI_BOOTSTRAP"));
}

std::unique_ptr<Bootstrap> open_job(const JobOptions& job, const Config& config) {
  const auto timeout = std::chrono::milliseconds(core::Options::from(config).bootstrap_timeout_ms);
  const auto mode = static_cast<Mode>(config.number(Param("AMI_BOOTSTRAP_MODE")));
  if (choose(mode, launched_by_pmix(), job_given(job, config)) == Kind::tcp)
    return std::make_unique<TcpBootstrap>(tcp_options(job, config, timeout));
  auto boot = std::make_unique<PmixBootstrap>(timeout);
  check_agrees(*boot, job, config);
  return boot;
}

}  // namespace ami::bootstrap
