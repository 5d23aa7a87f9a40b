// ami/config.hpp — one client's values of the tunables in the table
// (config_table.hpp), read from AMI_* environment variables.
//
// Config::from_environment() reads the table once (the Client does this at
// construction). An unknown AMI_* variable is a warning naming the closest
// known name: other programs' variables may share the prefix. A value that
// cannot be right (malformed, out of range) is an ami::Error naming the
// variable, the value and what is allowed, as UCX refuses to start: a job
// that runs on a default instead of what it was given fails later, far from
// the cause. A Config is a value: copy it, change it, pass it to a Client.
//
// The code names a parameter by ParamName. A string literal is checked
// against the table while compiling, so config.number("AMI_FIFO_DEPHT") does
// not build (tests/unit/compile_fail_config_name.cpp proves it). A name
// known only at run time goes through ParamName::lookup(), which throws
// ami::Error for a name the table lacks; Config::set() takes such names too
// and refuses them with a Status.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ami/config_table.hpp"
#include "ami/status.hpp"

namespace ami {

// The table.
std::span<const ParamSpec> config_table();

namespace detail {
// Deliberately not constexpr: a ParamName built from a literal the table
// lacks calls it while compiling, so the build stops with this name in the
// diagnostic. Never called at run time.
inline void configuration_parameter_name_not_in_table() {}
}  // namespace detail

// A row of the table, by position.
class ParamName {
 public:
  // A literal: checked while compiling.
  template <std::size_t N>
  consteval ParamName(const char (&name)[N]) : index_(index_of(std::string_view(name, N - 1))) {}
  // A row of config_table(), as when printing every parameter; throws
  // ami::Error when the row's name is not in the table.
  ParamName(const ParamSpec& row);  // implicit: config.text(row) reads as it should
  // A name known only at run time (user input, a tool's argument): throws
  // ami::Error naming it and the closest known name when the table lacks it.
  static ParamName lookup(std::string_view name);

  constexpr std::size_t index() const { return index_; }
  constexpr const ParamSpec& spec() const { return kParamTable[index_]; }
  constexpr std::string_view name() const { return spec().name; }

 private:
  struct ByIndex {};
  constexpr ParamName(ByIndex, std::size_t index) : index_(index) {}
  static consteval std::size_t index_of(std::string_view name) {
    for (std::size_t i = 0; i < std::size(kParamTable); ++i)
      if (kParamTable[i].name == name) return i;
    detail::configuration_parameter_name_not_in_table();
    return 0;
  }

  std::size_t index_;
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
  std::array<Value, std::size(kParamTable)> values_;  // by position in the table
};

// The known name closest to an unknown one (edit distance), or "" when none
// is close enough to be a hint.
std::string_view closest_param(std::string_view unknown);

}  // namespace ami
