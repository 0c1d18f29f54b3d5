// Gathering the facts about a lock for its verdict (verdict.hpp): who the
// kernel shows holding it (/proc/locks, confirmed through /proc/PID/fdinfo),
// the holder record and whether its process lives, and the lock file's
// safety. Reads only. A run that found the lock held gathers cheaply (the
// record's pid first, /proc/locks only when that fails); --inspect gathers
// everything, waiters included.
#pragma once

#include <string>
#include <vector>

#include "os/file_status.hpp"
#include "os/lock_holders.hpp"
#include "records/holder.hpp"
#include "records/lockfile.hpp"
#include "records/verdict.hpp"

namespace looplock {

// The processes that hold the lock on `file` now, with the mode: the pids
// /proc/locks names, each confirmed through its descriptors; when one no
// longer holds it (it exited after passing the descriptor on: the kernel
// keeps naming the process that took the lock), whoever has the descriptor
// now, found among all processes. Empty when /proc/locks cannot be read or
// shows no holder.
std::vector<sys::KernelLock> live_holders(const sys::FileStatus& file);

// The processes holding the lock on `file`, found the cheap way when
// possible: the pids of `hint` (an earlier answer) or the record's pid, each
// confirmed through /proc/PID/fdinfo; otherwise live_holders(), whose read
// of /proc/locks takes the kernel's file-lock rwsem for writing (an RCU
// grace period: up to tens of milliseconds, and it stalls every flock(2) on
// the machine meanwhile).
std::vector<sys::KernelLock> kernel_holders(const HolderRead& read, const sys::FileStatus& file,
                                               const std::vector<sys::KernelLock>& hint = {});

// The facts for a run whose attempt found the lock on `file` held (open,
// not locked). `hint`: holders found earlier in the same wait.
LockFacts survey_held(const LockFile& file, const std::string& lock_path,
                      const std::vector<sys::KernelLock>& hint = {});

// Everything --inspect reports about DIR's lock (`dir` opened without the
// safety check: its refusal is a fact here); `waiters` receives the
// processes blocked in flock(2) on it. Throws Fatal 73 when the lock file
// cannot be looked at (lock_stat_failed), 71 on resource exhaustion.
LockFacts survey_lock(const LockDir& dir, const std::string& lock_path, std::vector<sys::KernelLock>& waiters);

// Fills in the record's facts (its process, age) from `f.record`.
void survey_record_process(LockFacts& f);

}  // namespace looplock
