#include "records/ledger.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "base/error.hpp"
#include "os/ids.hpp"
#include "os/posix/procfs.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "records/lockfile.hpp"
#include "records/sealed.hpp"
#include "testutil.hpp"

using looplock::Pid;
using looplock::RunEntry;
using testutil::kT;
using testutil::run_entry;
using testutil::TempDir;

namespace {

// One write of the ledger by a looplock of its own (nothing known of earlier writes).
looplock::LedgerUpdate record(const looplock::LockDir& d, const RunEntry& e, long long now) {
  looplock::OwnCopies own;
  return looplock::record_local_ledger(d, e, now, own);
}

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


TEST_CASE("names are compared and stored whole: invalid UTF-8 is kept in hex beside its display") {
  const std::string raw = std::string("tick\xff", 5);
  RunEntry e = run_entry(raw, kT, kT + 1);
  const looplock::Json j = looplock::run_entry_to_json(e);
  CHECK(j["operation_bytes"] == "7469636bff");
  CHECK(looplock::dump_json(j["operation"]) == "\"tick\xef\xbf\xbd\"");  // U+FFFD for display
  const auto back = looplock::run_entry_from_json(j);
  REQUIRE(back);
  CHECK(back->operation == raw);
  // Valid UTF-8 is stored as it is, without hex.
  CHECK_FALSE(looplock::run_entry_to_json(run_entry("t\xc3\xa9", kT)).contains("operation_bytes"));
  // A ledger keeps tick\xff apart from tick\ufffd and from other names.
  std::vector<RunEntry> es;
  es = looplock::with_entry(es, run_entry("tick\xef\xbf\xbd", kT, kT + 1), kT).entries;
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


TEST_CASE("the local ledger: missing is empty; written by rename; read back") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  CHECK(looplock::read_ledger(d).entries.empty());
  CHECK_FALSE(looplock::look_local_ledger(d, "t").entry);

  record(d, run_entry("t", kT), kT);
  record(d, run_entry("u", kT + 1, kT + 2), kT);
  record(d, run_entry("t", kT, kT + 5), kT);
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
  record(d, run_entry("t", kT, kT + 5), kT);
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
  record(d, run_entry("t", kT + 9, kT + 10), kT);
  const auto look = looplock::look_local_ledger(d, "t");
  REQUIRE(look.entry);
  CHECK(look.entry->started_ms == kT + 9);
  CHECK_FALSE(look.damaged);
  CHECK(access((dir / looplock::kRunsNewName).c_str(), F_OK) != 0);

  // One damaged entry among good ones: that operation has none, the others keep theirs.
  testutil::write_file(dir / looplock::kRunsName,
                       looplock::seal(R"({"schema":"looplock_runs_v0","runs":[{"operation":"t","pid":"x"},)" +
                                      looplock::dump_json(looplock::run_entry_to_json(run_entry("u", kT, kT + 1))) + "]"),
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
  const std::string good = looplock::encode_ledger({run_entry("u", kT, kT + 1)});
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
  CHECK(fatal_status([&] { record(d, run_entry("t", kT), kT); }) == 73);
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
  RunEntry e = run_entry("t", kT);
  e.pid = getpid();
  e.pid_start = looplock::sys::own_start().value_or("");
  e.boot_id = looplock::sys::boot_id();
  e.pid_ns = looplock::sys::pid_namespace();
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
  record(d, run_entry("t", kT, kT + 5), kT);
  const std::string whole = *testutil::slurp(dir / looplock::kRunsName);
  testutil::write_file(dir / looplock::kRunsName, whole + std::string(300, '\0'), 0640);
  const auto look = looplock::look_local_ledger(d, "t");
  REQUIRE(look.entry);
  CHECK_FALSE(look.damaged);
  testutil::write_file(dir / looplock::kRunsName, whole.substr(0, whole.size() - 1) + std::string(3, '\0'), 0640);
  CHECK(looplock::look_local_ledger(d, "t").whole);  // without its newline: not a ledger
}

namespace {

// The valid copy that begins at `span` in the file's text, if any.
std::optional<std::string> copy_at(const std::string& text, looplock::Span span) {
  for (const auto& c : looplock::sealed_copies(text)) {
    if (c.begin == span.begin && c.end == span.end) return std::string(c.object);
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("one looplock's writes: the copy durable before its last write is never written over, and the file stays small") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  record(d, run_entry("seed", kT), kT);  // a file to write in place
  looplock::OwnCopies a;
  looplock::OwnCopies b;  // a nested run's, now and then
  size_t largest = 0;
  std::string durable_text;
  looplock::Span durable_span;
  for (int i = 0; i < 40; ++i) {
    looplock::OwnCopies& own = i % 7 == 6 ? b : a;
    // Entries of changing lengths, as the ledger grows and its runs end.
    RunEntry e = run_entry(std::string(static_cast<size_t>(1 + (i * 37) % 90), 'x'), kT + i);
    if (i % 2 == 1) e.ended_ms = kT + i + 1;
    const std::string before = *testutil::slurp(dir / looplock::kRunsName);
    looplock::record_local_ledger(d, e, kT, own);
    const std::string after = *testutil::slurp(dir / looplock::kRunsName);
    REQUIRE(own.known);
    // The copy it relies on as durable is still whole, byte for byte as it was.
    const auto still = copy_at(after, own.durable);
    REQUIRE(still);
    if (own.durable.begin == durable_span.begin && own.durable.end == durable_span.end && !durable_text.empty()) {
      CHECK(*still == durable_text);
    }
    CHECK(copy_at(before, own.durable) == still);  // it was there before this write
    durable_span = own.durable;
    durable_text = *still;
    // Its own copy is the newest, and readers see the entry.
    REQUIRE(copy_at(after, own.written));
    CHECK(looplock::entry_of(looplock::read_ledger(d), e.operation));
    for (const auto& c : looplock::sealed_copies(after)) largest = std::max(largest, c.end - c.begin);
    // A few copies' worth: two kept and the new one, and the gaps that
    // copies of changing lengths leave (never past five of the largest).
    CHECK(after.size() <= 5 * largest);
  }
}

TEST_CASE("a ledger spread out past where readers look (an earlier version's padding) is replaced, not overrun") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  record(d, run_entry("t", kT, kT + 5), kT);
  std::string one = *testutil::slurp(dir / looplock::kRunsName);
  // Its only copy at the start, padded with spaces to 12 MB: no room after
  // it within the bound, none before it.
  one.insert(one.size() - 1, (12u << 20) - one.size() + 2, ' ');
  testutil::write_file(dir / looplock::kRunsName, one, 0640);
  looplock::OwnCopies own;
  looplock::record_local_ledger(d, run_entry("u", kT + 1), kT, own);
  const auto read = looplock::read_ledger(d);
  CHECK(looplock::entry_of(read, "t"));
  CHECK(looplock::entry_of(read, "u"));
  CHECK(testutil::slurp(dir / looplock::kRunsName)->size() < 4096);
}

TEST_CASE("a nested run's write cut short over the copy kept as durable: the next own write syncs and keeps the newest") {
  // (A reviewer's case.) The newest copy D after a junk line; this run's
  // start W1 fits before it, at 0.
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  const std::vector<RunEntry> seed{run_entry("seed", kT, kT + 1)};
  const std::string D = looplock::encode_ledger(seed, 5);
  const RunEntry start = run_entry("p", kT + 2);
  const auto u1 = looplock::with_entry(seed, start, kT);
  const size_t L1 = looplock::encode_ledger(u1.entries, 6).size();
  const std::string junk = std::string(L1 + 5 - 1, 'j') + "\n";  // W1 fits at 0, W2 not between
  testutil::write_file(dir / looplock::kRunsName, junk + D, 0640);
  looplock::OwnCopies a;
  looplock::record_local_ledger(d, start, kT, a);  // W1
  REQUIRE(a.known);
  CHECK(a.written.begin == 0);
  CHECK(a.durable.begin == junk.size());
  // A nested run (nothing known: it syncs, keeps W1 only) writes after W1,
  // cut short (EFBIG) past D's newline: D is torn; the newest is still W1.
  {
    std::string t = *testutil::slurp(dir / looplock::kRunsName);
    const std::string x = looplock::encode_ledger(u1.entries, 7);
    const size_t cut = t.size() - L1 + 3;  // covers D's last byte
    t.replace(L1, cut, x.substr(0, cut));
    testutil::write_file(dir / looplock::kRunsName, t, 0640);
  }
  REQUIRE(looplock::read_ledger(d).generation == 6);
  RunEntry end = start;
  end.ended_ms = kT + 9;
  looplock::record_local_ledger(d, end, kT, a);  // W2: D is no copy now, so W1 is synced and kept
  const auto read = looplock::read_ledger(d);
  CHECK(read.generation == 7);
  REQUIRE(looplock::entry_of(read, "p"));
  CHECK(looplock::entry_of(read, "p")->ended_ms == kT + 9);
  CHECK_FALSE(a.unsynced);
  CHECK(a.durable.begin == 0);  // W1
}

TEST_CASE("one write without a sync after each sync: a third own write syncs again") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  record(d, run_entry("seed", kT), kT);  // a file to write in place
  looplock::OwnCopies own;
  looplock::record_local_ledger(d, run_entry("a", kT + 1), kT, own);
  CHECK_FALSE(own.unsynced);  // the first: the newest made durable first
  looplock::record_local_ledger(d, run_entry("a", kT + 1, kT + 2), kT, own);
  CHECK(own.unsynced);  // the second: kept the durable copy, did not wait
  const looplock::Span durable = own.durable;
  looplock::record_local_ledger(d, run_entry("b", kT + 3), kT, own);
  CHECK_FALSE(own.unsynced);  // the third: synced, its durable copy the second's
  CHECK_FALSE((own.durable.begin == durable.begin && own.durable.end == durable.end));
}

TEST_CASE("a runner proven alive here: this host's boot and pid namespace, its pid still the process that ran it, not a zombie") {
  RunEntry e = run_entry("t", kT);
  e.pid = getpid();
  e.pid_start = looplock::sys::own_start().value_or("");
  e.boot_id = looplock::sys::boot_id();
  e.pid_ns = looplock::sys::pid_namespace();
  CHECK(looplock::runner_alive_here(e));  // this very process
  RunEntry reused = e;
  reused.pid_start = e.pid_start + "1";
  CHECK_FALSE(looplock::runner_alive_here(reused));
  RunEntry other = e;
  other.boot_id = "00000000-0000-0000-0000-000000000000";
  CHECK_FALSE(looplock::runner_alive_here(other));
  other = e;
  other.pid_start.clear();  // an earlier version's entry: unknown, not alive
  CHECK_FALSE(looplock::runner_alive_here(other));
  // A child that has exited and is not yet reaped (a zombie) is no runner.
  const Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  RunEntry zombie = e;
  zombie.pid = child;
  zombie.pid_start = looplock::sys::process_start(child).value_or("");
  for (int i = 0; i < 500 && looplock::sys::process_alive(child); ++i) usleep(2000);
  CHECK_FALSE(looplock::runner_alive_here(zombie));
  REQUIRE(waitpid(child, nullptr, 0) == child);
}
