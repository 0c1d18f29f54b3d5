#include "records/metrics.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "os/sys.hpp"
#include "testutil.hpp"

using looplock::MetricsFile;
using looplock::RunMetrics;
using looplock::RunOutcome;
using testutil::TempDir;

namespace {

RunMetrics sample(RunOutcome outcome, std::string operation = "tick.py") {
  RunMetrics m;
  m.lock_id = "0123456789abcdef";
  m.loop = "nightly";
  m.operation = std::move(operation);
  m.outcome = outcome;
  m.exit_status = outcome == RunOutcome::Success ? 0 : 75;
  m.start_s = 1'796'140'000.5;
  m.end_s = 1'796'140'002.25;
  m.wait_s = 0.125;
  m.duration_s = 1.5;
  return m;
}

}  // namespace

TEST_CASE("outcome names") {
  std::vector<std::string> names;
  for (auto o : looplock::kAllOutcomes) names.emplace_back(looplock::outcome_name(o));
  CHECK(names == std::vector<std::string>{"success", "failure", "signaled", "skipped", "timeout", "lease_lost",
                                          "max_time", "error"});
}

TEST_CASE("label values are valid UTF-8, escaped and bounded") {
  CHECK(looplock::label_value("tick.py") == "tick.py");
  CHECK(looplock::label_value("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
  CHECK(looplock::label_value(std::string("x\xff", 2)) == "x\xef\xbf\xbd");  // U+FFFD
  CHECK(looplock::label_value(std::string(1000, 'y')).size() == 256);
  CHECK(looplock::label_value(std::string(255, 'y') + "\xC3\xA9").size() == 255);  // never half a character
}

TEST_CASE("render, then parse, gives the same state; runs add up") {
  MetricsFile f;
  looplock::add_run(f, sample(RunOutcome::Success));
  looplock::add_run(f, sample(RunOutcome::Skipped));
  looplock::add_run(f, sample(RunOutcome::Skipped, "monitor \"q\""));
  const std::string text = looplock::render_metrics(f);
  CHECK(text.starts_with("# HELP looplock_runs_total "));
  CHECK(text.find("# TYPE looplock_runs_total counter\n") != std::string::npos);
  CHECK(text.find("# TYPE looplock_last_wait_seconds gauge\n") != std::string::npos);
  CHECK(text.find("looplock_runs_total{lock_id=\"0123456789abcdef\",loop=\"nightly\",operation=\"tick.py\","
                  "outcome=\"skipped\"} 1\n") != std::string::npos);
  CHECK(text.find("looplock_runs_total{lock_id=\"0123456789abcdef\",loop=\"nightly\",operation=\"tick.py\","
                  "outcome=\"error\"} 0\n") != std::string::npos);
  CHECK(text.find("operation=\"monitor \\\"q\\\"\"") != std::string::npos);
  CHECK(text.find("looplock_last_start_timestamp_seconds{lock_id=\"0123456789abcdef\",loop=\"nightly\","
                  "operation=\"tick.py\"} 1796140000.500\n") != std::string::npos);

  MetricsFile back = looplock::parse_metrics(text);
  CHECK(back.lock_id == "0123456789abcdef");
  CHECK(back.loop == "nightly");
  REQUIRE(back.operations.size() == 2);
  const auto& tick = back.operations.at("tick.py");
  CHECK(tick.runs.at(RunOutcome::Success) == 1);
  CHECK(tick.runs.at(RunOutcome::Skipped) == 1);
  CHECK(tick.last_success == doctest::Approx(1'796'140'002.25));
  CHECK(tick.last_exit_status == 75);  // the last run was the skip
  CHECK(back.operations.at("monitor \"q\"").runs.at(RunOutcome::Skipped) == 1);
  CHECK(looplock::render_metrics(back) == text);

  // The last success stays when later runs fail.
  looplock::add_run(back, sample(RunOutcome::Timeout));
  CHECK(back.operations.at("tick.py").last_success == doctest::Approx(1'796'140'002.25));
  CHECK(back.operations.at("tick.py").runs.at(RunOutcome::Timeout) == 1);
}

TEST_CASE("parse skips what it does not understand") {
  MetricsFile f = looplock::parse_metrics(
      "garbage\n{}\nlooplock_runs_total{outcome=\"success\"} 3\n"
      "looplock_runs_total{operation=\"x\",outcome=\"nope\"} 3\n"
      "looplock_runs_total{operation=\"x\",outcome=\"success\"} abc\n"
      "looplock_runs_total{operation=\"x\",outcome=\"failure\"} 2\n");
  REQUIRE(f.operations.size() == 1);
  CHECK(f.operations.at("x").runs.size() == 1);
  CHECK(f.operations.at("x").runs.at(RunOutcome::Failure) == 2);
}

TEST_CASE("update_metrics_file carries counters over and leaves no temporary file") {
  TempDir dir;
  const std::string d = dir.path();
  CHECK(looplock::update_metrics_file(d, sample(RunOutcome::Success)) == std::nullopt);
  CHECK(looplock::update_metrics_file(d, sample(RunOutcome::Success)) == std::nullopt);
  const std::string name = dir / "looplock_0123456789abcdef.prom";
  auto text = testutil::slurp(name);
  REQUIRE(text);
  CHECK(looplock::parse_metrics(*text).operations.at("tick.py").runs.at(RunOutcome::Success) == 2);
  struct stat st {};
  CHECK(stat((dir / ".looplock_0123456789abcdef.prom.lock").c_str(), &st) == 0);
  CHECK(stat((dir / ("." + std::string("looplock_0123456789abcdef.prom.") + std::to_string(getpid()) + ".tmp")).c_str(),
             &st) != 0);
}

namespace {
ino_t inode_of(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// Whether `dir`'s file system gives write leases and RENAME_EXCHANGE (tmpfs
// and ext4 do; NFS, or fs.leases-enable=0, would not: there the update
// takes the temporary file's path, which the other tests cover).
bool swaps_supported(const TempDir& dir) {
  const std::string a = dir / "probe.a", b = dir / "probe.b";
  for (const auto& p : {a, b}) ::close(::open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  const int fd = ::open(a.c_str(), O_RDWR | O_CLOEXEC);
  const bool lease = fd >= 0 && fcntl(fd, F_SETLEASE, F_WRLCK) == 0;
  if (fd >= 0) ::close(fd);
  const bool exchange = renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
  ::unlink(a.c_str());
  ::unlink(b.c_str());
  return lease && exchange;
}
}  // namespace

TEST_CASE("an update swaps a kept staging file with the collector's: no inode is made or freed") {
  TempDir dir;
  if (!swaps_supported(dir)) {
    MESSAGE("no write leases or RENAME_EXCHANGE in " << dir.path() << ": nothing to check");
    return;
  }
  const std::string live = dir / "looplock_0123456789abcdef.prom";
  const std::string staging = dir / ".looplock_0123456789abcdef.prom.next";
  REQUIRE(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Success)) == std::nullopt);
  REQUIRE(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Success)) == std::nullopt);
  // From the second update on, the two inodes trade places.
  for (int round = 0; round < 3; ++round) {
    const ino_t was_live = inode_of(live);
    const ino_t was_staging = inode_of(staging);
    REQUIRE(was_live != 0);
    REQUIRE(was_staging != 0);
    REQUIRE(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Failure)) == std::nullopt);
    CHECK(inode_of(live) == was_staging);
    CHECK(inode_of(staging) == was_live);
  }
  auto text = testutil::slurp(live);
  REQUIRE(text);
  const MetricsFile parsed = looplock::parse_metrics(*text);
  const auto& runs = parsed.operations.at("tick.py").runs;
  CHECK(runs.at(RunOutcome::Success) == 2);
  CHECK(runs.at(RunOutcome::Failure) == 3);
  // A staging file longer than the new text is cut to it.
  REQUIRE(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Success, std::string(200, 'o'))) ==
          std::nullopt);
  REQUIRE(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Success)) == std::nullopt);
  REQUIRE(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Success)) == std::nullopt);
  text = testutil::slurp(live);
  REQUIRE(text);
  CHECK(text->back() == '\n');
  CHECK(looplock::render_metrics(looplock::parse_metrics(*text)) == *text);
}

TEST_CASE("a file a reader holds open is never rewritten under it") {
  TempDir dir;  // whatever the file system gives: the update must hold either way
  const std::string live = dir / "looplock_0123456789abcdef.prom";
  for (int i = 0; i < 3; ++i)
    REQUIRE(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Success)) == std::nullopt);
  const auto before = testutil::slurp(live);
  REQUIRE(before);
  // The collector opened the file, and is slow to read it: two updates
  // land meanwhile. The first makes what it holds the staging file; the
  // second must not write into it.
  const int held = ::open(live.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Failure)) == std::nullopt);
  REQUIRE(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Failure)) == std::nullopt);
  char buf[8192];
  const ssize_t n = ::pread(held, buf, sizeof buf, 0);
  ::close(held);
  REQUIRE(n > 0);
  CHECK(std::string(buf, static_cast<size_t>(n)) == *before);
  // And the updates were not lost: both are in the collector's file.
  const auto after = testutil::slurp(live);
  REQUIRE(after);
  CHECK(looplock::parse_metrics(*after).operations.at("tick.py").runs.at(RunOutcome::Failure) == 2);
}

TEST_CASE("concurrent updates lose no increment") {
  TempDir dir;
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 10; ++k)
        CHECK(looplock::update_metrics_file(dir.path(), sample(RunOutcome::Skipped)) == std::nullopt);
    });
  }
  for (auto& t : threads) t.join();
  auto text = testutil::slurp(dir / "looplock_0123456789abcdef.prom");
  REQUIRE(text);
  CHECK(looplock::parse_metrics(*text).operations.at("tick.py").runs.at(RunOutcome::Skipped) == 80);
}

TEST_CASE("a metrics directory that cannot be used is a message, not a throw") {
  TempDir dir;
  const auto f = looplock::update_metrics_file(dir / "missing", sample(RunOutcome::Success));
  REQUIRE(f);
  CHECK(f->what.find("cannot open the metrics directory") != std::string::npos);
  CHECK(f->err == ENOENT);
}

TEST_CASE("operations whose labels are the same share one series: no duplicate, no lost count") {
  MetricsFile f;
  auto run = [](std::string op) {
    RunMetrics m;
    m.lock_id = "196199d2965572bb";
    m.loop = "nightly";
    m.operation = std::move(op);
    m.outcome = looplock::RunOutcome::Success;
    return m;
  };
  const std::string bad = std::string("tick\xff", 5);
  for (int i = 0; i < 4; ++i) {
    looplock::add_run(f, run(bad));
    f = looplock::parse_metrics(looplock::render_metrics(f));  // as each run reads the file back
  }
  looplock::add_run(f, run(std::string(300, 'o') + "1"));
  f = looplock::parse_metrics(looplock::render_metrics(f));
  looplock::add_run(f, run(std::string(300, 'o') + "2"));  // the same first 256 bytes
  const std::string text = looplock::render_metrics(f);
  CHECK(f.operations.size() == 2);
  CHECK(text.find("operation=\"tick\xef\xbf\xbd\",outcome=\"success\"} 4\n") != std::string::npos);
  CHECK(text.find("operation=\"" + std::string(256, 'o') + "\",outcome=\"success\"} 2\n") != std::string::npos);
  // Every series once.
  std::set<std::string> seen;
  looplock::sys::for_each_line(text, [&](std::string_view line) {
    if (line.empty() || line[0] == '#') return;
    CHECK(seen.insert(std::string(line.substr(0, line.rfind(' ')))).second);
  });
}
