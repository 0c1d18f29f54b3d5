// --holders N (looplock-sharing(7), HOLDERS): up to N runs hold the lock at once.
// Each takes an index first, the lowest free one below N: the index file
// DIR/.state.lock.holders.K (K from 0 to N-1), locked exclusively without
// waiting, which holds that holder's record (holder.hpp's format, with
// "holders" and "index"); then .state.lock shared, under the policy's wait
// (an exclusive holder of it, such as a plain looplock, flock(1) or the
// loop scripts' own lock, excludes every holder and is excluded by any). A
// run that finds all N indexes held waits for one to be closed (os/
// file_watch.hpp), and never holds .state.lock meanwhile. Runs with
// different N on one DIR stay race-free: each takes the lowest free index
// below its own N, so the largest N bounds how many hold it together.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/policy.hpp"
#include "os/clock.hpp"
#include "records/lockfile.hpp"

namespace looplock {

inline constexpr std::string_view kHoldersPrefix = ".state.lock.holders.";

// DIR/.state.lock.holders.K's name.
std::string index_name(int index);
// K of a name index_name() made, or nullopt for any other name.
std::optional<int> index_of_name(std::string_view name);

// A wait for an index. Acquired: `file` is the taken index (locked; its
// `read_only` set when no record can be written into it). Busy or TimedOut:
// `held` has the index files found held (open, not locked; index K at K),
// for telling who holds them.
struct IndexWait {
  Acquisition status = Acquisition::Busy;
  int index = -1;
  LockFile file;
  std::vector<LockFile> held;
};

// Takes the lowest free index below `n` under `plan` (the deadline counting
// from `start`); `on_wait` is called once when all are held and the run is
// about to wait. How often a waiter looks again at most, whatever it hears:
// kIndexPoll. Throws Fatal 73 when an index file is unsafe (lockfile.hpp's
// refuse_file rules) or cannot be made, 71 on resource exhaustion.
inline constexpr Duration kIndexPoll = std::chrono::milliseconds(100);
// `on_poll`, when given, is called each time the wait looks again (at
// least every kIndexPoll); it may throw to end the wait.
IndexWait take_index(const LockDir& dir, int n, const WaitPlan& plan, Instant start,
                     const std::function<void()>& on_wait, const std::function<void()>& on_poll = {});

// Whether DIR's name for index `index` still names the file `f` (false
// when it is gone); nullopt (errno set) when that cannot be told.
std::optional<bool> index_intact(const LockDir& dir, int index, const LockFile& f);

// DIR's index files, by index (for --inspect: the names found, whatever N).
std::vector<int> indexes_in(const LockDir& dir);
// Index file `index` opened to read (not locked), when it is a regular
// file: looked at first, so that a FIFO or a device is never opened;
// nullopt otherwise (--inspect's judge_lock_files() says what is wrong).
std::optional<LockFile> open_index_to_read(const LockDir& dir, int index);

}  // namespace looplock
