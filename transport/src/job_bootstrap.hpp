// job_bootstrap.hpp — which bootstrap a Client's job uses, and opening it.
//
// AMI_BOOTSTRAP_MODE decides: tcp always uses the TCP bootstrap (AMI_RANK,
// AMI_SIZE, AMI_BOOTSTRAP or JobOptions); pmix always uses PMIx and fails
// when no PMIx launcher started the process; auto (the default) uses PMIx
// when a PMIx launcher started the process and the job is not given
// explicitly (by JobOptions, or by AMI_RANK, AMI_SIZE or AMI_BOOTSTRAP), and
// TCP otherwise, so a program started by hand runs as before.
#pragma once

#include <cstdint>
#include <memory>

#include "ami/client.hpp"
#include "ami/config.hpp"
#include "bootstrap.hpp"

namespace ami::bootstrap {

enum class Mode : std::uint8_t { automatic, pmix, tcp };  // AMI_BOOTSTRAP_MODE's words, in order
enum class Kind : std::uint8_t { tcp, pmix };

// The decision alone. Throws ami::Error for pmix when the process was not
// started by a PMIx launcher.
Kind choose(Mode mode, bool launched_by_pmix, bool job_given);

// True when JobOptions or the AMI_RANK, AMI_SIZE, AMI_BOOTSTRAP variables
// (set, not defaults) say where this task sits.
bool job_given(const JobOptions& job, const Config& config);

// Chooses and opens the bootstrap: a TcpBootstrap is connected (a job of
// one opens nothing), a PmixBootstrap has learnt rank and size. Throws
// ami::Error when the job description is inconsistent or the bootstrap
// fails.
std::unique_ptr<Bootstrap> open_job(const JobOptions& job, const Config& config);

}  // namespace ami::bootstrap
