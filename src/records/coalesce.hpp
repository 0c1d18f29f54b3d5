// -p coalesce's seat (looplock-schedules(7)): while the lock is held, one
// run of an operation waits for it, and a later run of that operation that
// finds the seat taken is absorbed by the run in it (it skips). The seat is
// a lock taken without waiting on the operation's own file beside the lock
// file, DIR/.state.lock.coalesce.HASH (HASH: the first 16 hex digits of the
// SHA-256 of the operation's name, followed for a shared run by a NUL byte
// and "shared", so that a shared and an exclusive run of one operation never
// absorb each other): atomic, and freed by the system when its holder dies. The run in the seat writes its record there (the holder
// record's format, holder.hpp; its acquired_at is when it sat down); each
// run it absorbs appends one line naming it, which the run in the seat
// counts as it leaves (once it holds the lock, or its deadline passed).
// posix/: flock(2); windows/: a byte past the data (os/files.hpp), so that
// readers of the record never meet the lock.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "os/ids.hpp"
#include "os/unique_fd.hpp"
#include "records/holder.hpp"
#include "records/lockfile.hpp"

namespace looplock {

inline constexpr std::string_view kCoalescePrefix = ".state.lock.coalesce.";

// DIR/.state.lock.coalesce.HASH's name for `operation` run exclusive or shared.
std::string coalesce_name(const std::string& operation, bool shared = false);

struct Seat {
  std::string name;  // the operation's file in DIR
  UniqueFd fd;       // taken: open and locked until leave_seat()
  // Not taken: the run in the seat, when its record could be read (it is
  // written a moment after the seat is taken; a record whose process is
  // gone is not taken for it).
  std::optional<HolderRecord> waiter;
  // The caller may not write the seat's file (its mode, a read-only file
  // system): why, with the fix. The run then waits without a seat.
  std::optional<std::string> unavailable;
  // Taken: what a run that sat in it before and died (its process gone)
  // had absorbed, which this run now runs for.
  int inherited = 0;
  std::optional<HolderRecord> dead_waiter;
  // Taken, but this run's record could not be written there (a full
  // disk): later runs are absorbed without naming it. Its errno; 0: written.
  int record_err = 0;
  bool taken() const { return static_cast<bool>(fd); }
};

// The runs a waiter absorbed: how many, and the newest start among them
// (wall clock, ms since the epoch; none from an earlier version's lines).
struct Absorbed {
  int count = 0;
  std::optional<long long> newest_started_ms;
};

// Takes the seat of `me.operation` without waiting, or finds who has it
// (a seat found taken is never taken by this run later, even once free:
// the run that had it does this run's work).
// Taken: `me` is written in it. A seat the caller may not write is
// `unavailable` (not taken, nobody named). Throws Fatal 73 when the file is
// unsafe (lockfile.hpp's refuse_file rules) or cannot be opened for another
// reason, 71 on resource exhaustion.
Seat take_seat(const LockDir& dir, const HolderRecord& me, bool shared = false);

// An absorbed run (`self`, its start `self_start`, started at `started_ms`
// on the wall clock) says so in the seat's file; false (errno set) when the
// line could not be appended.
bool absorb(const LockDir& dir, const Seat& seat, Pid self, const std::string& self_start, long long started_ms);

// Leaves a taken seat: the runs it absorbed (their lines naming `me`),
// then the file emptied and the seat freed.
Absorbed leave_seat(Seat& seat, const HolderRecord& me);

// The pure parts, for the tests: an absorbed run's line; the record in the
// seat (the file's first line); the lines that name `waiter`.
std::string encode_absorbed(const HolderRecord& waiter, Pid self, const std::string& self_start, const std::string& at,
                            long long started_ms);
std::optional<HolderRecord> seat_record(std::string_view content);
Absorbed count_absorbed(std::string_view content, const HolderRecord& waiter);

}  // namespace looplock
