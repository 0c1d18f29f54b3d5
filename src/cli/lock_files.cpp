#include "cli/lock_files.hpp"

#include <cerrno>

#include "base/error.hpp"
#include "base/text.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/ids.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/coalesce.hpp"
#include "records/holders.hpp"
#include "records/incident.hpp"
#include "records/ledger.hpp"
#include "records/metrics.hpp"
#include "records/run_entry.hpp"

namespace looplock {

namespace {

std::string in(const std::string& dir, std::string_view name) { return sys::path_in_dir(dir, name); }

// "owner uid 1001, mode 0600": the file's, never the caller's
std::string owner_mode(const sys::FileStatus& st) {
  return "owner uid " + std::to_string(st.owner) + ", mode " + octal_mode(st.mode);
}

constexpr sys::Permission kRead{.read = true};
constexpr sys::Permission kWrite{.write = true};
constexpr sys::Permission kWriteIn{.write = true, .search = true};  // a directory's: to create and rename there

// Whether DIR is on a file system mounted read-only.
bool read_only(int dirfd) { return !sys::may_access(dirfd, ".", kWrite) && errno == EROFS; }

std::string create_once_hint(const LockDir& dir, const std::string& path, Uid euid);

// DIR/.state.lock missing where a run cannot create it, or one the caller
// cannot open: every run exits 73.
void judge_lock_file(const LockDir& dir, Uid euid, std::vector<FileProblem>& out) {
  sys::FileStatus st;
  const std::string path = in(dir.path, kLockName);
  if (sys::status_at(dir.fd.get(), kLockName, st)) {
    if (st.regular() && !sys::may_access(dir.fd.get(), kLockName, kRead)) {
      out.push_back({path, "every run by you exits 73: you cannot open it (" + owner_mode(st) + ")",
                     unopenable_hint(dir, st, euid)});
    }
    return;
  }
  if (errno != ENOENT) return;
  const std::string create =
      (sys::abilities().permission_bits ? "install -m 0660 /dev/null " : "type nul > ") + shell_word(path);
  if (read_only(dir.fd.get())) {
    out.push_back({path, "every run exits 73: it does not exist, and DIR's file system is read-only",
                   "Create it while the file system is writable (" + create + "), or remount it read-write."});
  } else if (!sys::may_access(dir.fd.get(), ".", kWriteIn)) {
    out.push_back({path, "every run by you exits 73: it does not exist, and you cannot create it in DIR",
                   sys::abilities().permission_bits
                       ? "Let DIR's owner create it once (install -m 0660 -g GROUP /dev/null " + shell_word(path) +
                             " for a group), or run as DIR's owner."
                       : create_once_hint(dir, path, euid)});
  }
}

// The fix for a file the caller cannot create in DIR: DIR's owner makes
// DIR writable (when that is the caller, for itself).
std::string create_once_hint(const LockDir& dir, const std::string& path, Uid euid) {
  if (!sys::abilities().permission_bits) {  // Windows: access is by ACL
    return "Let DIR's owner or an administrator let you create files in DIR (icacls " + shell_word(dir.path) +
           " /grant %USERNAME%:M), or create it once as one who may.";
  }
  if (dir.st.owner == euid) return "Make DIR writable for yourself (chmod u+w " + shell_word(dir.path) + ").";
  return "Let DIR's owner make DIR writable for you, or create it once (install -m 0660 -g GROUP /dev/null " +
         shell_word(path) + " for a group).";
}

// Whether the caller's runs could lock here, so that a file it cannot
// create is its runs' loss: it may open the lock file (a read descriptor
// locks too, as in the group recipe under umask 022). One who cannot open
// it is told that alone (judge_lock_file), not every file it would need.
bool runs_here(const LockDir& dir) { return sys::may_access(dir.fd.get(), kLockName, kRead); }

// Whether the caller may replace `file` in DIR by a rename: DIR writable
// and searchable, and, when it is sticky, the file or DIR the caller's.
bool may_replace(int dirfd, const sys::FileStatus& dir, const sys::FileStatus& file, Uid euid) {
  if (!sys::may_access(dirfd, ".", kWriteIn)) return false;
  return !(dir.mode & sys::mode::kSticky) || euid == 0 || file.owner == euid || dir.owner == euid;
}

// The fix of a file a group cannot share, for whoever can make it: its owner
// (or root) opens its mode to its group (and gives it the directory's group
// when it has another); a caller outside that group runs as a member.
std::string share_fix(const std::string& path, const sys::FileStatus& st, const sys::FileStatus& dir, Uid euid) {
  std::string commands = "chmod g+rw " + path;
  if (st.group != dir.group) commands = "chgrp " + std::to_string(dir.group) + " " + path + "; " + commands;
  if (euid == 0 || st.owner == euid) {
    return "Let the group that shares the directory read and write it (" + commands +
           "), or run every writer as one user.";
  }
  if (!sys::in_group(st.group)) {
    return "Run as a member of its group (gid " + std::to_string(st.group) + ") or as its owner (uid " +
           std::to_string(st.owner) + ").";
  }
  return "Ask its owner (uid " + std::to_string(st.owner) + ") or root to let the group that shares the directory "
         "read and write it (" + commands + "), or run every writer as one user.";
}

void judge_ledger(const LockDir& dir, Uid euid, std::vector<FileProblem>& out) {
  sys::FileStatus st;
  const std::string path = in(dir.path, kRunsName);
  const std::string runs = "every --once-per run ";
  if (!sys::status_at(dir.fd.get(), kRunsName, st)) {
    // Missing: the first --once-per run creates it, if it can.
    if (errno != ENOENT) return;
    if (read_only(dir.fd.get())) {
      out.push_back({path, runs + "exits 73: it does not exist, and DIR's file system is read-only",
                     "Remount it read-write; runs without --once-per still lock it."});
    } else if (!sys::may_access(dir.fd.get(), ".", kWriteIn) && runs_here(dir)) {
      out.push_back({path, runs + "by you exits 73: it does not exist, and you cannot create it in DIR",
                     create_once_hint(dir, path, euid)});
    }
    return;
  }
  if (read_only(dir.fd.get())) {
    out.push_back({path, runs + "exits 73 unless its slot was run: DIR's file system is read-only, so no run can be "
                                "recorded",
                   "Remount it read-write; runs without --once-per still lock it."});
  } else if (auto r = refuse_ledger(st, dir.st, euid, dir.path)) {
    out.push_back({path, runs + "refuses it (exit 73): " + r->why, r->hint});
  } else if (!sys::may_access(dir.fd.get(), kRunsName, kRead)) {
    out.push_back({path, runs + "by you exits 73: you cannot read it (" + owner_mode(st) + ")",
                   share_fix(path, st, dir.st, euid)});
  } else if (!sys::may_access(dir.fd.get(), kRunsName, kWrite) && !may_replace(dir.fd.get(), dir.st, st, euid)) {
    out.push_back({path,
                   runs + "by you exits 73: you can neither rewrite it (" + owner_mode(st) +
                       ") nor replace it (you cannot write in DIR, or DIR is sticky)",
                   share_fix(path, st, dir.st, euid)});
  }
}

void judge_incidents(const LockDir& dir, Uid euid, std::vector<FileProblem>& out) {
  const std::string path = in(dir.path, kIncidentsName);
  const std::string lost = "every incident row is lost (one warning each time): ";
  if (read_only(dir.fd.get())) {
    out.push_back({path, lost + "DIR's file system is read-only", "Remount it read-write."});
    return;
  }
  sys::FileStatus st;
  if (!sys::status_at(dir.fd.get(), kIncidentsName, st)) {
    if (errno == ENOENT && !sys::may_access(dir.fd.get(), ".", kWriteIn) && runs_here(dir)) {
      out.push_back({path,
                     "your runs' incident rows are lost (one warning each time): it does not exist, and you "
                     "cannot create it in DIR",
                     create_once_hint(dir, path, euid)});
    }
    return;
  }
  const std::string move = "Move it away; looplock creates a regular file there on the next incident.";
  if (st.symlink()) {
    out.push_back({path, lost + "it is a symbolic link, which looplock never writes through", move});
  } else if (st.directory()) {
    out.push_back({path, lost + "it is a directory", move});
  } else if (!st.regular()) {
    out.push_back({path, lost + "it is not a regular file (a FIFO, socket or device)", move});
  } else if (st.links > 1) {
    out.push_back({path, lost + "it has " + std::to_string(st.links) + " hard links",
                   "Replace it with a fresh regular file; rotate it by renaming it, never by a hard link."});
  } else if (!sys::may_access(dir.fd.get(), kIncidentsName, kWrite)) {
    out.push_back({path, "your runs' incident rows are lost (one warning each time): you cannot write it (" +
                             owner_mode(st) + ")",
                   share_fix(path, st, dir.st, euid)});
  }
}

}  // namespace

namespace {

// The files of one kind beside the lock file, named `prefix`...: a run that
// reaches one (`runs`: "a -p coalesce run of its operation that finds the
// lock held ") refuses an unsafe one, and exits 73 on one it cannot even
// read. A missing one is made by the first run that needs it.
struct BesideKind {
  std::string_view prefix;
  std::string_view noun;   // "coalesce seat"
  std::string_view event;  // "unsafe_coalesce_seat"
  std::string_view runs;
  bool (*named)(std::string_view name);  // the names of this kind among those with the prefix
  // What such a run does with one the caller cannot open.
  std::string_view unopenable = "by you exits 73";
};

void judge_beside(const LockDir& dir, Uid euid, const BesideKind& kind, std::vector<FileProblem>& out) {
  const auto names = sys::names_in(dir.fd.get(), kind.prefix);
  if (!names) return;
  const std::string runs(kind.runs);
  for (const auto& name : *names) {
    sys::FileStatus st;
    const std::string path = in(dir.path, name);
    if (!kind.named(name) || !sys::status_at(dir.fd.get(), name.c_str(), st)) continue;
    if (auto r = refuse_file(st, dir.st, euid, kind.noun, name, kind.event, dir.path)) {
      out.push_back({path, runs + "refuses it (exit 73): " + r->why, r->hint});
    } else if (!sys::may_access(dir.fd.get(), name, kRead)) {
      out.push_back({path, runs + std::string(kind.unopenable) + ": you cannot open it (" + owner_mode(st) + ")",
                     share_fix(path, st, dir.st, euid)});
    }
  }
}

}  // namespace

namespace {

bool ledger_covers(const LockDir& dir, const std::string& operation, long long started_ms) {
  try {
    const auto e = entry_of(read_ledger(dir), operation);
    return e && run_covers(*e, started_ms);
  } catch (const Fatal&) {
    return false;  // unreadable: --inspect says so beside
  }
}

// A seat whose waiter died (KILLed) after it absorbed runs: they never ran,
// unless the run ledger shows a run that did their work.
void judge_dead_waiters(const LockDir& dir, std::vector<FileProblem>& out) {
  const auto names = sys::names_in(dir.fd.get(), kCoalescePrefix);
  if (!names) return;
  for (const auto& name : *names) {
    sys::FileStatus st;
    if (!sys::status_at(dir.fd.get(), name.c_str(), st) || !st.regular()) continue;
    const UniqueFd fd = sys::open_in(dir.fd.get(), name, {.access = sys::OpenIn::Access::Read, .above_stdio = true});
    const auto text = fd ? sys::pread_all(fd.get(), 1 << 20) : std::nullopt;
    const auto waiter = text ? seat_record(*text) : std::nullopt;
    if (!waiter || sys::process_start(waiter->pid) == waiter->pid_start) continue;  // none, or alive
    const Absorbed absorbed = count_absorbed(*text, *waiter);
    const int n = absorbed.count;
    if (n == 0) continue;
    // The run ledger (--once-per) shows a run of it that did their work.
    if (absorbed.newest_started_ms && ledger_covers(dir, waiter->operation, *absorbed.newest_started_ms)) continue;
    out.push_back({in(dir.path, name),
                   "its waiter, pid " + std::to_string(waiter->pid) + " (operation " + printable(waiter->operation) +
                       "), died while it waited, after it absorbed " + std::to_string(n) + " later run" +
                       (n == 1 ? "" : "s") + " of it, which did not run then",
                   "A run of " + printable(waiter->operation) +
                       " since then did their work; if none ran, run it now. The next -p coalesce run of it that "
                       "waits clears this seat (and says what it found)."});
  }
}

}  // namespace

// -p coalesce's seats (records/coalesce.hpp), one per operation.
void judge_seats(const LockDir& dir, Uid euid, std::vector<FileProblem>& out) {
  judge_beside(dir, euid,
               {.prefix = kCoalescePrefix,
                .noun = "coalesce seat",
                .event = "unsafe_coalesce_seat",
                .runs = "a -p coalesce run of its operation that finds the lock held ",
                .named = [](std::string_view) { return true; },
                .unopenable = "by you cannot take it: it says so (coalesce_unavailable) and waits for the lock "
                              "without absorbing later runs, so each of them runs in its turn"},
               out);
  judge_dead_waiters(dir, out);
}

// --holders' index files (records/holders.hpp).
void judge_indexes(const LockDir& dir, Uid euid, std::vector<FileProblem>& out) {
  judge_beside(dir, euid,
               {.prefix = kHoldersPrefix,
                .noun = "holder index",
                .event = "unsafe_holder_index",
                .runs = "a --holders run that takes this index ",
                .named = [](std::string_view name) { return index_of_name(name).has_value(); }},
               out);
}

std::vector<FileProblem> judge_lock_files(const LockDir& dir, Uid euid) {
  std::vector<FileProblem> out;
  judge_lock_file(dir, euid, out);
  judge_ledger(dir, euid, out);
  judge_incidents(dir, euid, out);
  judge_seats(dir, euid, out);
  judge_indexes(dir, euid, out);
  return out;
}

std::vector<FileProblem> judge_metrics_files(const std::string& metrics_dir, const std::string& lock_id, Uid euid) {
  std::vector<FileProblem> out;
  const std::string cannot = "your runs cannot update the metrics (a metrics_write_failed warning each run): ";
  const UniqueFd fd = sys::open_directory(metrics_dir);
  sys::FileStatus dir;
  if (!fd || !sys::status_of_fd(fd.get(), dir)) {
    out.push_back({metrics_dir, cannot + "it cannot be opened as a directory",
                   "Create it (node_exporter's --collector.textfile.directory), or correct --metrics-dir "
                   "($LOOPLOCK_METRICS_DIR)."});
    return out;
  }
  if (!sys::may_access(fd.get(), ".", kWriteIn)) {
    if (errno == EROFS) {
      out.push_back({metrics_dir, cannot + "its file system is read-only",
                     "Remount it read-write, or give --metrics-dir a directory on a writable file system."});
    } else {
      const std::string fix = "chgrp GROUP " + metrics_dir + "; chmod 2775 " + metrics_dir;
      out.push_back({metrics_dir, cannot + "you cannot write in it (" + owner_mode(dir) + ")",
                     euid == 0 || dir.owner == euid
                         ? "Give it to the group that runs looplock: " + fix + "."
                         : "Ask its owner (uid " + std::to_string(dir.owner) +
                               ") or root to give it to the group that runs looplock (" + fix +
                               "), or run as a user who may write in it."});
    }
  }
  const std::string name = metrics_file_name(lock_id);
  const std::string lock = "." + name + ".lock";
  sys::FileStatus st;
  if (sys::status_at(fd.get(), lock.c_str(), st)) {
    const std::string path = in(metrics_dir, lock);
    if (!st.regular() || !sys::may_access(fd.get(), lock, kRead)) {
      out.push_back({path, cannot + "you cannot open its update lock (" + owner_mode(st) + ")",
                     share_fix(path, st, dir, euid)});
    } else if (sys::abilities().permission_bits && (st.mode & sys::mode::kOtherRead)) {
      out.push_back({path,
                     "any local user can open this update lock and hold it, stalling every update of the metrics (" +
                         owner_mode(st) + ": earlier versions made it 0644)",
                     "chmod 0660 " + path + "."});
    }
  }
  if (sys::abilities().permission_bits && sys::status_at(fd.get(), name.c_str(), st) && st.regular() &&
      !(st.mode & (sys::mode::kGroupRead | sys::mode::kOtherRead))) {
    const std::string path = in(metrics_dir, name);
    out.push_back({path,
                   "only uid " + std::to_string(st.owner) + " can read it (" + owner_mode(st) +
                       "): node_exporter, running as another user, cannot collect it (made under umask 077)",
                   std::string(euid == 0 || st.owner == euid ? "" : "Ask its owner or root to run: ") + "chmod 0664 " +
                       path + " " + in(metrics_dir, "." + name + ".next") +
                       " (looplock never changes a mode), and run looplock under umask 002 or 022 from now on."});
  }
  return out;
}

}  // namespace looplock
