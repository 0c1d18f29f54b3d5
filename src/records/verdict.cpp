#include "records/verdict.hpp"

#include <algorithm>
#include <cstring>

#include "base/duration.hpp"
#include "base/text.hpp"
#include "os/ids.hpp"
#include "records/lockfile.hpp"

namespace looplock {

namespace {

std::string record_holder(const HolderRecord& r) {
  return "pid " + std::to_string(r.pid) + " (agent " + r.agent_id + ", operation " + r.operation + ", policy " +
         r.policy + ", since " + r.acquired_at + ")";
}

// "pid 12 (flock)" or "pids 12 (flock), 13 (python3)".
std::string holders_text(const std::vector<LockHolder>& holders) {
  std::string out = holders.size() > 1 ? "pids " : "pid ";
  for (size_t i = 0; i < holders.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(holders[i].pid);
    if (holders[i].exited) {
      out += " (exited; whoever holds the descriptor it passed on could not be found)";
    } else if (!holders[i].command.empty()) {
      out += " (" + holders[i].command + ")";
    }
  }
  return out;
}

bool is_looplock(const LockHolder& h) { return h.command == "looplock" || h.command == "looplock-etcd"; }

// An exclusive holder without a record that is a looplock the lock file is
// read-only for (not its owner, and the file not group-writable): as the
// group recipe under umask 022 has it, it holds the lock and writes no
// record (its run says read_only_lock_file).
bool read_only_looplocks(const LockFacts& f) {
  return !f.holders.empty() && std::all_of(f.holders.begin(), f.holders.end(), [&](const LockHolder& h) {
    return is_looplock(h) && f.file_uid && h.uid && *h.uid != *f.file_uid && *h.uid != 0 && !f.group_can_write;
  });
}

std::vector<Pid> pids_of(const std::vector<LockHolder>& holders) {
  std::vector<Pid> out;
  for (const auto& h : holders) {
    if (!h.exited) out.push_back(h.pid);
  }
  return out;
}

// How far in the future a holder record's start may lie before it is
// warned about: clocks slewed by NTP differ by less.
constexpr long long kRecordAheadToleranceMs = 1000;

bool contains(const std::vector<Pid>& v, Pid p) { return std::find(v.begin(), v.end(), p) != v.end(); }

// Whether the record's process is gone: dead, or its pid reused.
bool record_gone(const LockFacts& f) {
  return (f.record_pid_alive && !*f.record_pid_alive) || (f.record_same_process && !*f.record_same_process);
}

// What happened to the record's process, for a record that is not the holder's.
std::string gone_reason(const LockFacts& f) {
  if (f.record_pid_alive && !*f.record_pid_alive) return "has exited";
  if (f.record_same_process && !*f.record_same_process)
    return "is gone (pid reused: its pid now belongs to another process)";
  if (f.record_pid_alive) return "is alive but does not hold the lock";
  return "cannot be seen from here";
}

RecordState judge_record(const LockFacts& f, LockState state, bool& left_by_looplock) {
  if (f.record.state == HolderRead::State::Unreadable) return RecordState::Unreadable;
  if (f.record.state == HolderRead::State::Error) return RecordState::NotRead;
  if (!f.record.record) return RecordState::None;
  const HolderRecord& r = *f.record.record;
  const Pid here = f.record_pid_here.value_or(r.pid);
  // The kernel names its pid (and it is the same process), or a process holds
  // the lock through the descriptor the record's looplock locked and passed on.
  const bool direct = !r.released_at && std::any_of(f.holders.begin(), f.holders.end(), [&](const LockHolder& h) {
    return h.pid == here && h.locked_by == 0 && !h.exited &&
           (!h.start || r.pid_start.empty() || *h.start == r.pid_start || f.record_pid_here.has_value());
  });
  const bool via = std::any_of(f.holders.begin(), f.holders.end(),
                               [&](const LockHolder& h) { return h.locked_by != 0 && h.locked_by == here; });
  if (direct || via) {
    left_by_looplock = via && !direct;
    return RecordState::Current;
  }
  if (r.released_at) return RecordState::Released;
  const bool alive = f.record_pid_alive.value_or(false) && f.record_same_process.value_or(true);
  if (state == LockState::Held && !f.holders.empty()) return RecordState::Stale;
  // Where the system names no holder (Windows), the lock tested held and the
  // record's own process alive, told apart from any later one by its
  // creation time, is the holder: the one confirmation that system has.
  if (state == LockState::Held && f.tested_by_taking && f.record_pid_alive.value_or(false) &&
      f.record_same_process.value_or(false)) {
    return RecordState::Current;
  }
  // Its pid not visible from here (a pid namespace of our own): unknown,
  // not gone.
  if (state != LockState::Free) {
    return alive || !f.record_pid_alive.has_value() ? RecordState::Unconfirmed : RecordState::Stale;
  }
  if (r.no_fork && record_gone(f)) return RecordState::Ended;
  if (alive && f.record_pid_alive) return RecordState::Idle;
  return RecordState::Crashed;
}

void record_warnings(const LockFacts& f, const Verdict& v, std::vector<std::string>& w) {
  if (!v.read) return;
  const HolderRecord& r = *v.read;
  const std::string pid = std::to_string(r.pid);
  switch (v.record) {
    case RecordState::Crashed:
      w.push_back("the record says pid " + pid +
                  " holds the lock, but the kernel says it is free: the holder crashed "
                  "or was killed before releasing; the next run overwrites the record");
      if (f.record_pid_alive && !*f.record_pid_alive) {
        w.push_back("the record's pid " + pid + " is dead");
      } else if (f.record_same_process && !*f.record_same_process) {
        w.push_back("the record's pid " + pid +
                    " now belongs to another process (pid reused): the recorded holder is gone");
      }
      break;
    case RecordState::Stale:
      w.push_back("the holder record is stale: it names looplock pid " + pid + " (since " + r.acquired_at +
                  "), which " + gone_reason(f) +
                  (pids_of(v.holders).empty()
                       ? std::string()
                       : "; the kernel says " + pids_text(pids_of(v.holders), "holds", "hold") + " the lock") +
                  "; the next run overwrites the record");
      break;
    case RecordState::Idle:
      w.push_back("the record says pid " + pid + " holds the lock, but the kernel says it is free while pid " + pid +
                  " is alive: it let go of the lock without releasing the record");
      break;
    default: break;
  }
}

// The tools an operator finds and looks at a holder with: the system's
// (where it lists no lock holders, Windows', since that is where it runs).
struct OperatorTools {
  const char* find;   // who has the lock file open
  const char* watch;  // whether a process is stalled
};
OperatorTools operator_tools(const LockFacts& f) {
  if (f.tested_by_taking) return {"Sysinternals' handle.exe or Resource Monitor", "Task Manager, Process Explorer"};
  return {"fuser or lsof", "ps, strace"};
}

// DIR, from DIR/.state.lock as given.
std::string hold_dir(const std::string& lock_path) {
  const size_t name = std::string_view(kLockName).size() + 1;  // and its separator
  return lock_path.size() > name ? lock_path.substr(0, lock_path.size() - name) : std::string(".");
}

// Held longer than --stale-after: what to check. A hold runs no command
// that could stall; its job may be gone.
std::string stale_warning(const Verdict& v, const LockFacts& f) {
  const bool hold = v.read && v.read->hold && !v.read->released_at;
  return "held for " + format_duration(of_ms(*f.record_age_ms)) + ", longer than --stale-after " +
         format_duration(of_ms(f.stale_after_ms)) +
         (hold ? ": a hold (looplock --hold) until " + v.read->hold->ends_at +
                     "; if the job that took it is gone, 'looplock --release --force " + hold_dir(f.lock_path) +
                     "' ends it"
               : ": check whether " + pids_text(v.confirm) + " is stalled before terminating it");
}

// The kernel names processes that have exited: who holds the lock through
// the descriptor they passed on, and why.
std::string dead_kernel_warning(const LockFacts& f) {
  std::vector<Pid> found;
  for (const auto& h : f.holders) {
    if (h.locked_by != 0 && contains(f.dead_kernel_pids, h.locked_by)) found.push_back(h.pid);
  }
  const HolderRecord* rec = f.record.record ? &*f.record.record : nullptr;
  return "the kernel names " + pids_text(f.dead_kernel_pids) +
         (f.dead_kernel_pids.size() > 1 ? ", which have" : ", which has") +
         " exited: the lock is held through a descriptor passed on" +
         (found.empty() ? std::string(" (the holding process could not be found: try fuser or lsof on the lock file)")
                        : ", by " + pids_text(found)) +
         (rec && rec->hold && contains(f.dead_kernel_pids, rec->pid)
              ? "; they are the steps of the hold that pid " + std::to_string(rec->pid) +
                    " took (looplock --hold), which keep the lock until they end"
              : "; a background process started under looplock without -o/--close keeps the lock");
}

std::string held_action(const Verdict& v, const LockFacts& f) {
  const OperatorTools tools = operator_tools(f);
  if (v.confirm.empty()) {
    return "another process holds the lock, which the kernel does not name" +
           (f.kernel_unknown.empty() ? std::string() : " (" + f.kernel_unknown + ")") + ": find it with " + tools.find +
           " on the lock file, and confirm it is stalled before terminating it. Never delete the lock file.";
  }
  if (v.read && v.read->hold && !v.read->released_at && v.record == RecordState::Current &&
      !contains(f.dead_kernel_pids, v.read->pid)) {  // (its holder killed: its steps hold it, below)
    return "a hold (looplock --hold) keeps the lock until its job runs looplock --release, its --max-time passes "
           "or the process it is tied to ends; if the job is gone, 'looplock --release --force " +
           hold_dir(f.lock_path) + "' ends it (it checks the holder first). Never delete the lock file.";
  }
  const bool many = v.confirm.size() > 1;
  std::string confirm = "confirm that " + pids_text(v.confirm, "is", "are") + " alive and stalled (" + tools.watch +
                        ") before terminating " + (many ? "them" : "it") + "; the kernel frees the lock when " +
                        (many ? "they exit" : "it exits") + ". Never delete the lock file.";
  if (v.record == RecordState::Unconfirmed && v.holders.empty()) {
    return "if the holder is stuck: its record names pid " + std::to_string(v.read->pid) +
           ", which the kernel cannot confirm; check with " + tools.find +
           " on the lock file that it holds the lock, " + confirm;
  }
  return "if the holder is stuck: " + confirm;
}

// Where the lock file lies, who may take the lock, and who does.
void access_warnings(const LockFacts& f, std::vector<std::string>& w) {
  if (f.network_fs) {
    w.push_back("the loop directory is on a network file system (" + *f.network_fs +
                "): flock(2) there may not exclude processes on other hosts");
  }
  if (f.refusal) {
    w.push_back(std::string(f.refusal->event == "unsafe_loop_dir" ? "the loop directory is " : "the lock file: ") +
                f.refusal->why + ": looplock refuses to lock it (every run exits 73)");
  }
  if (f.others_can_read) {
    w.push_back("other users can read " + f.lock_path +
                ", so any local user can take this lock and stall every "
                "run: run 'chmod o-rw " +
                f.lock_path + "'");
  }
  if (!f.file_uid || !f.dir_uid) return;
  for (const auto& h : f.holders) {
    const bool member = f.sharing_gid && std::find(h.gids.begin(), h.gids.end(), *f.sharing_gid) != h.gids.end();
    if (h.uid && *h.uid != 0 && *h.uid != *f.file_uid && *h.uid != *f.dir_uid && !member) {
      w.push_back("pid " + std::to_string(h.pid) + " holds the lock as uid " + std::to_string(*h.uid) +
                  ", neither the lock file's owner (uid " + std::to_string(*f.file_uid) + ") nor DIR's (uid " +
                  std::to_string(*f.dir_uid) + ")");
    }
  }
}

}  // namespace

std::string_view record_state_name(RecordState s) {
  switch (s) {
    case RecordState::None: return "none";
    case RecordState::Unreadable: return "unreadable";
    case RecordState::Current: return "current";
    case RecordState::Unconfirmed: return "unconfirmed";
    case RecordState::Stale: return "stale";
    case RecordState::Released: return "released";
    case RecordState::Ended: return "ended";
    case RecordState::Crashed: return "crashed";
    case RecordState::Idle: return "idle";
    case RecordState::NotRead: return "unread";
  }
  return "none";
}

std::string record_summary(const HolderRecord& r) {
  return "pid " + std::to_string(r.pid) + ", agent " + r.agent_id + ", operation " + r.operation + ", policy " +
         r.policy;
}

Verdict judge(const LockFacts& f) {
  Verdict v;
  v.holders = f.holders;
  const bool known = f.kernel_unknown.empty();
  v.state = !f.holders.empty() || f.seen_held ? LockState::Held : known ? LockState::Free : LockState::Unknown;
  for (const auto& h : f.holders) v.exclusive = v.exclusive || h.exclusive;
  if (f.record.record) v.read = *f.record.record;
  if (f.record_pid_alive) v.read_alive = *f.record_pid_alive && f.record_same_process.value_or(true);
  v.record = judge_record(f, v.state, v.left_by_looplock);
  if (v.state != LockState::Free) {
    v.confirm = pids_of(v.holders);
    if (v.confirm.empty() &&
        (v.record == RecordState::Unconfirmed || (v.record == RecordState::Current && f.tested_by_taking))) {
      v.confirm = {v.read->pid};
    }
  }

  std::vector<std::string>& w = v.warnings;
  access_warnings(f, w);
  // A hold released (looplock --release) while steps ran: they keep the
  // lock until they end, as looplock-sharing(7) says; nothing is wrong.
  const HolderRecord* rec = f.record.record ? &*f.record.record : nullptr;
  const bool released_hold_steps =
      rec && rec->hold && rec->released_at && contains(f.dead_kernel_pids, rec->pid) && f.dead_kernel_pids.size() == 1 &&
      std::any_of(f.holders.begin(), f.holders.end(), [&](const LockHolder& h) { return h.locked_by == rec->pid; });
  if (!f.dead_kernel_pids.empty() && !released_hold_steps) w.push_back(dead_kernel_warning(f));
  if (f.record.state == HolderRead::State::Unreadable) {
    // Where the record has a file of its own (Windows), that file holds them.
    w.push_back(
        std::string(record_beside_lock() ? "the holder record's file " + std::string(kHolderName) : "the lock file") +
        " holds " + std::to_string(f.record.size) +
        " bytes that are not a valid holder record (garbage, or a writer from another tool)");
  }
  if (!known) w.push_back("the kernel's view is unknown: " + f.kernel_unknown);
  record_warnings(f, v, w);
  const bool no_record =
      v.record == RecordState::None || v.record == RecordState::Released || v.record == RecordState::Unreadable;
  if (!v.holders.empty() && no_record && v.exclusive && f.dead_kernel_pids.empty()) {
    v.read_only_holder = read_only_looplocks(f);
    const bool looplocks = std::all_of(v.holders.begin(), v.holders.end(), is_looplock);
    if (!v.read_only_holder) {
      w.push_back("held by " + pids_text(v.confirm) + " without a current holder record" +
                  (looplocks ? " (a looplock whose record could not be written: its run warned why)"
                             : " (flock(1), Python fcntl.flock or another tool)"));
    }
  }
  if (f.tested_by_taking && v.state == LockState::Held && v.holders.empty() && no_record && f.tested_exclusive) {
    w.push_back(
        "held without a current holder record, by a process the system does not name (the loop scripts' "
        "msvcrt.locking, portalocker or another tool)");
  }
  if (v.record == RecordState::NotRead && f.exists) {
    w.push_back("the lock file cannot be read here (" + std::string(std::strerror(f.record.err ? f.record.err : EIO)) +
                "): its holder record is not known; look as a user who can read it (its owner, a member of its "
                "group where its mode lets them, or root)");
  }
  if ((v.record == RecordState::Current || v.record == RecordState::Unconfirmed) && f.record_age_ms &&
      *f.record_age_ms < -kRecordAheadToleranceMs) {
    w.push_back("its holder record says the hold began " + format_duration(-of_ms(*f.record_age_ms)) +
                " from now, by this host's clock: the clock that wrote it was ahead (this host's, set back since, "
                "or another host's on a shared file system); --stale-after counts from then");
  }
  if ((v.record == RecordState::Current || v.record == RecordState::Unconfirmed) && f.record_age_ms &&
      *f.record_age_ms > f.stale_after_ms) {
    w.push_back(stale_warning(v, f));
  }

  if (v.state == LockState::Unknown && v.confirm.empty()) {
    v.action = "unknown: looplock cannot see whether the lock is held (" + f.kernel_unknown +
               "); look from where the holder is visible (the host, another pid namespace), or with fuser or lsof on "
               "the lock file. Never delete the lock file.";
  } else if (v.state == LockState::Free) {
    v.action = "none: the lock is free";
  } else {
    v.action = held_action(v, f);
  }
  if (f.refusal) {
    v.action = "every run refuses this lock file (exit 73): " + f.refusal->hint +
               (v.state == LockState::Free ? std::string() : " Meanwhile, " + v.action);
  }
  return v;
}

std::string holder_phrase(const Verdict& v) {
  if (v.record == RecordState::Current && v.read) {
    if (!v.left_by_looplock) return record_holder(*v.read);
    std::vector<LockHolder> now;
    for (const auto& h : v.holders) {
      if (h.locked_by == v.read->pid) now.push_back(h);
    }
    return holders_text(now) + ", left holding the lock by looplock " + record_holder(*v.read) +
           (v.read_alive.value_or(false) ? std::string() : ", which has exited");
  }
  if (!v.holders.empty()) {
    return holders_text(v.holders) +
           (v.record == RecordState::NotRead ? ": its holder record cannot be read here"
            : v.read_only_holder ? ": no holder record (the lock file is read-only for it; its owner makes it "
                                   "group-writable with chmod g+w)"
            : v.exclusive        ? ": no looplock record"
                                 : ": a shared lock (no holder record: --holders runs name themselves in their index "
                                   "files, readers without it nowhere)");
  }
  if (v.record == RecordState::Unconfirmed && v.read) {
    return record_holder(*v.read) + ", by its holder record (the kernel does not confirm it)";
  }
  if (v.state == LockState::Held) return "another process (the kernel does not say which)";
  if (v.state == LockState::Unknown) return "unknown";
  return "none";
}

namespace {

std::string text_field(const Json& j, const char* k) {
  return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("?");
}

std::string describe_contender(const Json& h, const char* when, const char* field) {
  std::string pid = h.contains("pid") && h["pid"].is_number_integer() ? std::to_string(h["pid"].get<long long>()) : "?";
  const bool hold = h.contains("hold") && h["hold"] == Json(true);
  return printable("host " + text_field(h, "host") + " pid " + pid + " (agent " + text_field(h, "agent_id") +
                   ", operation " + text_field(h, "operation") + ", " + when + " " + text_field(h, field) +
                   (hold ? ", a --hold" : "") + ")");
}
}  // namespace

std::string describe_cluster_holder(const std::optional<Json>& holder) {
  if (!holder) return "a holder that left no value (another client, such as etcdctl lock)";
  return describe_contender(*holder, "since", "acquired_at");
}

std::string describe_cluster_waiter(const std::optional<Json>& waiter) {
  if (!waiter) return "a waiter that left no value (another client, such as etcdctl lock)";
  return describe_contender(*waiter, "queued", waiter->contains("queued_at") ? "queued_at" : "acquired_at");
}

ClusterVerdict judge_cluster(const std::optional<Json>& holder, const std::string& this_host) {
  ClusterVerdict v;
  v.holder = describe_cluster_holder(holder);
  v.on_this_host = holder && holder->is_object() && holder->value("host", std::string()) == this_host;
  v.confirm = "the holder";
  if (v.on_this_host && holder->contains("pid") && (*holder)["pid"].is_number_integer()) {
    v.confirm = "pid " + std::to_string((*holder)["pid"].get<long long>());
  }
  return v;
}

}  // namespace looplock
