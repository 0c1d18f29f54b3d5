#include "environment.hpp"

#include <algorithm>

namespace looplock {

namespace {
bool has_name(std::string_view entry, std::string_view name) {
  return entry.size() > name.size() && entry.starts_with(name) && entry[name.size()] == '=';
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

EnvList env_with(const EnvList& env, const std::vector<std::pair<std::string_view, std::string>>& set,
                 const std::vector<std::string_view>& unset) {
  EnvList out;
  out.reserve(env.size() + set.size());
  for (const auto& e : env) {
    bool drop = std::any_of(set.begin(), set.end(), [&](const auto& kv) { return has_name(e, kv.first); }) ||
                std::any_of(unset.begin(), unset.end(), [&](std::string_view n) { return has_name(e, n); });
    if (!drop) out.push_back(e);
  }
  for (const auto& [name, value] : set) out.push_back(std::string(name) + "=" + value);
  return out;
}

}  // namespace looplock
