// Which bootstrap a Client's job uses (AMI_BOOTSTRAP_MODE): the decision
// itself, what counts as a job given by hand, and what a Client does with a
// launcher's environment it cannot reach or without one. Jobs really started
// by mpirun are in tests/mpi.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <optional>
#include <string>

#include "ami/ami.hpp"
#include "core_config.hpp"
#include "job_bootstrap.hpp"
#include "pmix_bootstrap.hpp"

// Under LeakSanitizer: libpmix keeps a few bytes of PMIx_Init (a failed
// one too) past PMIx_Finalize, which are not ours to free.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpmix.so\n"; }

using ami::bootstrap::Kind;
using ami::bootstrap::Mode;

namespace {

// Sets (or with nullptr, unsets) an environment variable for one scope.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    if (value != nullptr) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvVar() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// As if no launcher had started this process (nor a PMIx one the tests
// themselves might run under).
struct NoLauncher {
  EnvVar nspace{"PMIX_NAMESPACE", nullptr};
  EnvVar rank{"PMIX_RANK", nullptr};
};

std::string error_of(const ami::ClientOptions& options) {
  try {
    ami::Client client(options);
  } catch (const ami::Error& e) {
    return e.what();
  }
  return "";
}

ami::Config with(const char* name, const char* value) {
  ami::Config c;
  REQUIRE(c.set(name, value).ok());
  return c;
}

}  // namespace

TEST_CASE("auto takes PMIx only under a PMIx launcher and only when the job is not given by hand") {
  // Expect: the table of the README, row by row.
  CHECK(ami::bootstrap::choose(Mode::automatic, false, false) == Kind::tcp);
  CHECK(ami::bootstrap::choose(Mode::automatic, false, true) == Kind::tcp);
  CHECK(ami::bootstrap::choose(Mode::automatic, true, false) == Kind::pmix);
  CHECK(ami::bootstrap::choose(Mode::automatic, true, true) == Kind::tcp);
  CHECK(ami::bootstrap::choose(Mode::tcp, true, false) == Kind::tcp);
  CHECK(ami::bootstrap::choose(Mode::pmix, true, true) == Kind::pmix);
  CHECK_THROWS_WITH_AS(ami::bootstrap::choose(Mode::pmix, false, false),
                       doctest::Contains("no PMIx launcher started this process"), ami::Error);
}

TEST_CASE("a job is given by hand through JobOptions or AMI_RANK, AMI_SIZE, AMI_BOOTSTRAP") {
  const ami::Config none;
  CHECK_FALSE(ami::bootstrap::job_given({}, none));
  CHECK(ami::bootstrap::job_given({.rank = 0}, none));
  CHECK(ami::bootstrap::job_given({.size = 2}, none));
  CHECK(ami::bootstrap::job_given({.bootstrap = "127.0.0.1:7000"}, none));
  CHECK(ami::bootstrap::job_given({}, with("AMI_RANK", "1")));
  CHECK(ami::bootstrap::job_given({}, with("AMI_SIZE", "1")));  // even the default value, when set
  CHECK(ami::bootstrap::job_given({}, with("AMI_BOOTSTRAP", "h:1")));
  CHECK_FALSE(ami::bootstrap::job_given({}, with("AMI_FIFO_DEPTH", "64")));
}

TEST_CASE("AMI_BOOTSTRAP_MODE takes auto, pmix or tcp") {
  ami::Config c;
  CHECK(c.text(ami::core::Param("AMI_BOOTSTRAP_MODE")) == "auto");
  CHECK(c.number(ami::core::Param("AMI_BOOTSTRAP_MODE")) == static_cast<std::uint64_t>(Mode::automatic));
  CHECK(c.set("AMI_BOOTSTRAP_MODE", "pmix").ok());
  CHECK(c.number(ami::core::Param("AMI_BOOTSTRAP_MODE")) == static_cast<std::uint64_t>(Mode::pmix));
  CHECK(c.set("AMI_BOOTSTRAP_MODE", "tcp").ok());
  CHECK(c.number(ami::core::Param("AMI_BOOTSTRAP_MODE")) == static_cast<std::uint64_t>(Mode::tcp));
  CHECK(c.set("AMI_BOOTSTRAP_MODE", "mpi") == ami::StatusCode::invalid_argument);
}

TEST_CASE("without a launcher: a job of one over TCP, and pmix refused with the reason") {
  NoLauncher none;
  CHECK_FALSE(ami::bootstrap::launched_by_pmix());
  {
    ami::Client client;
    CHECK(client.bootstrap_name() == "tcp");
    CHECK(client.task() == 0);
    CHECK(client.size() == 1);
  }
  const std::string error = error_of({.config = with("AMI_BOOTSTRAP_MODE", "pmix")});
  CHECK(error.find("AMI_BOOTSTRAP_MODE=pmix, but no PMIx launcher started this process") != std::string::npos);
  CHECK(error.find("mpirun") != std::string::npos);
}

TEST_CASE("a launcher's environment without its server: PMIx_Init's error, unless the job is given by hand") {
  EnvVar nspace("PMIX_NAMESPACE", "ami-test-no-such-namespace");
  EnvVar rank("PMIX_RANK", "0");
  CHECK(ami::bootstrap::launched_by_pmix());
  const std::string error = error_of({});
  CAPTURE(error);
  CHECK(error.find("bootstrap: pmix: PMIx_Init failed: ") != std::string::npos);
  CHECK(error.find("ami-test-no-such-namespace") != std::string::npos);

  // Expect: a job given by hand, or tcp, never touches PMIx.
  ami::Client given({.job = {.rank = 0, .size = 1}});
  CHECK(given.bootstrap_name() == "tcp");
  ami::Client forced({.config = with("AMI_BOOTSTRAP_MODE", "tcp")});
  CHECK(forced.bootstrap_name() == "tcp");
  CHECK(forced.size() == 1);
}
