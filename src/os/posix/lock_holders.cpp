// lock_holders.hpp on Linux: what /proc says (procfs.hpp).
#include "os/lock_holders.hpp"

#include "os/posix/procfs.hpp"

namespace looplock::sys {

std::vector<Pid> holding_lock(const std::vector<Pid>& pids, const FileStatus& file) {
  return procfs::pids_holding_flock(pids, file);
}

}  // namespace looplock::sys
