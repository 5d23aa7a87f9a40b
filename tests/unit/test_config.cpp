// The declarative configuration table and its environment reader.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ami/config.hpp"

TEST_CASE("defaults come from the table") {
  ami::Config c;
  for (const ami::ParamSpec& p : ami::config_table()) {
    CHECK(c.text(p.name) == p.default_value);
    CHECK(c.origin(p.name) == "default");
    CHECK_FALSE(p.doc.empty());
  }
  CHECK(c.number("AMI_FIFO_DEPTH") == 256);
}

TEST_CASE("environment overrides, unknown names get the closest match") {
  const char* env[] = {"PATH=/bin", "AMI_FIFO_DEPTH=64", "AMI_FIFO_DEPHT=32",
                       "AMI_MAX_REQUESTS=oops", "AMI_TOTALLY_UNRELATED_THING=1", nullptr};
  std::vector<std::string> warnings;
  ami::Config c = ami::Config::from_environment(env, warnings);
  CHECK(c.number("AMI_FIFO_DEPTH") == 64);
  CHECK(c.origin("AMI_FIFO_DEPTH") == "environment");
  CHECK(c.number("AMI_MAX_REQUESTS") == 1024);  // bad value: default kept
  REQUIRE(warnings.size() == 3);
  CHECK(warnings[0] == "unknown variable AMI_FIFO_DEPHT (did you mean AMI_FIFO_DEPTH?)");
  CHECK(warnings[1].find("AMI_MAX_REQUESTS=oops") != std::string::npos);
  CHECK(warnings[2] == "unknown variable AMI_TOTALLY_UNRELATED_THING");
}

TEST_CASE("values are checked against type and range") {
  ami::Config c;
  CHECK(c.set("AMI_FIFO_DEPTH", "100") == ami::StatusCode::invalid_argument);  // not a power of two
  CHECK(c.set("AMI_FIFO_DEPTH", "2") == ami::StatusCode::invalid_argument);    // below the minimum
  CHECK(c.set("AMI_FIFO_DEPTH", "16x") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_FIFO_DEPTH", "") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_NOPE", "1") == ami::StatusCode::invalid_argument);
  CHECK(c.set("AMI_FIFO_DEPTH", "1024").ok());
  CHECK(c.number("AMI_FIFO_DEPTH") == 1024);
  CHECK(c.origin("AMI_FIFO_DEPTH") == "set");
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

TEST_CASE("status text names the problem") {
  ami::Status s{ami::StatusCode::invalid_argument, "send: payload is null"};
  CHECK(ami::to_string(s) == "invalid_argument: send: payload is null");
  CHECK(ami::to_string(ami::Status::success()) == "ok");
  for (int c = 0; c <= static_cast<int>(ami::StatusCode::not_supported); ++c)
    CHECK(ami::to_string(static_cast<ami::StatusCode>(c)) != "unknown_status");
}
