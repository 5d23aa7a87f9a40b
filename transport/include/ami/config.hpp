// ami/config.hpp — every tunable in one declarative table, read from AMI_*
// environment variables.
//
// Config::from_environment() reads the table once (the Client does this at
// construction); an unknown AMI_* variable is reported with the closest
// known name. A Config is a value: copy it, change it, pass it to a Client.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ami/status.hpp"

namespace ami {

// choice: one of the words in ParamSpec::choices; number() is its position.
enum class ParamType : std::uint8_t { unsigned_int, power_of_two, boolean, text, choice };

struct ParamSpec {
  std::string_view name;  // AMI_...
  std::string_view default_value;
  ParamType type;
  std::uint64_t min = 0;  // for numbers
  std::uint64_t max = 0;
  std::string_view doc;
  bool allows_auto = false;  // "auto" is a value too: the backend decides (number_or_auto)
  std::string_view choices = {};  // choice: the allowed words, '|'-separated
  bool secret = false;            // its value is never printed
};

// The table.
std::span<const ParamSpec> config_table();

class Config {
 public:
  // Defaults only.
  Config();
  // Defaults overridden by AMI_* variables in env ("NAME=VALUE" strings);
  // problems (unknown names, bad values, which keep the default) are
  // appended to warnings.
  static Config from_environment(const char* const* env, std::vector<std::string>& warnings);
  static Config from_environment();  // environ; warnings go to stderr

  Status set(std::string_view name, std::string_view value);
  std::uint64_t number(std::string_view name) const;
  // For a parameter that allows "auto": nothing when it is auto.
  std::optional<std::uint64_t> number_or_auto(std::string_view name) const;
  bool flag(std::string_view name) const;
  const std::string& text(std::string_view name) const;
  // Where the current value came from: "default" or "environment" or "set".
  std::string_view origin(std::string_view name) const;

 private:
  struct Value {
    std::string text;
    std::uint64_t number = 0;
    std::string_view origin = "default";
  };
  std::map<std::string, Value, std::less<>> values_;
};

// The known name closest to an unknown one (edit distance), or "".
std::string_view closest_param(std::string_view unknown);

}  // namespace ami
