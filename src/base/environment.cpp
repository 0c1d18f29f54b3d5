#include "base/environment.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace looplock {

namespace {
// "NAME=..." for `name`; the '=' is looked at first, which tells most
// entries apart at once.
bool has_name(std::string_view entry, std::string_view name) {
  return entry.size() > name.size() && entry[name.size()] == '=' && entry.starts_with(name);
}
}  // namespace

EnvList env_from(char** envp) {
  EnvList out;
  for (char** e = envp; e && *e; ++e) out.emplace_back(*e);
  return out;
}

std::optional<std::string> env_get(const EnvList& env, std::string_view name) {
  for (const auto& e : env) {
    if (has_name(e, name)) return e.substr(name.size() + 1);
  }
  return std::nullopt;
}

void env_set(EnvList& env, const std::vector<std::pair<std::string_view, std::string>>& set,
             const std::vector<std::string_view>& unset) {
  std::erase_if(env, [&](const std::string& e) {
    return std::any_of(set.begin(), set.end(), [&](const auto& kv) { return has_name(e, kv.first); }) ||
           std::any_of(unset.begin(), unset.end(), [&](std::string_view n) { return has_name(e, n); });
  });
  for (const auto& [name, value] : set) env.push_back(std::string(name) + "=" + value);
}

EnvList env_with(const EnvList& env, const std::vector<std::pair<std::string_view, std::string>>& set,
                 const std::vector<std::string_view>& unset) {
  EnvList out = env;
  env_set(out, set, unset);
  return out;
}

std::string format_deadline(long long ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", ms / 1000, ms % 1000);
  return buf;
}

std::optional<long long> parse_deadline(const std::optional<std::string>& value) {
  if (!value) return std::nullopt;
  const std::string& v = *value;
  const size_t dot = v.find('.');
  if (dot == 0 || dot == std::string::npos || v.size() - dot != 4) return std::nullopt;
  long long s = 0;
  long long ms = 0;
  const char* end = v.data() + dot;
  if (auto [p, ec] = std::from_chars(v.data(), end, s); ec != std::errc() || p != end || s < 0) return std::nullopt;
  if (!std::all_of(v.begin() + static_cast<long>(dot) + 1, v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  std::from_chars(v.data() + dot + 1, v.data() + v.size(), ms);
  if (s > 9'000'000'000'000LL) return std::nullopt;
  return s * 1000 + ms;
}

std::string format_deadline_owner(long long pid, const std::string& start) {
  return std::to_string(pid) + ":" + start;
}

std::optional<DeadlineOwner> parse_deadline_owner(const std::optional<std::string>& value) {
  if (!value) return std::nullopt;
  const std::string& v = *value;
  const size_t colon = v.find(':');
  if (colon == std::string::npos || colon + 1 == v.size() || v.size() > 64) return std::nullopt;
  DeadlineOwner o;
  const char* end = v.data() + colon;
  if (auto [p, ec] = std::from_chars(v.data(), end, o.pid); ec != std::errc() || p != end || o.pid <= 0) {
    return std::nullopt;
  }
  o.start = v.substr(colon + 1);
  if (!std::all_of(o.start.begin(), o.start.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return o;
}

}  // namespace looplock
