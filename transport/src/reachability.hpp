// reachability.hpp — the last step of the address exchange: every task
// tells every other which tasks it found no backend to, and why. Each task
// decides by itself what reaches a peer (a segment it could map, a queue
// pair it could connect, what AMI_BACKENDS allows here), so without this a
// job could form in which a task sends into a peer that has no lane back and
// waits forever. Internal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap.hpp"

namespace ami::detail {

struct Unreachable {
  std::uint32_t task = 0;
  std::string why;
};

// This task's report: the tasks it cannot reach; the reason of the first.
bootstrap::Blob encode_unreachable(const std::vector<Unreachable>& list);

// Given every task's report (by task) and their host names: throws
// ami::Error, on every task alike, naming the first pair (a, b) where a
// cannot reach b and why. With symmetric_only, a pair unreachable both ways
// is allowed (a job whose tasks only watch each other); one reachable only
// one way never is.
void check_reachability(const std::vector<bootstrap::Blob>& reports, const std::vector<std::string>& hosts,
                        bool symmetric_only);

}  // namespace ami::detail
