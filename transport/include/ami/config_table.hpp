// ami/config_table.hpp — the vocabulary of the tunables: the row type every
// AMI_* variable is declared with (type, default, range, documentation), the
// parse of a value against its row, and the name check.
//
// The rows themselves live with the code that uses them: each component
// declares its own constexpr table next to its code (the core's in
// transport/src/core_config.hpp, the protocol's in
// protocol/am/protocol_config.hpp, the collectives' in
// ami/collectives_config.hpp, each backend's in its folder, given to the
// registry by its BackendInfo).
// The Config holds the union (config.hpp); ami_info -c prints it.
//
// A component names its parameters through its own table, as ParamIn<its
// table>: a string literal is checked against those rows while compiling,
// so Param("AMI_FIFO_DEPHT") does not build, nor a name another component
// owns (tests/core/compile_fail_config_name.cpp proves it). A component
// that needs another's setting is given the typed value instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>

namespace ami {

// choice: one of the words in ParamSpec::choices; number() is its position.
enum class ParamType : std::uint8_t { unsigned_int, power_of_two, boolean, text, choice };

struct ParamSpec {
  std::string_view name;  // AMI_...
  std::string_view default_value;
  ParamType type;
  std::uint64_t min = 0;  // for numbers
  std::uint64_t max = 0;  // for numbers; for text, the most bytes (0: any length)
  std::string_view doc;
  bool allows_auto = false;  // "auto" is a value too: the backend decides (number_or_auto)
  std::string_view choices = {};  // choice: the allowed words, '|'-separated
  bool secret = false;            // its value is never printed
};

// Every bound a table gives is one a job can use on today's hosts: a value
// beyond it is a mistake (AMI_SIZE=100000000 is a typo, not a job), refused
// when the configuration is read. Settings whose product is the memory a
// client allocates (depths times cell sizes, requests, FIFOs) are also
// checked together against the host's memory when a Client starts.

namespace detail {

// The number an "auto" value reads as.
inline constexpr std::uint64_t kAutoValue = ~std::uint64_t{0};

// Why a value cannot be right.
enum class ParamProblem : std::uint8_t { none, malformed, out_of_range, not_power_of_two, too_long };

// Reads text as spec's type into out. constexpr, so each table's own
// defaults are checked while compiling (rows_are_sound) and the typed
// options take their defaults from them.
constexpr ParamProblem parse_param(const ParamSpec& spec, std::string_view text, std::uint64_t& out) {
  if (spec.allows_auto && text == "auto") {
    out = kAutoValue;
    return ParamProblem::none;
  }
  switch (spec.type) {
    case ParamType::text:
      return spec.max != 0 && text.size() > spec.max ? ParamProblem::too_long : ParamProblem::none;
    case ParamType::choice: {
      std::string_view rest = spec.choices;
      for (std::uint64_t i = 0;; ++i) {
        const std::size_t bar = rest.find('|');
        if (rest.substr(0, bar) == text) {
          out = i;
          return ParamProblem::none;
        }
        if (bar == std::string_view::npos) return ParamProblem::malformed;
        rest.remove_prefix(bar + 1);
      }
    }
    case ParamType::boolean:
      if (text == "1" || text == "y" || text == "yes" || text == "true" || text == "on") {
        out = 1;
        return ParamProblem::none;
      }
      if (text == "0" || text == "n" || text == "no" || text == "false" || text == "off") {
        out = 0;
        return ParamProblem::none;
      }
      return ParamProblem::malformed;
    case ParamType::unsigned_int:
    case ParamType::power_of_two: {
      if (text.empty()) return ParamProblem::malformed;
      std::uint64_t v = 0;
      bool overflow = false;
      for (const char ch : text) {
        if (ch < '0' || ch > '9') return ParamProblem::malformed;
        const auto digit = static_cast<std::uint64_t>(ch - '0');
        if (v > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) overflow = true;
        else v = v * 10 + digit;
      }
      if (overflow || v < spec.min || v > spec.max) return ParamProblem::out_of_range;
      if (spec.type == ParamType::power_of_two && (v & (v - 1)) != 0) return ParamProblem::not_power_of_two;
      out = v;
      return ParamProblem::none;
    }
  }
  return ParamProblem::malformed;
}

constexpr bool is_power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Deliberately not constexpr: a ParamIn built from a literal its table
// lacks calls it while compiling, so the build stops with this name in the
// diagnostic. Never called at run time.
inline void configuration_parameter_name_not_in_table() {}
// The same for a typed default taken from a row whose default is auto, or
// that does not fit the field's type.
inline void configuration_default_is_auto_or_does_not_fit() {}

}  // namespace detail

// Every row of one component's table: a distinct AMI_ name, documentation,
// a sensible range, and a default that passes its own check. Each table
// static_asserts it; distinct names across tables are the union's test.
constexpr bool rows_are_sound(std::span<const ParamSpec> rows) {
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const ParamSpec& row = rows[i];
    if (!row.name.starts_with("AMI_") || row.doc.empty()) return false;
    for (std::size_t j = 0; j < i; ++j)
      if (rows[j].name == row.name) return false;
    const bool numeric = row.type == ParamType::unsigned_int || row.type == ParamType::power_of_two;
    if (numeric && row.min > row.max) return false;
    if (row.type == ParamType::power_of_two && !(detail::is_power_of_two(row.min) && detail::is_power_of_two(row.max)))
      return false;
    if (row.type == ParamType::choice && row.choices.empty()) return false;
    std::uint64_t ignored = 0;
    if (detail::parse_param(row, row.default_value, ignored) != detail::ParamProblem::none) return false;
  }
  return true;
}

// A row of one component's table (Rows), by a name checked while compiling.
// It converts to ParamName (config.hpp), which is what a Config reads by.
// Its defaults are the typed options' defaults: written once, in the row.
template <const auto& Rows>
class ParamIn {
 public:
  template <std::size_t N>
  consteval ParamIn(const char (&name)[N]) : index_(index_of(std::string_view(name, N - 1))) {}

  constexpr const ParamSpec& spec() const { return Rows[index_]; }
  constexpr std::string_view name() const { return spec().name; }

  // The row's default as T: a number, a flag's 0 or 1, a choice's position
  // (cast to its enum). A default of auto does not build: use default_or_auto.
  template <class T = std::uint64_t>
  consteval T default_as() const {
    const std::uint64_t v = parsed_default();
    if (v == detail::kAutoValue) detail::configuration_default_is_auto_or_does_not_fit();
    if constexpr (std::is_enum_v<T>) {
      return static_cast<T>(v);
    } else {
      if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
        detail::configuration_default_is_auto_or_does_not_fit();
      return static_cast<T>(v);
    }
  }
  // For a row that allows auto: nothing when its default is auto.
  template <class T = std::uint64_t>
  consteval std::optional<T> default_or_auto() const {
    if (parsed_default() == detail::kAutoValue) return std::nullopt;
    return default_as<T>();
  }

 private:
  // (constexpr, not consteval: only consteval members call it, and clang 14
  // refuses a consteval call on this inside them.)
  constexpr std::uint64_t parsed_default() const {
    std::uint64_t v = 0;
    detail::parse_param(spec(), spec().default_value, v);
    return v;
  }
  static consteval std::size_t index_of(std::string_view name) {
    for (std::size_t i = 0; i < std::size(Rows); ++i)
      if (Rows[i].name == name) return i;
    detail::configuration_parameter_name_not_in_table();
    return 0;
  }

  std::size_t index_;
};

}  // namespace ami
