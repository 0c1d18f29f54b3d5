#include "os/file_watch.hpp"

#include "os/clock.hpp"

namespace looplock::sys {

// No watch here (looplock.exe refuses --holders for now): the bound alone.
struct CloseWatch::Alarm {};

CloseWatch::CloseWatch(int /*dirfd*/, const std::vector<std::string>& /*names*/, bool /*absorb_alarm*/) {}

CloseWatch::~CloseWatch() = default;

void CloseWatch::wait(Duration at_most) { nap(at_most); }

}  // namespace looplock::sys
