#include "settings/settings.hpp"

#include <algorithm>

namespace looplock {

bool valid_lock_name(std::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  return std::none_of(name.begin(), name.end(),
                      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

LockRequest lock_request(const Options& o, long long start_wall_ms) {
  return {.dir = o.dir,
          .identity = o.identity,
          .policy = o.wait.policy,
          .flags = o.lock,
          .once_per = o.once_per.period.has_value(),
          .conflict_exit_code = o.wait.conflict_exit_code,
          .hold = o.hold.facts,
          .start_wall_ms = start_wall_ms};
}

}  // namespace looplock
