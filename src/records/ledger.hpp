// The local run ledger of --once-per: the file DIR/.state.lock.runs.json,
// written only under the lock, with the entries of run_entry.hpp (the
// cluster's ledger lives on etcd, cluster.hpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "os/failure.hpp"
#include "os/file_status.hpp"
#include "os/ids.hpp"
#include "os/unique_fd.hpp"
#include "records/lockfile.hpp"
#include "records/run_entry.hpp"
#include "records/sealed.hpp"

namespace looplock {

inline constexpr const char* kRunsName = ".state.lock.runs.json";
inline constexpr const char* kRunsNewName = ".state.lock.runs.json.new";  // the next ledger, before its rename

// The local ledger of a loop dir, opened by the lock file's rules (no
// symbolic link, one link, owned by the caller or DIR's owner).
struct LedgerRead {
  std::vector<RunEntry> entries;  // the valid ones, oldest first
  std::vector<std::string> damaged;  // the operations (or "?") of entries that did not validate
  bool unreadable = false;          // no valid copy (not JSON, another schema): read as empty, and rewritten
  unsigned long long generation = 0;  // its newest copy's
};
// The lock file's rules (lockfile.hpp's refuse_file): in a DIR its group may
// write (group-writable, not sticky) a ledger of DIR's group may be owned by
// any member (a write by one who may not write it replaces the file, so its
// owner is the last such writer).
std::optional<Refusal> refuse_ledger(const sys::FileStatus& file, const sys::FileStatus& dir, Uid euid,
                                     std::string_view shown_dir = "DIR");
// Reads DIR/.state.lock.runs.json (missing: empty). Throws Fatal 73 when the
// file is unsafe, 71 on resource exhaustion.
LedgerRead read_ledger(const LockDir& dir);
// The entry of `operation`, if any (names compared whole).
std::optional<RunEntry> entry_of(const LedgerRead& ledger, const std::string& operation);
// Writes the ledger: in place when this process may write the file, as a
// new copy (of the next generation) beside the newest valid one, never over
// it, so that a write cut short by anything (ENOSPC, RLIMIT_FSIZE, EDQUOT,
// EIO, a crash) leaves every entry as it was; its new length reserved first
// (beyond its end, its size kept), so that a full disk fails before a byte
// changed. Else a new file beside it, renamed over it. Returns none, or the step that failed with its errno
// and the fix for a cause that has one (a DIR you may not create files in,
// a sticky DIR, a read-only or full file system).
//
// What one looplock knows of its own writes, so that not every write has to
// wait for the disk: the copy it wrote last and one that was durable when it
// wrote it. A write whose newest valid copy is another's (or none it knows)
// makes that copy durable first (fdatasync(2): cheap when it was written back
// long ago) and keeps it; the one write that may follow it without a sync
// (a run's end after its start) keeps both that copy and the durable one,
// when that one is still whole. So at any instant a durable valid copy is
// on disk: a power cut loses at most the runs recorded since it, never an
// older one's entry.
struct OwnCopies {
  bool known = false;
  bool unsynced = false;              // the copy it wrote last followed it without a sync
  unsigned long long generation = 0;  // of the copy this looplock wrote last
  Span written;                       // its bytes
  Span durable;                       // a copy durable before it, and kept since
};
std::optional<sys::Failure> write_ledger(const LockDir& dir, const std::vector<RunEntry>& entries, OwnCopies& own);

// The local ledger's entry of `operation` (Fatal 73 when the ledger is unsafe).
LedgerLook look_local_ledger(const LockDir& dir, const std::string& operation);
// The ledger's own lock, for runs nested in one holder (and a hold's
// steps), which share its lock: each looks and records, and each records
// its end, one at a time under it (past the data, never in a reader's
// way). The ledger is made, empty, when it is missing (an empty ledger
// reads as no entry), so that there is a file to lock. Waits at most a few
// seconds (a look and a record last milliseconds); none (no descriptor)
// when it cannot be made, opened or taken by then.
UniqueFd guard_ledger(const LockDir& dir);
// Records `entry` in the local ledger, as of `now_ms`, under the caller's
// guard_ledger(); Fatal 73 when it cannot. Returns what the update did to
// other entries (for a warning).
LedgerUpdate record_local_ledger(const LockDir& dir, const RunEntry& entry, long long now_ms, OwnCopies& own);

}  // namespace looplock
