// client.cpp — a job's view from one task: configuration, registrations,
// the backends' shared state and the contexts.
#include "ami/client.hpp"

#include <mutex>
#include <random>

#include "ami/device/region_table.hpp"
#include "ami/error.hpp"
#include "context_impl.hpp"

namespace ami {

namespace {

std::uint64_t random_job_id() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}

}  // namespace

struct Client::Impl {
  Impl(ClientOptions o)
      : name(std::move(o.name)), config(std::move(o.config)), job(random_job_id()),
        regions(job, 0, static_cast<std::uint32_t>(config.number("AMI_MAX_REGIONS"))),
        self_domain(0, o.contexts, static_cast<std::uint32_t>(config.number("AMI_RECV_QUEUE_DEPTH")),
                    static_cast<std::uint32_t>(config.number("AMI_CELL_SIZE")), regions) {}

  std::string name;
  Config config;
  std::uint32_t task = 0;
  std::uint32_t size = 1;
  std::uint64_t job;
  std::mutex registration_mutex;
  device::RegionTable regions;
  self::SelfDomain self_domain;
  std::vector<std::unique_ptr<Context>> contexts;  // last: destroyed first
};

Client::Client(ClientOptions options) {
  if (options.contexts == 0) throw Error("Client: contexts must be at least 1");
  const std::uint16_t n = options.contexts;
  impl_ = std::make_unique<Impl>(std::move(options));
  const protocol::AmEngine::Shape shape{
      impl_->size, n, static_cast<std::uint32_t>(impl_->config.number("AMI_MAX_REQUESTS"))};
  const auto fifo_depth = static_cast<std::uint32_t>(impl_->config.number("AMI_FIFO_DEPTH"));
  for (std::uint16_t i = 0; i < n; ++i)
    impl_->contexts.push_back(std::unique_ptr<Context>(new Context(
        std::make_unique<detail::ContextImpl>(*this, i, impl_->self_domain, fifo_depth, shape))));
}

Client::~Client() = default;

const std::string& Client::name() const { return impl_->name; }
std::uint32_t Client::task() const { return impl_->task; }
std::uint32_t Client::size() const { return impl_->size; }
std::uint64_t Client::job() const { return impl_->job; }
std::uint16_t Client::context_count() const { return static_cast<std::uint16_t>(impl_->contexts.size()); }
Context& Client::context(std::uint16_t index) { return *impl_->contexts.at(index); }
const Config& Client::config() const { return impl_->config; }

Status Client::register_memory(void* address, std::size_t length, Memory& out) {
  if (address == nullptr && length != 0)
    return {StatusCode::invalid_argument, "register_memory: address is null but length is not zero"};
  if (length == 0) return {StatusCode::invalid_argument, "register_memory: length is zero"};
  RemoteKey key;
  {
    std::lock_guard lock(impl_->registration_mutex);
    Status s = impl_->regions.add(address, length, key);
    if (!s.ok()) return s;
  }
  out = Memory(&impl_->regions, key.region, key, address, length);
  return Status::success();
}

}  // namespace ami
