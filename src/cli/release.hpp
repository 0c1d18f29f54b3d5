// `looplock --release [VALUE]` ends the hold that VALUE (or
// $LOOPLOCK_HOLD) names: 0 once it was held and has let go, 124 or 76 when
// it had already ended by --max-time or a lost lease (its incident row
// says), 1 when there is no such hold. `looplock --release --force DIR`
// ends DIR's hold without its value, once the kernel confirms what the
// holder record claims: the process holds this lock file, is looplock, and
// has the record's start time. Both signal the holder through a handle that
// pins it (os/hold_process.hpp), never the lock file.
#pragma once

#include "base/log.hpp"
#include "settings/settings.hpp"

namespace looplock {

int release_hold(const Options& o, const Logger& log);

}  // namespace looplock
