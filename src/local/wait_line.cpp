#include "local/wait_line.hpp"

#include "base/duration.hpp"

namespace looplock {

std::string wait_status_line(Duration waited, std::optional<Duration> left, const std::string& who,
                             const std::string& path, size_t width) {
  const std::string head = "looplock: waiting " + format_duration(waited) + " (" +
                           (left ? format_duration(*left) + " left" : std::string("no deadline")) + ") for " + who;
  const std::string on = " on ";
  if (head.size() + on.size() + path.size() <= width) return head + on + path;
  // The path's end (its loop dir and .state.lock) says the most: cut its start.
  const std::string cut = "...";
  const size_t room = width > head.size() + on.size() + cut.size() ? width - head.size() - on.size() - cut.size() : 0;
  if (room >= 12) return head + on + cut + path.substr(path.size() - room);
  if (head.size() <= width) return head;
  return head.substr(0, width);
}

}  // namespace looplock
