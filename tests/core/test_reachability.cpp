// Reachability is decided by each task alone (AMI_BACKENDS, a segment it
// could map, a queue pair it could connect); the job forms only when every
// pair agrees, and a job that is not whole fails at creation on every task
// with an error naming the pair.
#include <doctest/doctest.h>
#include <cstdio>
#include <string>
#include <vector>

#include "ami/ami.hpp"
#include "jobs.hpp"
#include "reachability.hpp"

using namespace ami;

namespace {

std::string error_of(const std::vector<bootstrap::Blob>& reports, bool symmetric) {
  const std::vector<std::string> hosts{"h0", "h1", "h2"};
  try {
    detail::check_reachability(reports, hosts, symmetric);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Runs a job of two whose ranks have their own configurations; each rank
// runs script (or, if its Client throws, error) and exits with its code.
std::vector<int> two_ranks(const Config& c0, const Config& c1, const test::Script& script,
                           int (*error)(const std::string&)) {
  const std::string key = make_job_key();
  auto options = [&](std::uint32_t r, const std::string& address) {
    Config c = r == 0 ? c0 : c1;
    REQUIRE(c.set("AMI_JOB_KEY", key).ok());
    return test::job(r, 2, address, c);
  };
  return test::wait_all(test::spawn_ranks(2, options, {script, script}, error), std::chrono::seconds(60));
}

}  // namespace

TEST_CASE("the reachability check names the first pair that is not joined") {
  const auto report = [](std::vector<detail::Unreachable> l) { return detail::encode_unreachable(l); };
  const bootstrap::Blob none = report({});
  SUBCASE("every pair joined") {
    CHECK(error_of({none, none, none}, false).empty());
  }
  SUBCASE("one way only: refused even when pairs may be apart") {
    const auto reports = {report({{2, "its shared-memory segment cannot be used"}}), none, none};
    for (const bool symmetric : {false, true}) {
      const std::string e = error_of(reports, symmetric);
      CAPTURE(e);
      CHECK(e.find("task 0 (h0) cannot reach task 2 (h2), though task 2 (h2) reaches it") != std::string::npos);
      CHECK(e.find("its shared-memory segment cannot be used") != std::string::npos);
    }
  }
  SUBCASE("apart both ways: refused unless the job allows it") {
    const auto reports = {none, report({{2, "it is on another host"}}), report({{1, "it is on another host"}})};
    const std::string e = error_of(reports, false);
    CHECK(e.find("task 1 (h1) cannot reach task 2 (h2): it is on another host") != std::string::npos);
    CHECK(e.find("AMI_REACHABILITY=symmetric") != std::string::npos);
    CHECK(error_of(reports, true).empty());
  }
  SUBCASE("a malformed or lying report is an error, not a crash") {
    bootstrap::Blob cut = report({{1, "x"}});
    cut.pop_back();
    CHECK(error_of({cut, none, none}, false).find("malformed reachability report") != std::string::npos);
    CHECK(error_of({report({{0, "x"}}), none, none}, false).find("not a peer") != std::string::npos);
    CHECK(error_of({report({{7, "x"}}), none, none}, false).find("not a peer") != std::string::npos);
  }
}

namespace {

int expect_unreachable_error(const std::string& what) {
  std::printf("%s\n", what.c_str());
  return what.find("cannot reach") != std::string::npos &&
                 what.find("AMI_BACKENDS") != std::string::npos && what.find("leaves out shm") != std::string::npos
             ? 0
             : 3;
}

int unexpected_error(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  return 4;
}

}  // namespace

// AMI_BACKENDS=self on one rank used to be ignored by that rank: it still
// wrote into its peer's ring while the peer, which honoured the setting,
// had no lane back, and its barrier never ended.
TEST_CASE("AMI_BACKENDS=self on one rank binds that rank, and both ranks learn it at creation") {
  Config self_only;
  REQUIRE(self_only.set("AMI_BACKENDS", "self").ok());
  const Config defaults;
  auto formed = [](Client&) { return 5; };  // must not happen
  CHECK(two_ranks(defaults, self_only, formed, expect_unreachable_error) == std::vector<int>{0, 0});
  CHECK(two_ranks(self_only, defaults, formed, expect_unreachable_error) == std::vector<int>{0, 0});

  // A job that means its tasks to be apart says so; then neither reaches
  // the other, both ways alike.
  Config apart = self_only;
  REQUIRE(apart.set("AMI_REACHABILITY", "symmetric").ok());
  Config other = defaults;
  REQUIRE(other.set("AMI_REACHABILITY", "symmetric").ok());
  auto neither = [](Client& client) {
    Context& c = client.context(0);
    const Endpoint peer{1 - client.task(), 0};
    if (!c.backend_for(peer).empty()) return 6;
    if (c.send_immediate({.dest = peer, .dispatch = 1}) != StatusCode::unreachable) return 7;
    return 0;
  };
  CHECK(two_ranks(apart, other, neither, unexpected_error) == std::vector<int>{0, 0});
}
