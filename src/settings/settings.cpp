#include "settings/settings.hpp"

#include <algorithm>

namespace looplock {

bool valid_lock_name(std::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  return std::none_of(name.begin(), name.end(),
                      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

}  // namespace looplock
