// The operating system's numbers for a process, a user and a group, as every
// layer holds them: the same types as POSIX's Pid, Uid and Gid (the
// POSIX implementation asserts it), and wide enough for Windows' process ids.
#pragma once

#include <cstdint>

namespace looplock {

using Pid = std::int32_t;
using Uid = std::uint32_t;
using Gid = std::uint32_t;

}  // namespace looplock
