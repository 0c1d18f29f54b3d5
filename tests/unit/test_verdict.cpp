#include "records/verdict.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "os/ids.hpp"
#include "samples.hpp"

using looplock::HolderRead;
using looplock::HolderRecord;
using looplock::LockFacts;
using looplock::LockHolder;
using looplock::LockState;
using looplock::Pid;
using looplock::RecordState;
using looplock::Uid;
using looplock::Verdict;

namespace {

constexpr long long kHourMs = 3'600'000;
const std::string kSince = "2026-11-30T17:00:00.123Z";
const std::string kRecordHolder = "pid 1234 (agent cron, operation status.py, policy mutation, since " + kSince + ")";

LockHolder holder(Pid pid, const char* command = "", bool exclusive = true) {
  LockHolder h;
  h.pid = pid;
  h.exclusive = exclusive;
  h.command = command;
  return h;
}

LockFacts free_lock() {
  LockFacts f;
  f.lock_path = "loops/nightly/.state.lock";
  f.record.state = HolderRead::State::Empty;
  return f;
}

LockFacts with_record(LockFacts f, std::optional<std::string> released = std::nullopt) {
  f.record.state = HolderRead::State::Valid;
  f.record.record = testutil::sample_record(std::move(released));
  f.record_age_ms = 60'000;
  f.record_pid_alive = true;
  f.record_same_process = true;
  return f;
}

// A looplock (pid 1234) holds the lock and its record says so.
LockFacts held_by_record() {
  LockFacts f = with_record(free_lock());
  LockHolder h = holder(1234, "looplock");
  h.start = "987654";
  f.holders = {h};
  return f;
}

bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const auto& s : v)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("free, no record: no warnings, nothing to do") {
  Verdict v = looplock::judge(free_lock());
  CHECK(v.state == LockState::Free);
  CHECK(v.record == RecordState::None);
  CHECK(v.warnings.empty());
  CHECK(v.action == "none: the lock is free");
  CHECK(looplock::holder_phrase(v) == "none");
}

TEST_CASE("where the system lists no holders, the lock tested by taking it: held or free, and the system's tools") {
  LockFacts f = free_lock();
  f.tested_by_taking = true;
  Verdict v = looplock::judge(f);
  CHECK(v.state == LockState::Free);
  CHECK(v.warnings.empty());  // nothing is wrong: the system cannot say more
  CHECK(v.action == "none: the lock is free");

  f.seen_held = true;
  f.tested_exclusive = true;
  v = looplock::judge(f);
  CHECK(v.state == LockState::Held);
  CHECK(v.action.find("Sysinternals' handle.exe") != std::string::npos);
  CHECK(v.action.find("fuser") == std::string::npos);

  // No record of the holder: another tool's, named as such.
  CHECK(any_contains(v.warnings, "held without a current holder record, by a process the system does not name"));

  // A looplock's record, its process alive with the recorded creation time:
  // the holder, the one confirmation this system has.
  LockFacts live = with_record(f);
  v = looplock::judge(live);
  CHECK(v.record == RecordState::Current);
  CHECK(v.warnings.empty());
  CHECK(looplock::holder_phrase(v) == kRecordHolder);
  CHECK(v.confirm == std::vector<Pid>{live.record.record->pid});
  CHECK(v.action.find("(Task Manager, Process Explorer)") != std::string::npos);

  // Its pid now another process's (another creation time): not the holder.
  live.record_same_process = false;
  v = looplock::judge(live);
  CHECK(v.record == RecordState::Stale);
}

TEST_CASE("held by the recorded looplock: the record names the holder") {
  Verdict v = looplock::judge(held_by_record());
  CHECK(v.state == LockState::Held);
  CHECK(v.record == RecordState::Current);
  CHECK(v.warnings.empty());
  CHECK(looplock::holder_phrase(v) == kRecordHolder);
  CHECK(v.confirm == std::vector<Pid>{1234});
  CHECK(v.action.find("confirm that pid 1234 is alive and stalled") != std::string::npos);
  CHECK(v.action.find("Never delete the lock file") != std::string::npos);
}

TEST_CASE("a crashed looplock's record is never pinned on the next holder") {
  // looplock 1234 was killed with KILL; flock(1) took the lock fresh.
  LockFacts f = with_record(free_lock());
  f.record_pid_alive = false;
  f.record_same_process.reset();
  f.holders = {holder(2001, "flock")};
  Verdict v = looplock::judge(f);
  CHECK(v.record == RecordState::Stale);
  CHECK(looplock::holder_phrase(v) == "pid 2001 (flock): no looplock record");
  CHECK(v.confirm == std::vector<Pid>{2001});
  CHECK(v.action.find("pid 2001") != std::string::npos);
  CHECK(v.action.find("1234") == std::string::npos);
  CHECK(any_contains(v.warnings, "the holder record is stale: it names looplock pid 1234"));
  CHECK(any_contains(v.warnings, "which has exited; the kernel says pid 2001 holds the lock"));

  // The kernel names the record's pid, but another process has it now.
  f.holders = {holder(1234, "bash")};
  f.holders[0].start = "5";
  f.record_pid_alive = true;
  f.record_same_process = false;
  v = looplock::judge(f);
  CHECK(v.record == RecordState::Stale);
  CHECK(looplock::holder_phrase(v) == "pid 1234 (bash): no looplock record");
  CHECK(any_contains(v.warnings, "its pid now belongs to another process"));
}

TEST_CASE("free with an unreleased record: crashed, and the next run overwrites it") {
  LockFacts f = with_record(free_lock());
  f.record_pid_alive = false;
  Verdict v = looplock::judge(f);
  CHECK(v.record == RecordState::Crashed);
  CHECK(any_contains(v.warnings, "crashed or was killed before releasing"));
  CHECK(any_contains(v.warnings, "the record's pid 1234 is dead"));
  CHECK(v.action == "none: the lock is free");
  f.record_pid_alive = true;
  f.record_same_process = false;
  v = looplock::judge(f);
  CHECK(v.record == RecordState::Crashed);
  CHECK(any_contains(v.warnings, "pid reused"));
  // Alive, the same process, yet the lock is free.
  f.record_same_process = true;
  v = looplock::judge(f);
  CHECK(v.record == RecordState::Idle);
  CHECK(any_contains(v.warnings, "while pid 1234 is alive"));
}

TEST_CASE("an -F run's record whose process ended: ended, no warning") {
  LockFacts f = with_record(free_lock());
  f.record.record->no_fork = true;
  f.record_pid_alive = false;
  Verdict v = looplock::judge(f);
  CHECK(v.record == RecordState::Ended);
  CHECK(v.warnings.empty());
  // The pid reused: ended too.
  f.record_pid_alive = true;
  f.record_same_process = false;
  CHECK(looplock::judge(f).record == RecordState::Ended);
  // Still running and holding: the ordinary holder.
  LockFacts held = held_by_record();
  held.record.record->no_fork = true;
  CHECK(looplock::judge(held).record == RecordState::Current);
}

TEST_CASE("released record, lock free or held by another tool") {
  LockFacts f = with_record(free_lock(), "2026-11-30T17:00:05.000Z");
  Verdict v = looplock::judge(f);
  CHECK(v.record == RecordState::Released);
  CHECK(v.warnings.empty());
  f.holders = {holder(555, "flock")};
  v = looplock::judge(f);
  CHECK(looplock::holder_phrase(v) == "pid 555 (flock): no looplock record");
  CHECK(any_contains(v.warnings, "held by pid 555 without a current holder record"));
}

TEST_CASE("shared holders write no record: named, and no warning") {
  LockFacts f = free_lock();
  f.holders = {holder(7, "python3", false), holder(8, "flock", false)};
  Verdict v = looplock::judge(f);
  CHECK_FALSE(v.exclusive);
  CHECK(v.warnings.empty());
  CHECK(looplock::holder_phrase(v) == "pids 7 (python3), 8 (flock): a shared lock (no holder record: --holders runs "
                                      "name themselves in their index files, readers without it nowhere)");
  CHECK(v.action.find("confirm that pids 7, 8 are alive and stalled (ps, strace) before terminating them; the "
                      "kernel frees the lock when they exit") != std::string::npos);
}

TEST_CASE("held through a descriptor the recorded looplock passed on before it exited") {
  LockFacts f = with_record(free_lock(), "2026-11-30T17:00:05.000Z");  // released normally, then exited
  f.record_pid_alive = false;
  LockHolder daemon = holder(4100, "sleep");
  daemon.locked_by = 1234;
  f.holders = {daemon};
  f.dead_kernel_pids = {1234};
  Verdict v = looplock::judge(f);
  CHECK(v.record == RecordState::Current);
  CHECK(v.left_by_looplock);
  CHECK(looplock::holder_phrase(v) ==
        "pid 4100 (sleep), left holding the lock by looplock " + kRecordHolder + ", which has exited");
  CHECK(v.confirm == std::vector<Pid>{4100});
  CHECK(any_contains(v.warnings, "the kernel names pid 1234, which has exited"));
  CHECK(any_contains(v.warnings, "by pid 4100"));
  // Nobody found holding the descriptor.
  LockFacts lost = free_lock();
  LockHolder gone = holder(4000);
  gone.exited = true;
  lost.holders = {gone};
  lost.dead_kernel_pids = {4000};
  v = looplock::judge(lost);
  CHECK(v.state == LockState::Held);
  CHECK(v.confirm.empty());
  CHECK(any_contains(v.warnings, "could not be found"));
  CHECK(v.action.find("fuser or lsof") != std::string::npos);
}

TEST_CASE("the kernel's view is unknown: never free, and an unconfirmed record is said to be one") {
  LockFacts f = with_record(free_lock());
  f.kernel_unknown = "cannot read /proc/locks: No such file or directory";
  Verdict v = looplock::judge(f);
  CHECK(v.state == LockState::Unknown);
  CHECK(v.record == RecordState::Unconfirmed);
  CHECK(looplock::holder_phrase(v) == kRecordHolder + ", by its holder record (the kernel does not confirm it)");
  CHECK(any_contains(v.warnings, "the kernel's view is unknown"));
  CHECK(v.action.find("its record names pid 1234, which the kernel cannot confirm") != std::string::npos);
  // No record: "unknown", and what to do about it.
  LockFacts none = free_lock();
  none.kernel_unknown = "x";
  v = looplock::judge(none);
  CHECK(v.action.starts_with("unknown: looplock cannot see whether the lock is held (x)"));
  CHECK(looplock::holder_phrase(v) == "unknown");
  // A run that found the lock held, the kernel not saying by whom.
  none.seen_held = true;
  v = looplock::judge(none);
  CHECK(v.state == LockState::Held);
  CHECK(looplock::holder_phrase(v) == "another process (the kernel does not say which)");
}

TEST_CASE("a record written in a pid namespace of its own names its holder there") {
  LockFacts f = with_record(free_lock());
  f.record.record->pid = 1;
  LockHolder h = holder(4321, "looplock");
  h.start = "987654";
  f.holders = {h};
  f.record_pid_here = 4321;
  Verdict v = looplock::judge(f);
  CHECK(v.record == RecordState::Current);
  CHECK(v.warnings.empty());
}

TEST_CASE("every reason a run refuses the lock file is a warning") {
  LockFacts f = held_by_record();
  f.refusal =
      looplock::Refusal{"it has 2 hard links; a lock file must have exactly one", "Replace it.", "unsafe_lock_file"};
  Verdict v = looplock::judge(f);
  CHECK(any_contains(v.warnings,
                     "the lock file: it has 2 hard links; a lock file must have exactly one: looplock "
                     "refuses to lock it (every run exits 73)"));
  CHECK(v.action.starts_with("every run refuses this lock file (exit 73): Replace it. Meanwhile, if the holder"));
  f = free_lock();
  f.refusal = looplock::Refusal{"world-writable without the sticky bit", "chmod o-w D.", "unsafe_loop_dir"};
  v = looplock::judge(f);
  CHECK(any_contains(v.warnings, "the loop directory is world-writable without the sticky bit: looplock refuses"));
  CHECK(v.action == "every run refuses this lock file (exit 73): chmod o-w D.");
}

TEST_CASE("who may hold the lock: readable by others, or held by a foreign user") {
  LockFacts f = held_by_record();
  f.others_can_read = true;
  Verdict v = looplock::judge(f);
  CHECK(any_contains(v.warnings,
                     "other users can read loops/nightly/.state.lock, so any local user can take this "
                     "lock and stall every run: run 'chmod o-rw loops/nightly/.state.lock'"));
  f.others_can_read = false;
  f.file_uid = 1000;
  f.dir_uid = 1001;
  f.holders[0].uid = 2000;
  CHECK(any_contains(
      looplock::judge(f).warnings,
      "pid 1234 holds the lock as uid 2000, neither the lock file's owner (uid 1000) nor DIR's (uid 1001)"));
  for (Uid ok : {0u, 1000u, 1001u}) {
    f.holders[0].uid = ok;
    CHECK(looplock::judge(f).warnings.empty());
  }
  // A member of the group that may open the file (the man page's group
  // recipe) holds it as it should; in another group, or where the group may
  // not open it, it does not.
  f.holders[0].uid = 2000;
  f.holders[0].gids = {2000, 2000, 5000};
  f.sharing_gid = 5000;
  CHECK(looplock::judge(f).warnings.empty());
  f.sharing_gid = 5001;
  CHECK_FALSE(looplock::judge(f).warnings.empty());
  f.sharing_gid.reset();
  CHECK_FALSE(looplock::judge(f).warnings.empty());
}

TEST_CASE("a hold older than stale_after") {
  LockFacts f = held_by_record();
  f.record_age_ms = 3 * kHourMs;
  CHECK(any_contains(looplock::judge(f).warnings,
                     "held for 3.0h, longer than --stale-after 2.0h: check whether pid 1234"));
  f.record_age_ms = 2 * kHourMs;  // exactly the limit is not stale yet
  CHECK(looplock::judge(f).warnings.empty());
  f.stale_after_ms = 30 * 60'000;
  CHECK(any_contains(looplock::judge(f).warnings, "longer than --stale-after 30.0m"));
  f.record_age_ms.reset();
  CHECK(looplock::judge(f).warnings.empty());
}

TEST_CASE("a hold that begins in the future, by this host's clock: said, beyond a second") {
  LockFacts f = held_by_record();
  f.record_age_ms = -3'000;
  CHECK(any_contains(looplock::judge(f).warnings, "its holder record says the hold began 3.0s from now"));
  f.record_age_ms = -1'000;  // within what clocks slewed by NTP differ by
  CHECK(looplock::judge(f).warnings.empty());
  f.record_age_ms = 0;
  CHECK(looplock::judge(f).warnings.empty());
}

TEST_CASE("unreadable content, network file systems") {
  LockFacts f = free_lock();
  f.record.state = HolderRead::State::Unreadable;
  f.record.size = 17;
  Verdict v = looplock::judge(f);
  CHECK(v.record == RecordState::Unreadable);
  CHECK(any_contains(v.warnings, "17 bytes that are not a valid holder record"));
  f = free_lock();
  f.network_fs = "nfs";
  CHECK(any_contains(looplock::judge(f).warnings, "network file system (nfs)"));
}

TEST_CASE("pids_text agrees in number") {
  CHECK(looplock::pids_text({12}) == "pid 12");
  CHECK(looplock::pids_text({12, 13}) == "pids 12, 13");
  CHECK(looplock::pids_text({12}, "holds", "hold") == "pid 12 holds");
  CHECK(looplock::pids_text({12, 13}, "holds", "hold") == "pids 12, 13 hold");
}

TEST_CASE("the cluster holder and its waiters, named; a holder on this host is said to be here") {
  using looplock::Json;
  Json j = Json::parse(R"({"host":"host\n1","pid":42,"agent_id":"cron","operation":"tick.py",)"
                       R"("acquired_at":"2026-11-30T17:00:00.000Z","lease":"abc"})");
  std::string d = looplock::describe_cluster_holder(j);
  CHECK(d == "host host\\n1 pid 42 (agent cron, operation tick.py, since 2026-11-30T17:00:00.000Z)");
  CHECK(d.find('\n') == std::string::npos);  // control characters escaped
  CHECK(looplock::describe_cluster_waiter(j) ==
        "host host\\n1 pid 42 (agent cron, operation tick.py, queued 2026-11-30T17:00:00.000Z)");
  j["queued_at"] = "Q";
  CHECK(looplock::describe_cluster_waiter(j).ends_with("queued Q)"));
  CHECK(looplock::describe_cluster_waiter(std::nullopt).find("etcdctl") != std::string::npos);
  CHECK(looplock::describe_cluster_holder(std::nullopt).find("etcdctl") != std::string::npos);
  Json hold = j;
  hold["hold"] = true;  // a --hold's key: its steps renew its lease
  CHECK(looplock::describe_cluster_holder(hold).ends_with("since 2026-11-30T17:00:00.000Z, a --hold)"));

  auto here = looplock::judge_cluster(j, "host\n1");
  CHECK(here.on_this_host);
  CHECK(here.confirm == "pid 42");
  auto there = looplock::judge_cluster(j, "elsewhere");
  CHECK_FALSE(there.on_this_host);
  CHECK(there.confirm == "the holder");
  CHECK_FALSE(looplock::judge_cluster(std::nullopt, "host\n1").on_this_host);
}
