// The declarative configuration tables, each component's and their union,
// the environment reader, lookups by name, each component's typed options,
// and the memory budget of a client's settings.
#include <doctest/doctest.h>

#include <algorithm>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ami/client.hpp"
#include "ami/config.hpp"
#include "ami/error.hpp"
#include "ami/collectives_config.hpp"
#include "core_config.hpp"
#include "memory_budget.hpp"
#include "protocol_config.hpp"
#include "self_config.hpp"
#include "shm_config.hpp"
#include "ofi_config.hpp"
#include "ofi_wire.hpp"
#include "verbs_domain.hpp"

namespace core = ami::core;
namespace protocol = ami::protocol;
namespace self = ami::self;
namespace shm = ami::shm;
namespace verbs = ami::verbs;
namespace ofi = ami::ofi;

// Expect: a name known only at run time never converts silently; it goes
// through ParamName::lookup(). (That a misspelt literal does not compile is
// the config_name_checked test: compile_fail_config_name.cpp.) A literal
// alone is no name either: it is named through its component's table.
template <class Name>
concept looks_up = requires(const ami::Config& c, Name name) { c.number(name); };
static_assert(looks_up<ami::ParamName>);
static_assert(!looks_up<std::string_view>);
static_assert(!looks_up<const char*>);
static_assert(!looks_up<std::string>);
static_assert(looks_up<core::Param>);
static_assert(looks_up<verbs::Param>);
static_assert(core::Param("AMI_SIZE").name() == "AMI_SIZE");
static_assert(core::Param("AMI_FIFO_DEPTH").spec().type == ami::ParamType::power_of_two);
static_assert(ami::ParamName(shm::Param("AMI_SHM_CMA")).name() == "AMI_SHM_CMA");

namespace {

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const ami::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

}  // namespace

TEST_CASE("defaults come from the table") {
  ami::Config c;
  for (const ami::ParamGroup& g : ami::config_groups())
    for (const ami::ParamSpec& p : g.rows) {
      CHECK(c.text(p) == p.default_value);
      CHECK(c.origin(p) == "default");
      CHECK_FALSE(p.doc.empty());
    }
  CHECK(c.number(core::Param("AMI_FIFO_DEPTH")) == 256);
}

TEST_CASE("environment overrides, unknown names get the closest match") {
  const char* env[] = {"PATH=/bin", "AMI_FIFO_DEPTH=64", "AMI_FIFO_DEPHT=32", "AMI_TOTALLY_UNRELATED_THING=1",
                       nullptr};
  std::vector<std::string> warnings;
  ami::Config c = ami::Config::from_environment(env, warnings);
  CHECK(c.number(core::Param("AMI_FIFO_DEPTH")) == 64);
  CHECK(c.origin(core::Param("AMI_FIFO_DEPTH")) == "environment");
  CHECK(c.origin(protocol::Param("AMI_MAX_REQUESTS")) == "default");
  REQUIRE(warnings.size() == 2);
  CHECK(warnings[0] == "unknown variable AMI_FIFO_DEPHT (did you mean AMI_FIFO_DEPTH?)");
  CHECK(warnings[1] == "unknown variable AMI_TOTALLY_UNRELATED_THING");
}

TEST_CASE("a value that cannot be right stops the reader, naming variable, value and range") {
  std::vector<std::string> warnings;
  SUBCASE("out of range") {
    const char* env[] = {"AMI_SIZE=0", nullptr};
    const std::string e = error_of([&] { (void)ami::Config::from_environment(env, warnings); });
    CHECK(e == "configuration: AMI_SIZE=0 is out of range (allowed: a number from 1 to 1048576)");
  }
  SUBCASE("malformed, not a power of two, beyond 64 bits, a word not among the choices") {
    const char* env[] = {"AMI_MAX_REQUESTS=oops", "AMI_FIFO_DEPTH=100", "AMI_COLL_RING_MIN=99999999999999999999999",
                         "AMI_RNDV_MODE=eager", "AMI_FIFO_DEPHT=32", nullptr};
    const std::string e = error_of([&] { (void)ami::Config::from_environment(env, warnings); });
    CHECK(contains(e, "AMI_MAX_REQUESTS=oops is not valid (allowed: a number from 1 to 1048576)"));
    CHECK(contains(e, "AMI_FIFO_DEPTH=100 is not a power of two (allowed: a power of two from 4 to 65536)"));
    CHECK(contains(e, "AMI_COLL_RING_MIN=99999999999999999999999 is out of range"));
    CHECK(contains(e, "AMI_RNDV_MODE=eager is not valid (allowed: one of auto,discard_get,split_get,stop_put)"));
    // The unknown name is still reported, as a warning.
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0] == "unknown variable AMI_FIFO_DEPHT (did you mean AMI_FIFO_DEPTH?)");
  }
  SUBCASE("auto where the table does not allow it, and where it does") {
    const char* env[] = {"AMI_VERBS_MTU=auto", "AMI_FIFO_DEPTH=auto", nullptr};
    CHECK(error_of([&] { (void)ami::Config::from_environment(env, warnings); }) ==
          "configuration: AMI_FIFO_DEPTH=auto is not valid (allowed: a power of two from 4 to 65536)");
  }
  SUBCASE("a secret is not shown, even when refused") {
    const std::string key = "AMI_JOB_KEY=" + std::string(300, 's');
    const char* env[] = {key.c_str(), nullptr};
    const std::string e = error_of([&] { (void)ami::Config::from_environment(env, warnings); });
    CHECK(e == "configuration: AMI_JOB_KEY=(300 bytes, not shown) is too long (allowed: text of at most 256 bytes)");
  }
}

TEST_CASE("values are checked against type and range") {
  ami::Config c;
  CHECK(c.set("AMI_FIFO_DEPTH", "100") == ami::StatusCode::invalid_argument);  // not a power of two
  CHECK(c.set("AMI_FIFO_DEPTH", "2") == ami::StatusCode::invalid_argument);    // below the minimum
  CHECK(c.set("AMI_FIFO_DEPTH", "16x") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_FIFO_DEPTH", "") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_FIFO_DEPTH", "+16") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_NOPE", "1") == ami::StatusCode::invalid_argument);
  CHECK(std::string_view(c.set("AMI_FIFO_DEPTH", "100").what()) == "config: the value is not a power of two");
  CHECK(c.number(core::Param("AMI_FIFO_DEPTH")) == 256);  // a refused value changes nothing
  CHECK(c.origin(core::Param("AMI_FIFO_DEPTH")) == "default");
  CHECK(c.set("AMI_FIFO_DEPTH", "1024").ok());
  CHECK(c.number(core::Param("AMI_FIFO_DEPTH")) == 1024);
  CHECK(c.origin(core::Param("AMI_FIFO_DEPTH")) == "set");
  CHECK(c.set("AMI_JOB_KEY", std::string(256, 'k')).ok());
  CHECK(c.set("AMI_JOB_KEY", std::string(257, 'k')) == ami::StatusCode::invalid_argument);
}

TEST_CASE("AMI_SIZE, AMI_RANK and the other size-like settings are bounded, and say so") {
  ami::Config c;
  CHECK(c.set("AMI_SIZE", "1048576").ok());
  CHECK(c.set("AMI_SIZE", "1048577") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_SIZE", "100000000") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_RANK", "1048575").ok());
  CHECK(c.set("AMI_RANK", "1048576") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_VERBS_GID_INDEX", "256") == ami::StatusCode::invalid_argument);  // an 8-bit field
  CHECK(c.set("AMI_VERBS_BOUNCE_SIZE", "256") == ami::StatusCode::invalid_argument);  // below the inline bytes
  // Expect: each doc states its bound, as a number or in binary units.
  auto bound_texts = [](std::uint64_t max) {
    std::vector<std::string> out{std::to_string(max)};
    const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
    for (int i = 0; i < 4 && max % 1024 == 0; ++i) {
      max /= 1024;
      out.push_back(std::to_string(max) + " " + units[i]);
    }
    return out;
  };
  for (const ami::ParamName name :
       {ami::ParamName(core::Param("AMI_FIFO_DEPTH")), ami::ParamName(protocol::Param("AMI_MAX_REQUESTS")), ami::ParamName(self::Param("AMI_SELF_QUEUE_DEPTH")),
        ami::ParamName(self::Param("AMI_SELF_CELL_SIZE")), ami::ParamName(shm::Param("AMI_SHM_RING_DEPTH")),
        ami::ParamName(shm::Param("AMI_SHM_CELL_SIZE")), ami::ParamName(core::Param("AMI_SIZE")), ami::ParamName(verbs::Param("AMI_VERBS_SQ_DEPTH")),
        ami::ParamName(verbs::Param("AMI_VERBS_SRQ_DEPTH")), ami::ParamName(verbs::Param("AMI_VERBS_MAX_RDMA")),
        ami::ParamName(verbs::Param("AMI_VERBS_BOUNCE_SIZE")), ami::ParamName(verbs::Param("AMI_VERBS_GID_INDEX")),
        ami::ParamName(core::Param("AMI_MAX_REGIONS")), ami::ParamName(protocol::Param("AMI_ACK_MAX_UNACKED")),
        ami::ParamName(core::Param("AMI_RCACHE_MAX_ENTRIES")), ami::ParamName(core::Param("AMI_RCACHE_MAX_MB")),
        ami::ParamName(ami::coll::Param("AMI_COLL_EAGER_MAX"))}) {
    bool stated = false;
    for (const std::string& t : bound_texts(name.spec().max)) stated = stated || contains(name.spec().doc, t);
    CHECK_MESSAGE(stated, (std::string(name.name()) + " does not state its bound in its doc"));
  }
}

TEST_CASE("\"auto\" where the table allows it, checked like any other value") {
  ami::Config c;
  CHECK_FALSE(c.number_or_auto(verbs::Param("AMI_VERBS_MTU")).has_value());  // the default
  CHECK(c.set("AMI_VERBS_MTU", "1000") == ami::StatusCode::invalid_argument);  // not a power of two
  CHECK(c.set("AMI_VERBS_MTU", "8192") == ami::StatusCode::invalid_argument);  // above the maximum
  CHECK(c.set("AMI_VERBS_MTU", "1024").ok());
  CHECK(c.number_or_auto(verbs::Param("AMI_VERBS_MTU")) == 1024u);
  CHECK(c.set("AMI_VERBS_MTU", "auto").ok());
  CHECK_FALSE(c.number_or_auto(verbs::Param("AMI_VERBS_MTU")).has_value());
  CHECK(c.set("AMI_VERBS_CM", "maybe") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_VERBS_CM", "off").ok());
  CHECK(c.number_or_auto(verbs::Param("AMI_VERBS_CM")) == 0u);
  CHECK(c.set("AMI_FIFO_DEPTH", "auto") == ami::StatusCode::invalid_argument);  // not allowed there
}

TEST_CASE("a name known only at run time is looked up, and an unknown one throws naming the closest") {
  ami::Config c;
  const std::string typed = "AMI_FIFO_DEPTH";  // as a tool would read it
  CHECK(c.number(ami::ParamName::lookup(typed)) == 256);
  CHECK(&ami::ParamName::lookup(typed).spec() == &core::Param("AMI_FIFO_DEPTH").spec());
  CHECK_THROWS_WITH_AS((void)ami::ParamName::lookup("AMI_FIFO_DEPHT"),
                       "config: no parameter is named 'AMI_FIFO_DEPHT' (the closest known name is AMI_FIFO_DEPTH)",
                       ami::Error);
  // However far the name is, the error still names the closest.
  const std::string far = error_of([] { (void)ami::ParamName::lookup("AMI_TOTALLY_UNRELATED_THING"); });
  CHECK(contains(far, "'AMI_TOTALLY_UNRELATED_THING'"));
  CHECK(contains(far, "the closest known name is AMI_"));
  // A row no component declares.
  const ami::ParamSpec stray{"AMI_STRAY", "1", ami::ParamType::unsigned_int, 0, 1, "not in the table"};
  CHECK_THROWS_AS((void)c.number(stray), ami::Error);
}

TEST_CASE("the union holds every component's rows once") {
  const std::span<const ami::ParamGroup> groups = ami::config_groups();
  // The core's, the protocol's, the collectives', then each registered backend's.
  std::vector<std::string_view> components;
  for (const ami::ParamGroup& g : groups) components.push_back(g.component);
  CHECK(components == std::vector<std::string_view>{"core", "protocol", "collectives", "self", "shm", "verbs", "ofi"});
  auto groups_holding = [&](std::span<const ami::ParamSpec> rows) {
    int found = 0;
    for (const ami::ParamGroup& g : groups) found += g.rows.data() == rows.data() && g.rows.size() == rows.size();
    return found;
  };
  CHECK(groups_holding(core::kParams) == 1);
  CHECK(groups_holding(protocol::kParams) == 1);
  CHECK(groups_holding(ami::coll::kParams) == 1);
  CHECK(groups_holding(self::kParams) == 1);
  CHECK(groups_holding(shm::kParams) == 1);
  CHECK(groups_holding(verbs::kParams) == 1);
  CHECK(groups_holding(ofi::kParams) == 1);
  // No name in two components, and each name found where it is declared.
  std::vector<std::string_view> names;
  for (const ami::ParamGroup& g : groups)
    for (const ami::ParamSpec& p : g.rows) {
      CHECK_MESSAGE(std::count(names.begin(), names.end(), p.name) == 0, p.name);
      names.push_back(p.name);
      CHECK(&ami::ParamName::lookup(p.name).spec() == &p);
    }
  CHECK(names.size() == std::size(core::kParams) + std::size(protocol::kParams) + std::size(ami::coll::kParams) + std::size(self::kParams) +
                            std::size(shm::kParams) + std::size(verbs::kParams) + std::size(ofi::kParams));
}

TEST_CASE("each row's default is a value of its own type and bounds") {
  for (const ami::ParamGroup& g : ami::config_groups()) {
    CHECK(ami::rows_are_sound(g.rows));
    for (const ami::ParamSpec& p : g.rows) {
      ami::Config c;
      CHECK_MESSAGE(c.set(p.name, p.default_value).ok(), p.name);
      CHECK(c.text(p) == p.default_value);
    }
  }
}

TEST_CASE("each component's typed options from a Config of defaults are its defaults") {
  const ami::Config defaults;
  CHECK(core::Options::from(defaults) == core::Options{});
  CHECK(protocol::Options::from(defaults) == protocol::Options{});
  CHECK(ami::coll::Options::from(defaults) == ami::coll::Options{});
  CHECK(self::Options::from(defaults) == self::Options{});
  CHECK(shm::Options::from(defaults) == shm::Options{});
  CHECK(verbs::VerbsOptions::from(defaults) == verbs::VerbsOptions{});
  // The figures the rows say, taken from them.
  CHECK(core::Options{}.fifo_depth == 256);
  CHECK_FALSE(core::Options{}.rcache_idle.has_value());  // auto
  CHECK(protocol::Options{}.rndv_mode == protocol::rndv::Mode::automatic);
  CHECK_FALSE(protocol::Options{}.rndv_crossover.has_value());  // auto
  CHECK(shm::Options{}.cma);
  CHECK(verbs::VerbsOptions{}.timeout == 14);
}

TEST_CASE("a value in the environment reaches each component's typed field") {
  const char* env[] = {"AMI_FIFO_DEPTH=64",       "AMI_RCACHE_IDLE=3",       "AMI_REACHABILITY=symmetric",
                       "AMI_ACK_MAX_UNACKED=5",   "AMI_RNDV_MODE=split_get", "AMI_COLL_RING_MIN=4096",
                       "AMI_SELF_CELL_SIZE=1024", "AMI_SHM_CMA=off",         "AMI_SHM_RING_DEPTH=16",
                       "AMI_VERBS_TIMEOUT=20",    "AMI_VERBS_MTU=1024",      "AMI_NET_DEVICES=rxe0:1",
                       nullptr};
  std::vector<std::string> warnings;
  const ami::Config c = ami::Config::from_environment(env, warnings);
  CHECK(warnings.empty());
  const core::Options o = core::Options::from(c);
  CHECK(o.fifo_depth == 64);
  CHECK(o.rcache_idle == 3u);
  CHECK(o.reachability == core::Reachability::symmetric);
  const protocol::Options p = protocol::Options::from(c);
  CHECK(p.ack_max_unacked == 5);
  CHECK(p.rndv_mode == protocol::rndv::Mode::split_get);
  CHECK(ami::coll::Options::from(c).ring_min == 4096);
  CHECK(self::Options::from(c).cell_bytes == 1024);
  CHECK_FALSE(shm::Options::from(c).cma);
  CHECK(shm::Options::from(c).queue_depth == 16);
  const verbs::VerbsOptions v = verbs::VerbsOptions::from(c);
  CHECK(v.timeout == 20);
  CHECK(v.mtu_cap == IBV_MTU_1024);
  CHECK(v.net_devices == "rxe0:1");
}

TEST_CASE("the settings' memory is checked against the host before a client allocates it") {
  ami::Config defaults;
  // Expect: the defaults fit any host, for a few contexts in a small job.
  CHECK_NOTHROW(ami::check_memory_budget(defaults, 4, 16));

  ami::Config deep;
  REQUIRE(deep.set("AMI_SELF_QUEUE_DEPTH", "65536").ok());
  REQUIRE(deep.set("AMI_SELF_CELL_SIZE", "4194304").ok());
  // 256 GiB per context; 64 contexts are 16 TiB, more than half of any host.
  const std::string e = error_of([&] { ami::check_memory_budget(deep, 64, 1); });
  CHECK(contains(e, "lower the first of: self queues: AMI_SELF_QUEUE_DEPTH x AMI_SELF_CELL_SIZE x contexts = "
                    "65536 x 4194304 x 64 = "));
  CHECK(contains(e, "bytes (16.0 TiB)"));
  CHECK(contains(e, "a client may take (half of this host's memory, or of RLIMIT_AS when lower)"));
  CHECK(ami::memory_budget_limit() > 0);

  // Against a given limit: the groups' sum is the line.
  ami::Config requests;
  REQUIRE(requests.set("AMI_MAX_REQUESTS", "1048576").ok());
  std::uint64_t need = 0;
  for (const ami::MemoryDemand& d : ami::memory_demands(requests, 16, 2)) need += d.bytes;
  CHECK_NOTHROW(ami::check_memory_budget(requests, 16, 2, need));
  const std::string r = error_of([&] { ami::check_memory_budget(requests, 16, 2, need - 1); });
  CHECK(contains(r, "lower the first of: requests: AMI_MAX_REQUESTS x contexts x bytes per request = 1048576 x 16 x "));
  CHECK(contains(r, "more than the " + std::to_string(need - 1) + " bytes"));

  // Deep FIFOs count per lane, for the lanes to one peer task (lanes are
  // made on first use): every context to every context of it.
  ami::Config fifo;
  REQUIRE(fifo.set("AMI_FIFO_DEPTH", "65536").ok());
  const auto demands = ami::memory_demands(fifo, 4, 1024);
  bool named = false;
  for (const ami::MemoryDemand& d : demands)
    if (d.what.starts_with("injection FIFOs")) named = d.figures.starts_with("65536 x 16 x ");
  CHECK(named);
  CHECK_THROWS_AS(ami::check_memory_budget(fifo, 4, 1024, std::uint64_t{1} << 28), ami::Error);

  // The ofi backend's share: each context's multi-receive buffers and its
  // rescue receive's packet (AMI_OFI_PACKET_SIZE and room for the headers;
  // with auto, the largest auto gives).
  ami::Config ofi_set;
  REQUIRE(ofi_set.set("AMI_BACKENDS", "ofi").ok());
  REQUIRE(ofi_set.set("AMI_OFI_PACKET_SIZE", "8192").ok());
  std::uint64_t rescue = 0, buffers = 0;
  for (const ami::MemoryDemand& d : ami::memory_demands(ofi_set, 3, 2)) {
    if (d.what.starts_with("ofi rescue receive")) rescue = d.bytes;
    if (d.what.starts_with("ofi receive buffers")) buffers = d.bytes;
  }
  CHECK(buffers == 3 * 4 * (std::uint64_t{1} << 20));
  CHECK(rescue == 3 * (8192 + ofi::kHeadroom + ofi::kHeaderBytes));
  ami::Config ofi_auto;
  REQUIRE(ofi_auto.set("AMI_BACKENDS", "ofi").ok());
  rescue = 0;
  for (const ami::MemoryDemand& d : ami::memory_demands(ofi_auto, 3, 2))
    if (d.what.starts_with("ofi rescue receive")) rescue = d.bytes;
  CHECK(rescue >= 3 * (65536 + ofi::kHeadroom + ofi::kHeaderBytes));

  // The largest settings on the most contexts: products add up without
  // wrapping to a small number.
  ami::Config huge;
  REQUIRE(huge.set("AMI_MAX_REQUESTS", "1048576").ok());
  REQUIRE(huge.set("AMI_SELF_QUEUE_DEPTH", "65536").ok());
  REQUIRE(huge.set("AMI_SELF_CELL_SIZE", "4194304").ok());
  CHECK_THROWS_AS(ami::check_memory_budget(huge, 65535, 1u << 20, std::uint64_t{1} << 50), ami::Error);
}

TEST_CASE("status text names the problem") {
  ami::Status s{ami::StatusCode::invalid_argument, "send: payload is null"};
  CHECK(ami::to_string(s) == "invalid_argument: send: payload is null");
  CHECK(ami::to_string(ami::Status::success()) == "ok");
  for (int c = 0; c <= static_cast<int>(ami::StatusCode::busy); ++c)
    CHECK(ami::to_string(static_cast<ami::StatusCode>(c)) != "unknown_status");
}

// A self queue of 65536 x 4 MiB cells used to end in std::bad_alloc, and
// AMI_MAX_REQUESTS=1048576 in seconds of allocation: the Client refuses
// such settings before it allocates, naming them; a job too large for ami
// given in code is refused like AMI_SIZE.
TEST_CASE("a Client refuses settings it could not back, and a job size beyond the bound") {
  ami::ClientOptions o;
  REQUIRE(o.config.set("AMI_SELF_QUEUE_DEPTH", "65536").ok());
  REQUIRE(o.config.set("AMI_SELF_CELL_SIZE", "4194304").ok());
  try {
    ami::Client client(o);
    FAIL("the Client was built");
  } catch (const ami::Error& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find("AMI_SELF_QUEUE_DEPTH") != std::string::npos);
    CHECK(what.find("AMI_SELF_CELL_SIZE") != std::string::npos);
  }
  ami::ClientOptions big;
  big.job = {.rank = 0, .size = 5'000'000, .bootstrap = "127.0.0.1:1"};
  try {
    ami::Client client(big);
    FAIL("the Client was built");
  } catch (const ami::Error& e) {
    CHECK(std::string(e.what()).find("more than ami serves") != std::string::npos);
  }
}
