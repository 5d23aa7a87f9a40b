// The declarative configuration table, its environment reader, lookups by
// name, and the memory budget of a client's settings.
#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

#include "ami/client.hpp"
#include "ami/config.hpp"
#include "ami/error.hpp"
#include "transport/src/memory_budget.hpp"

// Expect: a name known only at run time never converts silently; it goes
// through ParamName::lookup(). (That a misspelt literal does not compile is
// the config_name_checked test: compile_fail_config_name.cpp.)
template <class Name>
concept looks_up = requires(const ami::Config& c, Name name) { c.number(name); };
static_assert(looks_up<ami::ParamName>);
static_assert(!looks_up<std::string_view>);
static_assert(!looks_up<const char*>);
static_assert(!looks_up<std::string>);
static_assert(ami::ParamName("AMI_SIZE").name() == "AMI_SIZE");
static_assert(ami::ParamName("AMI_FIFO_DEPTH").spec().type == ami::ParamType::power_of_two);

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
  for (const ami::ParamSpec& p : ami::config_table()) {
    CHECK(c.text(p) == p.default_value);
    CHECK(c.origin(p) == "default");
    CHECK_FALSE(p.doc.empty());
  }
  CHECK(c.number("AMI_FIFO_DEPTH") == 256);
}

TEST_CASE("environment overrides, unknown names get the closest match") {
  const char* env[] = {"PATH=/bin", "AMI_FIFO_DEPTH=64", "AMI_FIFO_DEPHT=32", "AMI_TOTALLY_UNRELATED_THING=1",
                       nullptr};
  std::vector<std::string> warnings;
  ami::Config c = ami::Config::from_environment(env, warnings);
  CHECK(c.number("AMI_FIFO_DEPTH") == 64);
  CHECK(c.origin("AMI_FIFO_DEPTH") == "environment");
  CHECK(c.origin("AMI_MAX_REQUESTS") == "default");
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
  CHECK(c.number("AMI_FIFO_DEPTH") == 256);  // a refused value changes nothing
  CHECK(c.origin("AMI_FIFO_DEPTH") == "default");
  CHECK(c.set("AMI_FIFO_DEPTH", "1024").ok());
  CHECK(c.number("AMI_FIFO_DEPTH") == 1024);
  CHECK(c.origin("AMI_FIFO_DEPTH") == "set");
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
       {ami::ParamName("AMI_FIFO_DEPTH"), ami::ParamName("AMI_MAX_REQUESTS"), ami::ParamName("AMI_SELF_QUEUE_DEPTH"),
        ami::ParamName("AMI_SELF_CELL_SIZE"), ami::ParamName("AMI_SHM_RING_DEPTH"),
        ami::ParamName("AMI_SHM_CELL_SIZE"), ami::ParamName("AMI_SIZE"), ami::ParamName("AMI_VERBS_SQ_DEPTH"),
        ami::ParamName("AMI_VERBS_SRQ_DEPTH"), ami::ParamName("AMI_VERBS_MAX_RDMA"),
        ami::ParamName("AMI_VERBS_BOUNCE_SIZE"), ami::ParamName("AMI_VERBS_GID_INDEX"),
        ami::ParamName("AMI_MAX_REGIONS"), ami::ParamName("AMI_ACK_MAX_UNACKED"),
        ami::ParamName("AMI_RCACHE_MAX_ENTRIES"), ami::ParamName("AMI_RCACHE_MAX_MB"),
        ami::ParamName("AMI_COLL_EAGER_MAX")}) {
    bool stated = false;
    for (const std::string& t : bound_texts(name.spec().max)) stated = stated || contains(name.spec().doc, t);
    CHECK_MESSAGE(stated, (std::string(name.name()) + " does not state its bound in its doc"));
  }
}

TEST_CASE("\"auto\" where the table allows it, checked like any other value") {
  ami::Config c;
  CHECK_FALSE(c.number_or_auto("AMI_VERBS_MTU").has_value());  // the default
  CHECK(c.set("AMI_VERBS_MTU", "1000") == ami::StatusCode::invalid_argument);  // not a power of two
  CHECK(c.set("AMI_VERBS_MTU", "8192") == ami::StatusCode::invalid_argument);  // above the maximum
  CHECK(c.set("AMI_VERBS_MTU", "1024").ok());
  CHECK(c.number_or_auto("AMI_VERBS_MTU") == 1024u);
  CHECK(c.set("AMI_VERBS_MTU", "auto").ok());
  CHECK_FALSE(c.number_or_auto("AMI_VERBS_MTU").has_value());
  CHECK(c.set("AMI_VERBS_CM", "maybe") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_VERBS_CM", "off").ok());
  CHECK(c.number_or_auto("AMI_VERBS_CM") == 0u);
  CHECK(c.set("AMI_FIFO_DEPTH", "auto") == ami::StatusCode::invalid_argument);  // not allowed there
}

TEST_CASE("a name known only at run time is looked up, and an unknown one throws naming the closest") {
  ami::Config c;
  const std::string typed = "AMI_FIFO_DEPTH";  // as a tool would read it
  CHECK(c.number(ami::ParamName::lookup(typed)) == 256);
  CHECK(ami::ParamName::lookup(typed).index() == ami::ParamName("AMI_FIFO_DEPTH").index());
  CHECK_THROWS_WITH_AS((void)ami::ParamName::lookup("AMI_FIFO_DEPHT"),
                       "config: no parameter is named 'AMI_FIFO_DEPHT' (the closest known name is AMI_FIFO_DEPTH)",
                       ami::Error);
  // However far the name is, the error still names the closest.
  const std::string far = error_of([] { (void)ami::ParamName::lookup("AMI_TOTALLY_UNRELATED_THING"); });
  CHECK(contains(far, "'AMI_TOTALLY_UNRELATED_THING'"));
  CHECK(contains(far, "the closest known name is AMI_"));
  // A row that is not the table's, by name.
  const ami::ParamSpec stray{"AMI_STRAY", "1", ami::ParamType::unsigned_int, 0, 1, "not in the table"};
  CHECK_THROWS_AS((void)c.number(stray), ami::Error);
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
  for (int c = 0; c <= static_cast<int>(ami::StatusCode::not_supported); ++c)
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
