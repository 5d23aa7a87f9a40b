// config.cpp — the reader of the tunables: the union of every component's
// rows (config_table.hpp), parsing and checking values, the environment,
// lookups by name.
#include "ami/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "ami/collectives_config.hpp"
#include "ami/error.hpp"
#include "backends.hpp"
#include "core_config.hpp"
#include "protocol_config.hpp"

namespace ami {

namespace {

using detail::kAutoValue;
using Problem = detail::ParamProblem;

constexpr Problem check(const ParamSpec& spec, std::string_view text, std::uint64_t& out) {
  return detail::parse_param(spec, text, out);
}

// The union, flat: every row with its position in a Config's values.
struct Union {
  std::vector<ParamGroup> groups;
  std::vector<const ParamSpec*> rows;
};

const Union& the_union() {
  static const Union u = [] {
    Union out;
    out.groups.push_back({"core", core::kParams});
    out.groups.push_back({"protocol", protocol::kParams});
    out.groups.push_back({"collectives", coll::kParams});
    for (const detail::RegisteredBackend& b : detail::registered_backends())
      if (!b.info.params.empty()) out.groups.push_back({b.info.name, b.info.params});
    for (const ParamGroup& g : out.groups)
      for (const ParamSpec& row : g.rows) out.rows.push_back(&row);
    return out;
  }();
  return u;
}

// The position of row in the union: the row itself, or one of its name
// (a table's copy in another module); rows.size() when none.
std::size_t position(const ParamSpec& row) {
  const auto& rows = the_union().rows;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i] == &row) return i;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i]->name == row.name) return i;
  return rows.size();
}

const ParamSpec* find(std::string_view name) {
  for (const ParamSpec* p : the_union().rows)
    if (p->name == name) return p;
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
  for (const ParamSpec* p : the_union().rows) {
    const std::size_t d = edit_distance(unknown, p->name);
    if (d < distance) {
      distance = d;
      best = p->name;
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

std::span<const ParamGroup> config_groups() { return the_union().groups; }

ParamName ParamName::lookup(std::string_view name) {
  if (const ParamSpec* p = find(name)) return *p;
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
  const auto& rows = the_union().rows;
  values_.resize(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    Value& v = values_[i];
    v.text = std::string(rows[i]->default_value);
    check(*rows[i], v.text, v.number);
  }
}

Status Config::set(std::string_view name, std::string_view value) {
  const ParamSpec* spec = find(name);
  if (spec == nullptr) return {StatusCode::invalid_argument, "config: unknown parameter"};
  std::uint64_t number = 0;
  if (const Problem p = check(*spec, value, number); p != Problem::none)
    return {StatusCode::invalid_argument, status_text(p)};
  Value& v = values_[position(*spec)];
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
    Value& v = c.values_[position(*spec)];
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

const Config::Value& Config::value(ParamName name) const {
  const std::size_t i = position(name.spec());
  if (i >= values_.size())
    throw Error("config: " + std::string(name.name()) + " is declared by no registered component");
  return values_[i];
}

std::uint64_t Config::number(ParamName name) const { return value(name).number; }

std::optional<std::uint64_t> Config::number_or_auto(ParamName name) const {
  const std::uint64_t v = number(name);
  if (v == kAutoValue) return std::nullopt;
  return v;
}

bool Config::flag(ParamName name) const { return number(name) != 0; }

const std::string& Config::text(ParamName name) const { return value(name).text; }

std::string_view Config::origin(ParamName name) const { return value(name).origin; }

}  // namespace ami
