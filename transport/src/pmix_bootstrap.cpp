// pmix_bootstrap.cpp — the bootstrap over the launcher's PMIx server. Every
// PMIx call goes through check(), which turns a failure into ami::Error with
// the call's name, PMIx_Error_string and the step it was part of.
#include "pmix_bootstrap.hpp"

#include <pmix.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "ami/error.hpp"

namespace ami::bootstrap {

namespace {

// Numbers the PMIx bootstraps of this process (one per Client). Every task
// creates its Clients in the same order, so the number names the same
// bootstrap on every task; with the allgather's own number it makes every
// key unique, so no exchange relies on how a server replaces an earlier
// value under the same key, nor reads one left by another Client.
std::atomic<std::uint32_t> next_instance{0};

// The attributes of a fence or a get: a timeout, and for the fence that
// publishes blobs, the request to bring everyone's data to every server.
class Attributes {
 public:
  Attributes(int timeout_seconds, bool collect_data) {
    add(PMIX_TIMEOUT, &timeout_seconds, PMIX_INT);
    bool yes = true;
    if (collect_data) add(PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
  }
  ~Attributes() {
    for (std::size_t i = 0; i < count_; ++i) PMIX_INFO_DESTRUCT(&info_[i]);
  }
  Attributes(const Attributes&) = delete;
  Attributes& operator=(const Attributes&) = delete;

  const pmix_info_t* data() const { return info_.data(); }
  std::size_t size() const { return count_; }

 private:
  void add(const char* key, void* value, pmix_data_type_t type) {
    pmix_info_t& info = info_[count_++];
    PMIX_INFO_CONSTRUCT(&info);
    PMIX_INFO_LOAD(&info, key, value, type);
  }

  std::array<pmix_info_t, 2> info_;
  std::size_t count_ = 0;
};

struct ValueRelease {
  void operator()(pmix_value_t* v) const { PMIX_VALUE_RELEASE(v); }
};
using Value = std::unique_ptr<pmix_value_t, ValueRelease>;

// A job-level number (the job size) as whichever integer type the server
// chose to store it in; nothing when it is not an integer.
std::optional<std::uint64_t> number(const pmix_value_t& v) {
  switch (v.type) {
    case PMIX_UINT32: return v.data.uint32;
    case PMIX_UINT64: return v.data.uint64;
    case PMIX_UINT16: return v.data.uint16;
    case PMIX_SIZE: return v.data.size;
    case PMIX_INT:
      if (v.data.integer >= 0) return static_cast<std::uint64_t>(v.data.integer);
      return std::nullopt;
    default: return std::nullopt;
  }
}

}  // namespace

bool launched_by_pmix() {
  const char* nspace = std::getenv("PMIX_NAMESPACE");
  const char* rank = std::getenv("PMIX_RANK");
  return nspace != nullptr && *nspace != '\0' && rank != nullptr && *rank != '\0';
}

struct PmixBootstrap::Impl {
  // Owed once PMIx_Init succeeded, also when the constructor throws after it.
  struct Session {
    bool up = false;
    ~Session() {
      if (up) (void)PMIx_Finalize(nullptr, 0);
    }
  };

  explicit Impl(std::chrono::milliseconds timeout)
      : timeout_seconds(static_cast<int>(std::max<std::int64_t>(1, (timeout.count() + 999) / 1000))),
        instance(next_instance++) {}

  Session session;  // first: finalised after everything else
  pmix_proc_t self{};
  std::string nspace;
  std::uint32_t size = 0;
  int timeout_seconds;
  std::uint32_t instance;
  std::uint32_t rounds = 0;  // allgathers and publishes so far: the last part of each key
  mutable std::mutex published_mutex;  // fetch() may come from any thread
  std::string published;               // the key of the last publish(), "" before it

  std::string next_key() { return "ami.blob." + std::to_string(instance) + "." + std::to_string(rounds++); }
  void put(std::span<const std::byte> mine, const std::string& key) const;
  Blob read(std::uint32_t r, const std::string& key) const;

  std::string prefix() const {
    return "bootstrap: pmix rank " + std::to_string(self.rank) + " of namespace " + nspace + ": ";
  }
  void check(pmix_status_t rc, const char* call, const std::string& step) const {
    if (rc != PMIX_SUCCESS)
      throw Error(prefix() + call + " failed: " + PMIx_Error_string(rc) + " (" + step + ")");
  }
  pmix_proc_t proc(pmix_rank_t rank) const {
    pmix_proc_t p = self;
    p.rank = rank;
    return p;
  }
  Value get(const pmix_proc_t& who, const char* key, const std::string& step) const {
    const Attributes attributes(timeout_seconds, false);
    pmix_value_t* v = nullptr;
    check(PMIx_Get(&who, key, attributes.data(), attributes.size(), &v), "PMIx_Get", step);
    if (v == nullptr) throw Error(prefix() + "PMIx_Get returned no value (" + step + ")");
    return Value(v);
  }
  void fence(bool collect_data, const std::string& step) const {
    const Attributes attributes(timeout_seconds, collect_data);
    const pmix_proc_t everyone = proc(PMIX_RANK_WILDCARD);
    check(PMIx_Fence(&everyone, 1, attributes.data(), attributes.size()), "PMIx_Fence",
          step + ", timeout " + std::to_string(timeout_seconds) + " s");
  }
};

PmixBootstrap::PmixBootstrap(std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>(timeout)) {
  Impl& m = *impl_;
  const char* nspace = std::getenv("PMIX_NAMESPACE");
  m.nspace = nspace != nullptr ? nspace : "(unset)";
  const pmix_status_t rc = PMIx_Init(&m.self, nullptr, 0);
  if (rc != PMIX_SUCCESS)
    throw Error("bootstrap: pmix: PMIx_Init failed: " + std::string(PMIx_Error_string(rc)) +
                " (connecting to the launcher's PMIx server for namespace " + m.nspace + ")");
  m.session.up = true;
  m.nspace.assign(m.self.nspace, ::strnlen(m.self.nspace, sizeof m.self.nspace));

  const Value v = m.get(m.proc(PMIX_RANK_WILDCARD), PMIX_JOB_SIZE, "reading the job size");
  const std::optional<std::uint64_t> size = number(*v);
  if (!size || *size == 0 || *size > 0xFFFFFFFFu)
    throw Error(m.prefix() + "the launcher's job size (" PMIX_JOB_SIZE ") is not a usable number");
  m.size = static_cast<std::uint32_t>(*size);
  if (m.self.rank >= m.size)
    throw Error(m.prefix() + "the rank is not below the job size " + std::to_string(m.size));
}

PmixBootstrap::~PmixBootstrap() = default;

std::optional<bool> PmixBootstrap::spans_hosts() const {
  const Impl& m = *impl_;
  const pmix_proc_t job = m.proc(PMIX_RANK_WILDCARD);
  pmix_info_t optional;
  bool yes = true;
  PMIX_INFO_CONSTRUCT(&optional);
  PMIX_INFO_LOAD(&optional, PMIX_OPTIONAL, &yes, PMIX_BOOL);
  pmix_value_t* v = nullptr;
  const pmix_status_t rc = PMIx_Get(&job, PMIX_LOCAL_SIZE, &optional, 1, &v);
  PMIX_INFO_DESTRUCT(&optional);
  if (rc != PMIX_SUCCESS || v == nullptr) return std::nullopt;
  const Value owned(v);
  const std::optional<std::uint64_t> local = number(*v);
  if (!local || *local == 0) return std::nullopt;
  return *local < m.size;
}

std::uint32_t PmixBootstrap::rank() const { return impl_->self.rank; }
std::uint32_t PmixBootstrap::size() const { return impl_->size; }
const std::string& PmixBootstrap::nspace() const { return impl_->nspace; }

// Puts the blob under the key, commits it: readable by every rank once
// the next fence has passed.
void PmixBootstrap::Impl::put(std::span<const std::byte> mine, const std::string& key) const {
  if (mine.size() > kMaxBlobBytes)
    throw Error(prefix() + "a blob of " + std::to_string(mine.size()) + " bytes exceeds the limit of " +
                std::to_string(kMaxBlobBytes));
  // PMIx_Put copies the value: it may point at the caller's bytes.
  pmix_value_t value;
  PMIX_VALUE_CONSTRUCT(&value);
  value.type = PMIX_BYTE_OBJECT;
  value.data.bo.bytes = const_cast<char*>(reinterpret_cast<const char*>(mine.data()));
  value.data.bo.size = mine.size();
  check(PMIx_Put(PMIX_GLOBAL, key.c_str(), &value), "PMIx_Put", "publishing this rank's blob as " + key);
  check(PMIx_Commit(), "PMIx_Commit", "publishing this rank's blob as " + key);
}

// Rank r's blob under the key, checked to be one.
Blob PmixBootstrap::Impl::read(std::uint32_t r, const std::string& key) const {
  const std::string step = "reading rank " + std::to_string(r) + "'s blob " + key;
  const Value v = get(proc(r), key.c_str(), step);
  if (v->type != PMIX_BYTE_OBJECT)
    throw Error(prefix() + "rank " + std::to_string(r) + "'s blob " + key + " is not a byte object (type " +
                std::to_string(v->type) + ")");
  const pmix_byte_object_t& bo = v->data.bo;
  if (bo.size > kMaxBlobBytes)
    throw Error(prefix() + "rank " + std::to_string(r) + "'s blob of " + std::to_string(bo.size) +
                " bytes exceeds the limit of " + std::to_string(kMaxBlobBytes));
  const auto* bytes = reinterpret_cast<const std::byte*>(bo.bytes);
  return bo.size != 0 ? Blob(bytes, bytes + bo.size) : Blob();
}

std::vector<Blob> PmixBootstrap::allgather(std::span<const std::byte> mine) {
  Impl& m = *impl_;
  const std::string key = m.next_key();
  m.put(mine, key);
  m.fence(true, "collecting every rank's blob " + key);
  std::vector<Blob> all(m.size);
  all[m.self.rank].assign(mine.begin(), mine.end());
  for (std::uint32_t r = 0; r < m.size; ++r)
    if (r != m.self.rank) all[r] = m.read(r, key);
  return all;
}

void PmixBootstrap::publish(std::span<const std::byte> mine) {
  Impl& m = *impl_;
  const std::string key = m.next_key();
  m.put(mine, key);
  m.fence(true, "every rank publishing its blob " + key);
  std::lock_guard lock(m.published_mutex);
  m.published = key;
}

Blob PmixBootstrap::fetch(std::uint32_t rank) const {
  const Impl& m = *impl_;
  if (rank >= m.size)
    throw Error(m.prefix() + "no rank " + std::to_string(rank) + " in a job of " + std::to_string(m.size));
  std::string key;
  {
    std::lock_guard lock(m.published_mutex);
    key = m.published;
  }
  if (key.empty()) throw Error(m.prefix() + "fetch of rank " + std::to_string(rank) + " before publish()");
  return m.read(rank, key);
}

// A fence that collects (nothing new): Slurm's mpi/pmix plugin runs fences
// that collect nothing on another collective (its tree) than those that do
// (its ring), and in a two-node step the tree fence was measured letting
// one node's ranks through before the other node's had entered (by
// seconds), so it is no barrier there; the collecting one is.
void PmixBootstrap::barrier() { impl_->fence(true, "barrier"); }

}  // namespace ami::bootstrap
