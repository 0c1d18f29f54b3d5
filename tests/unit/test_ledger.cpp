#include "records/ledger.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "base/error.hpp"
#include "os/ids.hpp"
#include "os/procfs.hpp"
#include "os/sys.hpp"
#include "records/lockfile.hpp"
#include "records/sealed.hpp"
#include "testutil.hpp"

using looplock::Pid;
using looplock::RunEntry;
using looplock::Slot;
using testutil::TempDir;

namespace {

RunEntry entry(std::string operation, long long started_ms, std::optional<long long> ended_ms = std::nullopt) {
  RunEntry e;
  e.operation = std::move(operation);
  e.host = "h1";
  e.pid = 4242;
  e.agent = "cron";
  e.started_ms = started_ms;
  e.ended_ms = ended_ms;
  if (ended_ms) e.exit_status = 0;
  return e;
}

constexpr long long kT = 1'796'000'000'000LL;  // a moment in 2026, in ms

template <typename F>
int fatal_status(F&& f) {
  try {
    f();
  } catch (const looplock::Fatal& e) {
    return e.status();
  }
  return 0;
}

}  // namespace

TEST_CASE("a run entry round-trips through JSON, and a damaged one is none") {
  RunEntry e = entry("tick.py", kT, kT + 2000);
  e.exit_status = 137;
  e.fencing_token = 99;
  const auto back = looplock::run_entry_from_json(looplock::run_entry_to_json(e));
  REQUIRE(back);
  CHECK(back->operation == "tick.py");
  CHECK(back->host == "h1");
  CHECK(back->pid == 4242);
  CHECK(back->agent == "cron");
  CHECK(back->started_ms == kT);
  CHECK(back->ended_ms == kT + 2000);
  CHECK(back->exit_status == 137);
  CHECK(back->fencing_token == 99);

  const auto running = looplock::run_entry_from_json(looplock::run_entry_to_json(entry("t", kT)));
  REQUIRE(running);
  CHECK_FALSE(running->ended_ms);
  CHECK_FALSE(running->exit_status);

  looplock::Json j = looplock::run_entry_to_json(e);
  for (const char* key : {"operation", "host", "pid", "agent_id", "started_ms"}) {
    looplock::Json broken = j;
    broken.erase(key);
    CHECK_MESSAGE(!looplock::run_entry_from_json(broken), key);
    broken = j;
    broken[key] = looplock::Json::array();
    CHECK_MESSAGE(!looplock::run_entry_from_json(broken), key);
  }
  looplock::Json broken = j;
  broken["ended_ms"] = "soon";
  CHECK_FALSE(looplock::run_entry_from_json(broken));
  broken = j;
  broken["pid"] = 0;
  CHECK_FALSE(looplock::run_entry_from_json(broken));
  CHECK_FALSE(looplock::run_entry_from_json(looplock::Json("x")));
}

TEST_CASE("describe_run says a run ended, and never presents it as a live process") {
  const std::string ended = looplock::describe_run(entry("t", kT, kT + 1500));
  CHECK(ended.find("host h1 pid 4242 (agent cron)") == 0);
  CHECK(ended.find("started at ") != std::string::npos);
  CHECK(ended.find("ended at ") != std::string::npos);
  CHECK(ended.find("with status 0") != std::string::npos);
  CHECK(ended.find("running") == std::string::npos);
  const std::string open = looplock::describe_run(entry("t", kT));
  CHECK(open.find("has not recorded its end") != std::string::npos);
}

TEST_CASE("judge_slot: the slot is DURATION from the recorded start, by this looplock's start") {
  const long long d = 4000;
  CHECK(looplock::judge_slot(std::nullopt, kT, d).slot == Slot::Free);
  // Ended within DURATION: done; at DURATION or later: free.
  CHECK(looplock::judge_slot(entry("t", kT - 3999, kT - 3000), kT, d).slot == Slot::Done);
  CHECK(looplock::judge_slot(entry("t", kT - 4000, kT - 3000), kT, d).slot == Slot::Free);
  CHECK(looplock::judge_slot(entry("t", kT - 60000, kT - 59000), kT, d).slot == Slot::Free);
  // Not ended within DURATION: running (or its looplock died).
  CHECK(looplock::judge_slot(entry("t", kT - 100), kT, d).slot == Slot::Running);
  // A start in the future (another host's clock is ahead) up to DURATION
  // counts, with how far ahead; further is damaged.
  const auto ahead = looplock::judge_slot(entry("t", kT + 3000, kT + 3500), kT, d);
  CHECK(ahead.slot == Slot::Done);
  CHECK(ahead.ahead_ms == 3000);
  CHECK(looplock::judge_slot(entry("t", kT + 4000, kT + 4500), kT, d).slot == Slot::Done);
  const auto far = looplock::judge_slot(entry("t", kT + 4001, kT + 4500), kT, d);
  CHECK(far.slot == Slot::Damaged);
  CHECK(far.ahead_ms == 4001);
  CHECK(looplock::judge_slot(entry("t", kT - 5, kT - 1), kT, d).ahead_ms == 0);
}

TEST_CASE("with_entry replaces the operation's entry; past 64 operations the oldest out of their slot go") {
  std::vector<RunEntry> es;
  es = looplock::with_entry(es, entry("a", kT), kT).entries;
  es = looplock::with_entry(es, entry("b", kT + 1), kT).entries;
  es = looplock::with_entry(es, entry("a", kT + 2, kT + 3), kT).entries;
  REQUIRE(es.size() == 2);
  CHECK(es[0].operation == "b");
  CHECK(es[1].operation == "a");
  CHECK(es[1].ended_ms == kT + 3);
  // Entries without a slot length (earlier versions) or whose slot is over go first.
  for (int i = 0; i < 100; ++i) es = looplock::with_entry(es, entry("op" + std::to_string(i), kT + i), kT).entries;
  CHECK(es.size() == looplock::kMaxLedgerOperations);
  CHECK(es.front().operation == "op36");  // the oldest went first
  CHECK(es.back().operation == "op99");
}

TEST_CASE("an entry inside its own slot is never dropped below the hard cap: the ledger grows, and says so") {
  auto slotted = [](std::string op, long long started, long long once_per_ms) {
    RunEntry e = entry(std::move(op), started, started + 10);
    e.once_per_ms = once_per_ms;
    return e;
  };
  std::vector<RunEntry> es;
  es = looplock::with_entry(es, slotted("good", kT, 300'000), kT).entries;  // a 5-minute slot, now
  // 100 other operations, each with a 1-minute slot, all inside it.
  looplock::LedgerUpdate u;
  for (int i = 0; i < 100; ++i) {
    u = looplock::with_entry(es, slotted("bad" + std::to_string(i), kT + i, 60'000), kT + 100);
    es = u.entries;
  }
  CHECK(es.size() == 101);
  CHECK(es.front().operation == "good");
  CHECK(u.crowded == 101);
  CHECK(u.dropped_in_slot == 0);
  // A minute later the "bad" slots are over, "good"'s is not: they go, it stays.
  u = looplock::with_entry(es, slotted("next", kT + 70'000, 60'000), kT + 70'000);
  CHECK(u.entries.size() == looplock::kMaxLedgerOperations);
  CHECK(u.entries.front().operation == "good");
  CHECK(u.crowded == 0);
  // At the hard cap the oldest go whatever their slot.
  es.clear();
  for (size_t i = 0; i < looplock::kMaxLedgerEntries + 3; ++i) {
    u = looplock::with_entry(es, slotted("op" + std::to_string(i), kT, 60'000), kT);
    es = u.entries;
  }
  CHECK(es.size() == looplock::kMaxLedgerEntries);
  CHECK(es.front().operation == "op3");
  CHECK(u.dropped_in_slot == 1);
}

TEST_CASE("names are compared and stored whole: invalid UTF-8 is kept in hex beside its display") {
  const std::string raw = std::string("tick\xff", 5);
  RunEntry e = entry(raw, kT, kT + 1);
  const looplock::Json j = looplock::run_entry_to_json(e);
  CHECK(j["operation_bytes"] == "7469636bff");
  CHECK(looplock::dump_json(j["operation"]) == "\"tick\xef\xbf\xbd\"");  // U+FFFD for display
  const auto back = looplock::run_entry_from_json(j);
  REQUIRE(back);
  CHECK(back->operation == raw);
  // Valid UTF-8 is stored as it is, without hex.
  CHECK_FALSE(looplock::run_entry_to_json(entry("t\xc3\xa9", kT)).contains("operation_bytes"));
  // A ledger keeps tick\xff apart from tick\ufffd and from other names.
  std::vector<RunEntry> es;
  es = looplock::with_entry(es, entry("tick\xef\xbf\xbd", kT, kT + 1), kT).entries;
  es = looplock::with_entry(es, e, kT).entries;
  CHECK(es.size() == 2);
  looplock::LedgerRead read;
  for (const auto& x : es) read.entries.push_back(*looplock::run_entry_from_json(looplock::run_entry_to_json(x)));
  REQUIRE(looplock::entry_of(read, raw));
  CHECK(looplock::entry_of(read, raw)->operation == raw);
  CHECK(looplock::entry_of(read, "tick\xef\xbf\xbd")->operation == "tick\xef\xbf\xbd");
  CHECK_FALSE(looplock::entry_of(read, "tick"));
  // Damaged hex is a damaged entry.
  looplock::Json bad = j;
  bad["operation_bytes"] = "7g";
  CHECK_FALSE(looplock::run_entry_from_json(bad));
}

TEST_CASE("an entry keeps its slot length and its looplock's identity; earlier entries read without them") {
  RunEntry e = entry("t", kT, kT + 1);
  e.once_per_ms = 240'000;
  e.pid_start = "68907";
  e.boot_id = "0b5d2c1e-8f4a-4d3b-9c1e-2a6f7b8c9d0e";
  e.pid_ns = "4026531836";
  const auto back = looplock::run_entry_from_json(looplock::run_entry_to_json(e));
  REQUIRE(back);
  CHECK(back->once_per_ms == 240'000);
  CHECK(back->pid_start == "68907");
  CHECK(back->boot_id == e.boot_id);
  CHECK(back->pid_ns == "4026531836");
  const auto old = looplock::run_entry_from_json(looplock::run_entry_to_json(entry("t", kT)));
  REQUIRE(old);
  CHECK_FALSE(old->once_per_ms);
  CHECK(old->pid_start.empty());
  looplock::Json wrong = looplock::run_entry_to_json(e);
  wrong["once_per_ms"] = "4m";
  CHECK_FALSE(looplock::run_entry_from_json(wrong));
}

TEST_CASE("the local ledger: missing is empty; written by rename; read back") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  CHECK(looplock::read_ledger(d).entries.empty());
  CHECK_FALSE(looplock::look_local_ledger(d, "t").entry);

  looplock::record_local_ledger(d, entry("t", kT), kT);
  looplock::record_local_ledger(d, entry("u", kT + 1, kT + 2), kT);
  looplock::record_local_ledger(d, entry("t", kT, kT + 5), kT);
  const auto look = looplock::look_local_ledger(d, "t");
  REQUIRE(look.entry);
  CHECK(look.entry->ended_ms == kT + 5);
  CHECK_FALSE(look.damaged);
  CHECK(looplock::read_ledger(d).entries.size() == 2);
  looplock::sys::FileStatus st;
  REQUIRE(looplock::sys::status_of_path((dir / looplock::kRunsName), st));
  CHECK((st.mode & 0007) == 0);  // 0660 less the umask: never for other users
  CHECK(access((dir / looplock::kRunsNewName).c_str(), F_OK) != 0);
}

TEST_CASE("a ledger cut short or damaged by a crash blocks nothing: it reads as no entry and is rewritten") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  looplock::record_local_ledger(d, entry("t", kT, kT + 5), kT);
  const std::string whole = *testutil::slurp(dir / looplock::kRunsName);
  // Every prefix of a valid ledger (what a torn write would leave).
  for (size_t n = 1; n + 1 < whole.size(); n += 7) {
    testutil::write_file(dir / looplock::kRunsName, whole.substr(0, n), 0640);
    const auto look = looplock::look_local_ledger(d, "t");
    CHECK_FALSE(look.entry);
    CHECK(look.damaged);
  }
  // A leftover new file of a looplock that died before its rename (the
  // ledger is renamed into place when it is missing).
  REQUIRE(unlink((dir / looplock::kRunsName).c_str()) == 0);
  testutil::write_file(dir / looplock::kRunsNewName, "{\"schema\":", 0640);
  looplock::record_local_ledger(d, entry("t", kT + 9, kT + 10), kT);
  const auto look = looplock::look_local_ledger(d, "t");
  REQUIRE(look.entry);
  CHECK(look.entry->started_ms == kT + 9);
  CHECK_FALSE(look.damaged);
  CHECK(access((dir / looplock::kRunsNewName).c_str(), F_OK) != 0);

  // One damaged entry among good ones: that operation has none, the others keep theirs.
  testutil::write_file(dir / looplock::kRunsName,
                       looplock::seal(R"({"schema":"looplock_runs_v0","runs":[{"operation":"t","pid":"x"},)" +
                                      looplock::dump_json(looplock::run_entry_to_json(entry("u", kT, kT + 1))) + "]"),
                       0640);
  const auto t = looplock::look_local_ledger(d, "t");
  CHECK_FALSE(t.entry);
  CHECK(t.damaged);
  const auto u = looplock::look_local_ledger(d, "u");
  CHECK(u.entry);
  CHECK_FALSE(u.damaged);
  // Another schema reads as empty; so does a ledger without its check, or
  // with one that does not match (a torn write).
  testutil::write_file(dir / looplock::kRunsName, looplock::seal(R"({"schema":"other","runs":[])"), 0640);
  CHECK(looplock::look_local_ledger(d, "u").damaged);
  const std::string good = looplock::encode_ledger({entry("u", kT, kT + 1)});
  testutil::write_file(dir / looplock::kRunsName, good.substr(0, good.find(",\"check\"")) + "}\n", 0640);
  CHECK(looplock::look_local_ledger(d, "u").damaged);
  std::string flipped = good;
  flipped[flipped.find("\"u\"") + 1] = 'v';
  testutil::write_file(dir / looplock::kRunsName, flipped, 0640);
  CHECK(looplock::look_local_ledger(d, "u").damaged);
  testutil::write_file(dir / looplock::kRunsName, good, 0640);
  CHECK_FALSE(looplock::look_local_ledger(d, "u").damaged);
}

TEST_CASE("the local ledger follows the lock file's rules") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  testutil::write_file(dir / "elsewhere", "{}", 0640);
  REQUIRE(symlink((dir / "elsewhere").c_str(), (dir / looplock::kRunsName).c_str()) == 0);
  CHECK(fatal_status([&] { looplock::read_ledger(d); }) == 73);
  CHECK(fatal_status([&] { looplock::record_local_ledger(d, entry("t", kT), kT); }) == 73);
  REQUIRE(unlink((dir / looplock::kRunsName).c_str()) == 0);
  REQUIRE(link((dir / "elsewhere").c_str(), (dir / looplock::kRunsName).c_str()) == 0);
  CHECK(fatal_status([&] { looplock::read_ledger(d); }) == 73);
}

TEST_CASE("refuse_ledger: another owner only in a DIR its group shares") {
  looplock::sys::FileStatus dir;
  dir.mode = S_IFDIR | 02770;
  dir.owner = 1000;
  dir.group = 500;
  looplock::sys::FileStatus file;
  file.mode = S_IFREG | 0660;
  file.links = 1;
  file.owner = 1001;  // another member of the group wrote it last
  file.group = 500;
  CHECK_FALSE(looplock::refuse_ledger(file, dir, 1002));
  file.group = 501;  // not DIR's group
  CHECK(looplock::refuse_ledger(file, dir, 1002));
  file.group = 500;
  dir.mode = S_IFDIR | 0750;  // DIR not writable by its group
  CHECK(looplock::refuse_ledger(file, dir, 1002));
  dir.mode = S_IFDIR | 01770;  // sticky: members cannot replace each other's files
  CHECK(looplock::refuse_ledger(file, dir, 1002));
  dir.mode = S_IFDIR | 02770;
  file.links = 2;  // still never a hard link
  CHECK(looplock::refuse_ledger(file, dir, 1002));
  file.links = 1;
  file.owner = 1000;  // DIR's owner
  dir.mode = S_IFDIR | 0755;
  CHECK_FALSE(looplock::refuse_ledger(file, dir, 1002));
}

TEST_CASE("a runner is proven dead only on this boot and pid namespace, its pid gone or another process") {
  RunEntry e = entry("t", kT);
  e.pid = getpid();
  e.pid_start = looplock::sys::own_start().value_or("");
  e.boot_id = looplock::procfs::boot_id();
  e.pid_ns = looplock::procfs::pid_namespace();
  REQUIRE_FALSE(e.pid_start.empty());
  REQUIRE_FALSE(e.boot_id.empty());
  CHECK_FALSE(looplock::runner_proven_dead(e));  // this very process
  RunEntry reused = e;
  reused.pid_start = e.pid_start + "1";
  CHECK(looplock::runner_proven_dead(reused));  // the pid is another process now
  const Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  RunEntry gone = e;
  gone.pid = child;
  CHECK(looplock::runner_proven_dead(gone));
  // Another boot, another pid namespace, or an earlier version's entry: never.
  RunEntry other = gone;
  other.boot_id = "00000000-0000-0000-0000-000000000000";
  CHECK_FALSE(looplock::runner_proven_dead(other));
  other = gone;
  other.pid_ns = "1";
  CHECK_FALSE(looplock::runner_proven_dead(other));
  other = gone;
  other.boot_id.clear();
  CHECK_FALSE(looplock::runner_proven_dead(other));
}

TEST_CASE("NUL bytes after the ledger's newline (blocks reserved for a rewrite that never came) are not content") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  looplock::record_local_ledger(d, entry("t", kT, kT + 5), kT);
  const std::string whole = *testutil::slurp(dir / looplock::kRunsName);
  testutil::write_file(dir / looplock::kRunsName, whole + std::string(300, '\0'), 0640);
  const auto look = looplock::look_local_ledger(d, "t");
  REQUIRE(look.entry);
  CHECK_FALSE(look.damaged);
  testutil::write_file(dir / looplock::kRunsName, whole.substr(0, whole.size() - 1) + std::string(3, '\0'), 0640);
  CHECK(looplock::look_local_ledger(d, "t").whole);  // without its newline: not a ledger
}
