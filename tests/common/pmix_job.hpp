// pmix_job.hpp — what test programs started by a PMIx launcher (mpirun,
// srun --mpi=pmix) share: advancing a context until something holds, and
// meeting the other ranks at the launcher's fence without ceasing to
// advance (a peer may still wait for this rank's acks or for a GET of its
// memory).
#pragma once

#include <pmix.h>

#include <atomic>
#include <chrono>
#include <string>

#include "ami/ami.hpp"

namespace test {

using Clock = std::chrono::steady_clock;

// Advances until done() or the deadline; false on the deadline.
template <typename Done>
bool advance_until(ami::Context& c, Done done, Clock::time_point end) {
  while (!done()) {
    if (Clock::now() >= end) return false;
    (void)c.advance();
  }
  return true;
}

// The launcher's fence over every rank of self's namespace, entered without
// blocking, c advanced meanwhile. Its status lives in a static: the
// callback may come after a timed-out wait returned. The fence asks to
// collect data (there is none): Slurm's mpi/pmix plugin takes a fence that
// collects nothing through another collective, which across two nodes let
// one node's ranks out before the other node's were in (see
// PmixBootstrap::barrier), so it would not hold a rank back while a peer
// still sends to it.
inline bool meet_everyone(ami::Context& c, const pmix_proc_t& self, std::string& why,
                          std::chrono::seconds patience = std::chrono::seconds(60)) {
  static std::atomic<int> status{0};
  constexpr int kPending = 1;  // no pmix_status_t is 1
  pmix_proc_t everyone = self;
  everyone.rank = PMIX_RANK_WILDCARD;
  status = kPending;
  // (Kept, as the call's status is: PMIx may read it until the callback.)
  static pmix_info_t collect = [] {
    pmix_info_t i;
    PMIX_INFO_CONSTRUCT(&i);
    const bool yes = true;
    PMIX_INFO_LOAD(&i, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    return i;
  }();
  const pmix_status_t rc = PMIx_Fence_nb(&everyone, 1, &collect, 1,
                                         [](pmix_status_t s, void*) { status = s; }, nullptr);
  if (rc == PMIX_OPERATION_SUCCEEDED) return true;
  if (rc != PMIX_SUCCESS) {
    why = std::string("PMIx_Fence_nb: ") + PMIx_Error_string(rc);
    return false;
  }
  if (!advance_until(c, [] { return status.load() != kPending; }, Clock::now() + patience)) {
    why = "the closing fence timed out: a rank did not finish";
    return false;
  }
  if (status != PMIX_SUCCESS) {
    why = std::string("the closing fence failed: ") + PMIx_Error_string(status);
    return false;
  }
  return true;
}

}  // namespace test
