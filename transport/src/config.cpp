// config.cpp — the reader of the table of tunables (config_table.hpp): parsing
// and checking values, the environment, lookups by name.
#include "ami/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "ami/device/descriptor.hpp"
#include "ami/device/reception_queue.hpp"
#include "ami/error.hpp"

namespace ami {

namespace {

constexpr std::uint64_t kAuto = ~std::uint64_t{0};

// Why a value cannot be right.
enum class Problem : std::uint8_t { none, malformed, out_of_range, not_power_of_two, too_long };

// Reads text as spec's type into out. constexpr, so the table's own defaults
// are checked while compiling (below).
constexpr Problem check(const ParamSpec& spec, std::string_view text, std::uint64_t& out) {
  if (spec.allows_auto && text == "auto") {
    out = kAuto;
    return Problem::none;
  }
  switch (spec.type) {
    case ParamType::text:
      return spec.max != 0 && text.size() > spec.max ? Problem::too_long : Problem::none;
    case ParamType::choice: {
      std::string_view rest = spec.choices;
      for (std::uint64_t i = 0;; ++i) {
        const std::size_t bar = rest.find('|');
        if (rest.substr(0, bar) == text) {
          out = i;
          return Problem::none;
        }
        if (bar == std::string_view::npos) return Problem::malformed;
        rest.remove_prefix(bar + 1);
      }
    }
    case ParamType::boolean:
      if (text == "1" || text == "y" || text == "yes" || text == "true" || text == "on") {
        out = 1;
        return Problem::none;
      }
      if (text == "0" || text == "n" || text == "no" || text == "false" || text == "off") {
        out = 0;
        return Problem::none;
      }
      return Problem::malformed;
    case ParamType::unsigned_int:
    case ParamType::power_of_two: {
      if (text.empty()) return Problem::malformed;
      std::uint64_t v = 0;
      bool overflow = false;
      for (const char ch : text) {
        if (ch < '0' || ch > '9') return Problem::malformed;
        const auto digit = static_cast<std::uint64_t>(ch - '0');
        if (v > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) overflow = true;
        else v = v * 10 + digit;
      }
      if (overflow || v < spec.min || v > spec.max) return Problem::out_of_range;
      if (spec.type == ParamType::power_of_two && (v & (v - 1)) != 0) return Problem::not_power_of_two;
      out = v;
      return Problem::none;
    }
  }
  return Problem::malformed;
}

constexpr bool power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Every row: a distinct AMI_ name, documentation, a sensible range, and a
// default that passes its own check.
constexpr bool table_is_sound() {
  for (std::size_t i = 0; i < std::size(kParamTable); ++i) {
    const ParamSpec& row = kParamTable[i];
    if (!row.name.starts_with("AMI_") || row.doc.empty()) return false;
    for (std::size_t j = 0; j < i; ++j)
      if (kParamTable[j].name == row.name) return false;
    const bool numeric = row.type == ParamType::unsigned_int || row.type == ParamType::power_of_two;
    if (numeric && row.min > row.max) return false;
    if (row.type == ParamType::power_of_two && !(power_of_two(row.min) && power_of_two(row.max))) return false;
    if (row.type == ParamType::choice && row.choices.empty()) return false;
    std::uint64_t ignored = 0;
    if (check(row, row.default_value, ignored) != Problem::none) return false;
  }
  return true;
}
static_assert(table_is_sound(), "config_table.hpp: a row has a bad name, range or default");

// Bounds the code below the table relies on.
static_assert(ParamName("AMI_VERBS_BOUNCE_SIZE").spec().min >= device::kPacketInlineBytes,
              "a verbs receive buffer must hold a descriptor's inline bytes");
static_assert(ParamName("AMI_SHM_CELL_SIZE").spec().min >= 2 * device::kCacheLine &&
                  ParamName("AMI_SELF_CELL_SIZE").spec().min >= 2 * device::kCacheLine,
              "a reception queue's cells are at least two cache lines");
static_assert(ParamName("AMI_RANK").spec().max == ParamName("AMI_SIZE").spec().max - 1,
              "every rank of the largest job is a valid AMI_RANK");

const ParamSpec* find(std::string_view name) {
  for (const ParamSpec& p : kParamTable)
    if (p.name == name) return &p;
  return nullptr;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The known name at the least edit distance from unknown, however far.
std::string_view nearest_param(std::string_view unknown, std::size_t& distance) {
  std::string_view best;
  distance = std::numeric_limits<std::size_t>::max();
  for (const ParamSpec& p : kParamTable) {
    const std::size_t d = edit_distance(unknown, p.name);
    if (d < distance) {
      distance = d;
      best = p.name;
    }
  }
  return best;
}

std::string allowed(const ParamSpec& spec) {
  std::string out;
  switch (spec.type) {
    case ParamType::unsigned_int:
      out = "a number from " + std::to_string(spec.min) + " to " + std::to_string(spec.max);
      break;
    case ParamType::power_of_two:
      out = "a power of two from " + std::to_string(spec.min) + " to " + std::to_string(spec.max);
      break;
    case ParamType::boolean: out = "on or off (or 1, y, yes, true / 0, n, no, false)"; break;
    case ParamType::choice:
      out = "one of " + std::string(spec.choices);
      std::replace(out.begin(), out.end(), '|', ',');
      break;
    case ParamType::text: out = "text of at most " + std::to_string(spec.max) + " bytes"; break;
  }
  if (spec.allows_auto) out += ", or auto";
  return out;
}

// "AMI_SIZE=0 is out of range (allowed: a number from 1 to 1048576)"
std::string refusal(const ParamSpec& spec, std::string_view value, Problem problem) {
  const std::string shown =
      spec.secret ? "(" + std::to_string(value.size()) + " bytes, not shown)" : std::string(value);
  std::string_view why = "is not valid";
  if (problem == Problem::out_of_range) why = "is out of range";
  if (problem == Problem::not_power_of_two) why = "is not a power of two";
  if (problem == Problem::too_long) why = "is too long";
  return std::string(spec.name) + "=" + shown + " " + std::string(why) + " (allowed: " + allowed(spec) + ")";
}

const char* status_text(Problem problem) {
  switch (problem) {
    case Problem::none: return "";
    case Problem::malformed: return "config: the value is not valid for this parameter";
    case Problem::out_of_range: return "config: the value is out of the parameter's range";
    case Problem::not_power_of_two: return "config: the value is not a power of two";
    case Problem::too_long: return "config: the value is too long";
  }
  return "config: the value is not valid for this parameter";
}

}  // namespace

std::span<const ParamSpec> config_table() { return kParamTable; }

ParamName::ParamName(const ParamSpec& row) : ParamName(lookup(row.name)) {}

ParamName ParamName::lookup(std::string_view name) {
  if (const ParamSpec* p = find(name)) return {ByIndex{}, static_cast<std::size_t>(p - kParamTable)};
  std::size_t distance = 0;
  throw Error("config: no parameter is named '" + std::string(name) + "' (the closest known name is " +
              std::string(nearest_param(name, distance)) + ")");
}

std::string_view closest_param(std::string_view unknown) {
  std::size_t distance = 0;
  const std::string_view best = nearest_param(unknown, distance);
  return distance < unknown.size() / 2 + 1 ? best : std::string_view{};  // beyond this it is no hint
}

Config::Config() {
  for (std::size_t i = 0; i < std::size(kParamTable); ++i) {
    Value& v = values_[i];
    v.text = std::string(kParamTable[i].default_value);
    check(kParamTable[i], v.text, v.number);
  }
}

Status Config::set(std::string_view name, std::string_view value) {
  const ParamSpec* spec = find(name);
  if (spec == nullptr) return {StatusCode::invalid_argument, "config: unknown parameter"};
  std::uint64_t number = 0;
  if (const Problem p = check(*spec, value, number); p != Problem::none)
    return {StatusCode::invalid_argument, status_text(p)};
  Value& v = values_[static_cast<std::size_t>(spec - kParamTable)];
  v.text = std::string(value);
  v.number = number;
  v.origin = "set";
  return Status::success();
}

Config Config::from_environment(const char* const* env, std::vector<std::string>& warnings) {
  Config c;
  std::string errors;
  for (; env != nullptr && *env != nullptr; ++env) {
    const std::string_view entry(*env);
    if (!entry.starts_with("AMI_")) continue;
    const std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = entry.substr(0, eq), value = entry.substr(eq + 1);
    const ParamSpec* spec = find(name);
    if (spec == nullptr) {
      std::string w = "unknown variable " + std::string(name);
      if (std::string_view near = closest_param(name); !near.empty())
        w += " (did you mean " + std::string(near) + "?)";
      warnings.push_back(std::move(w));
      continue;
    }
    std::uint64_t number = 0;
    if (const Problem p = check(*spec, value, number); p != Problem::none) {
      errors += (errors.empty() ? "" : "; ") + refusal(*spec, value, p);
      continue;
    }
    Value& v = c.values_[static_cast<std::size_t>(spec - kParamTable)];
    v = {std::string(value), number, "environment"};
  }
  if (!errors.empty()) throw Error("configuration: " + errors);
  return c;
}

Config Config::from_environment() {
  std::vector<std::string> warnings;
  auto print = [&] {
    for (const std::string& w : warnings) std::fprintf(stderr, "ami: warning: %s\n", w.c_str());
  };
  try {
    Config c = from_environment(environ, warnings);
    print();
    return c;
  } catch (const Error&) {
    print();  // an unknown name may be the reason a value was not set where meant
    throw;
  }
}

std::uint64_t Config::number(ParamName name) const { return values_[name.index()].number; }

std::optional<std::uint64_t> Config::number_or_auto(ParamName name) const {
  const std::uint64_t v = number(name);
  if (v == kAuto) return std::nullopt;
  return v;
}

bool Config::flag(ParamName name) const { return number(name) != 0; }

const std::string& Config::text(ParamName name) const { return values_[name.index()].text; }

std::string_view Config::origin(ParamName name) const { return values_[name.index()].origin; }

}  // namespace ami
