// signal_names.hpp, the same on every system: names read and written over
// the system's own table (signal_table.hpp).
#include "os/signal_names.hpp"

#include "os/signal_table.hpp"

namespace looplock {

std::optional<int> parse_signal(std::string_view text) {
  std::string t;
  for (char c : text) t += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  if (t.starts_with("SIG")) t.erase(0, 3);
  if (!t.empty() && t.find_first_not_of("0123456789") == std::string::npos && t.size() < 4) {
    const int n = std::stoi(t);
    return signal_table::valid(n) ? std::optional<int>(n) : std::nullopt;
  }
  for (const auto& n : signal_table::named()) {
    if (t == n.name) return n.sig;
  }
  if (t.starts_with("RTMIN+") && t.size() > 6 && t.size() < 9 &&
      t.find_first_not_of("0123456789", 6) == std::string::npos) {
    return signal_table::realtime(std::stoi(t.substr(6)));
  }
  return std::nullopt;
}

std::string signal_name(int sig) {
  for (const auto& n : signal_table::named()) {
    if (n.sig == sig) return n.name;
  }
  if (auto n = signal_table::realtime_index(sig)) return "RTMIN+" + std::to_string(*n);
  return std::to_string(sig);
}

}  // namespace looplock
