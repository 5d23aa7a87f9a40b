// ami/config.hpp — one client's values of the tunables, read from AMI_*
// environment variables. The rows are declared by the components that use
// them (config_table.hpp); a Config holds the union of every component's.
//
// Config::from_environment() reads the union once (the Client does this at
// construction). An unknown AMI_* variable is a warning naming the closest
// known name: other programs' variables may share the prefix. A value that
// cannot be right (malformed, out of range) is an ami::Error naming the
// variable, the value and what is allowed, as UCX refuses to start: a job
// that runs on a default instead of what it was given fails later, far from
// the cause. A Config is a value: copy it, change it, pass it to a Client.
//
// The code names a parameter by its component's ParamIn (config_table.hpp),
// checked while compiling, which converts to a ParamName. A name known only
// at run time goes through ParamName::lookup(), which throws ami::Error for
// a name no component declares; Config::set() takes such names too and
// refuses them with a Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ami/config_table.hpp"
#include "ami/status.hpp"

namespace ami {

// One component's rows, under the component's name ("core", "protocol",
// "shm", ...).
struct ParamGroup {
  std::string_view component;
  std::span<const ParamSpec> rows;
};

// Every component's rows: the core's, the protocol's, then each registered
// backend's (BackendInfo::params), in the registry's order. No name is in
// two of them.
std::span<const ParamGroup> config_groups();

// A row of some component's table.
class ParamName {
 public:
  // A name checked against its component's table while compiling.
  template <const auto& Rows>
  constexpr ParamName(ParamIn<Rows> p) : spec_(&p.spec()) {}  // implicit: config.number(Param("AMI_..."))
  // A row of config_groups(), as when printing every parameter.
  constexpr ParamName(const ParamSpec& row) : spec_(&row) {}  // implicit: config.text(row) reads as it should
  // A name known only at run time (user input, a tool's argument): throws
  // ami::Error naming it and the closest known name when no component
  // declares it.
  static ParamName lookup(std::string_view name);

  constexpr const ParamSpec& spec() const { return *spec_; }
  constexpr std::string_view name() const { return spec_->name; }

 private:
  const ParamSpec* spec_;
};

class Config {
 public:
  // Defaults only.
  Config();
  // Defaults overridden by the AMI_* variables in env ("NAME=VALUE"
  // strings). Unknown names are appended to warnings, with the closest
  // known name, and ignored. Values that cannot be right throw ami::Error
  // once all of env is read, naming every such variable, its value and what
  // is allowed (warnings already holds the unknown names then): no Config
  // is returned that differs from what the environment asked for.
  static Config from_environment(const char* const* env, std::vector<std::string>& warnings);
  // The same for environ; the warnings go to stderr, before any throw.
  static Config from_environment();

  // For a name and value known only at run time: an unknown name, or a
  // value that cannot be right, is refused with invalid_argument and
  // changes nothing.
  Status set(std::string_view name, std::string_view value);
  // A row no registered component declares throws ami::Error.
  std::uint64_t number(ParamName name) const;
  // For a parameter that allows "auto": nothing when it is auto.
  std::optional<std::uint64_t> number_or_auto(ParamName name) const;
  bool flag(ParamName name) const;
  const std::string& text(ParamName name) const;
  // Where the current value came from: "default" or "environment" or "set".
  std::string_view origin(ParamName name) const;

 private:
  struct Value {
    std::string text;
    std::uint64_t number = 0;
    std::string_view origin = "default";
  };
  const Value& value(ParamName name) const;
  std::vector<Value> values_;  // by position in the union, group after group
};

// The known name closest to an unknown one (edit distance), or "" when none
// is close enough to be a hint.
std::string_view closest_param(std::string_view unknown);

}  // namespace ami
