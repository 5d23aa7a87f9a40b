// reachability.cpp — the report every task makes of the peers it cannot
// reach, and the check that refuses a job that is not whole.
#include "reachability.hpp"

#include <algorithm>
#include <cstring>

#include "ami/error.hpp"
#include "ami/device/byte_io.hpp"

namespace ami::detail {

namespace {

constexpr std::size_t kMaxReasonBytes = 512;

struct Report {
  std::string why;                   // of the first task reported
  std::uint32_t first = 0;
  std::vector<std::uint32_t> tasks;  // sorted
};

// Layout (little-endian): count u32, reason length u16, reason, count x task u32.
Report decode(const bootstrap::Blob& blob, std::uint32_t from) {
  const auto bad = [&] {
    return Error("bootstrap: task " + std::to_string(from) + " sent a malformed reachability report");
  };
  if (blob.size() < 6) throw bad();
  const std::byte* p = blob.data();
  const auto count = load<std::uint32_t>(p);
  const auto reason = load<std::uint16_t>(p);
  if (reason > kMaxReasonBytes || (blob.size() - 6 - reason) / 4 != count || (blob.size() - 6 - reason) % 4 != 0)
    throw bad();
  Report r;
  r.why.assign(reinterpret_cast<const char*>(p), reason);
  p += reason;
  r.tasks.resize(count);
  for (std::uint32_t& t : r.tasks) t = load<std::uint32_t>(p);
  if (count != 0) r.first = r.tasks.front();
  std::sort(r.tasks.begin(), r.tasks.end());
  return r;
}

std::string name(std::uint32_t task, const std::vector<std::string>& hosts) {
  return "task " + std::to_string(task) + " (" + hosts[task] + ")";
}

}  // namespace

bootstrap::Blob encode_unreachable(const std::vector<Unreachable>& list) {
  if (list.size() > (bootstrap::kMaxBlobBytes - 6 - kMaxReasonBytes) / 4)
    throw Error("Client: this task reaches too few of the job's tasks to report them (" +
                std::to_string(list.size()) + " unreachable)");
  const std::string why = list.empty() ? "" : list.front().why.substr(0, kMaxReasonBytes);
  bootstrap::Blob blob(6 + why.size() + 4 * list.size());
  std::byte* p = blob.data();
  store(p, static_cast<std::uint32_t>(list.size()));
  store(p, static_cast<std::uint16_t>(why.size()));
  std::memcpy(p, why.data(), why.size());
  p += why.size();
  for (const Unreachable& u : list) store(p, u.task);
  return blob;
}

void check_reachability(const std::vector<bootstrap::Blob>& blobs, const std::vector<std::string>& hosts,
                        bool symmetric_only) {
  std::vector<Report> reports;
  reports.reserve(blobs.size());
  for (std::uint32_t t = 0; t < blobs.size(); ++t) reports.push_back(decode(blobs[t], t));
  for (std::uint32_t a = 0; a < reports.size(); ++a) {
    for (const std::uint32_t b : reports[a].tasks) {
      if (b >= reports.size() || b == a)
        throw Error("bootstrap: task " + std::to_string(a) + " reports an unreachable task that is not a peer");
      const bool both_ways = std::binary_search(reports[b].tasks.begin(), reports[b].tasks.end(), a);
      if (symmetric_only && both_ways) continue;
      const bool first = b == reports[a].first;
      std::string text = "Client: " + name(a, hosts) + " cannot reach " + name(b, hosts);
      if (!both_ways) text += ", though " + name(b, hosts) + " reaches it";
      if (first && !reports[a].why.empty()) text += ": " + reports[a].why;
      text += symmetric_only ? "; a pair must reach each other both ways or not at all"
                             : "; every task must reach every other (AMI_BACKENDS on both, or "
                               "AMI_REACHABILITY=symmetric for a job whose tasks only watch each other)";
      throw Error(text);
    }
  }
}

}  // namespace ami::detail
