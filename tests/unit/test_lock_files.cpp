#include "cli/lock_files.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "records/incident.hpp"
#include "records/ledger.hpp"
#include "records/metrics.hpp"
#include "testutil.hpp"

using looplock::FileProblem;
using testutil::TempDir;

namespace {

// The problems' files and texts, one string each.
std::string all(const std::vector<FileProblem>& ps) {
  std::string out;
  for (const auto& p : ps) out += p.file + ": " + p.problem + ". " + p.fix + "\n";
  return out;
}

}  // namespace

TEST_CASE("files that do not exist, or that a run uses as they are, are no problem") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  CHECK(looplock::judge_lock_files(d, geteuid()).empty());
  testutil::write_file(dir / looplock::kRunsName, "{}", 0660);
  testutil::write_file(dir / looplock::kIncidentsName, "", 0660);
  CHECK(looplock::judge_lock_files(d, geteuid()).empty());
}

TEST_CASE("a ledger every --once-per run refuses: a symlink, a FIFO, hard links, another user's") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  const std::string ledger = dir / looplock::kRunsName;
  REQUIRE(symlink("/etc/hostname", ledger.c_str()) == 0);
  auto ps = looplock::judge_lock_files(d, geteuid());
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].file == ledger);
  CHECK(ps[0].problem == "every --once-per run refuses it (exit 73): it is a symbolic link (looplock never follows one)");
  REQUIRE(unlink(ledger.c_str()) == 0);
  REQUIRE(mkfifo(ledger.c_str(), 0660) == 0);
  CHECK(all(looplock::judge_lock_files(d, geteuid())).find("a FIFO, not a regular file") != std::string::npos);
  REQUIRE(unlink(ledger.c_str()) == 0);
  testutil::write_file(ledger, "{}", 0660);
  REQUIRE(link(ledger.c_str(), (dir / "other").c_str()) == 0);
  CHECK(all(looplock::judge_lock_files(d, geteuid())).find("a run ledger must have exactly one") != std::string::npos);
  REQUIRE(unlink((dir / "other").c_str()) == 0);
  // Another user's (neither the caller nor DIR's owner): root can make one.
  if (geteuid() != 0) return;
  REQUIRE(chown(ledger.c_str(), 12345, 12345) == 0);
  ps = looplock::judge_lock_files(d, geteuid());
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].problem.find("neither you nor DIR's owner") != std::string::npos);
  CHECK(ps[0].fix.find("As DIR's owner, replace it with one of your own") != std::string::npos);
  CHECK(ps[0].fix.find("install -m 0660 -g GROUP /dev/null " + dir.path() + "/.state.lock.runs.json") !=
        std::string::npos);
}

TEST_CASE("an incidents file every row is lost to: a symlink, a directory, a FIFO, hard links") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  const std::string inc = dir / looplock::kIncidentsName;
  REQUIRE(mkdir(inc.c_str(), 0770) == 0);
  auto ps = looplock::judge_lock_files(d, geteuid());
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].problem == "every incident row is lost (one warning each time): it is a directory");
  CHECK(ps[0].fix.starts_with("Move it away"));
  REQUIRE(rmdir(inc.c_str()) == 0);
  REQUIRE(symlink("/nowhere", inc.c_str()) == 0);
  CHECK(all(looplock::judge_lock_files(d, geteuid())).find("symbolic link") != std::string::npos);
  REQUIRE(unlink(inc.c_str()) == 0);
  REQUIRE(mkfifo(inc.c_str(), 0660) == 0);
  CHECK(all(looplock::judge_lock_files(d, geteuid())).find("not a regular file") != std::string::npos);
  REQUIRE(unlink(inc.c_str()) == 0);
  testutil::write_file(inc, "", 0660);
  REQUIRE(link(inc.c_str(), (dir / "rotated").c_str()) == 0);
  CHECK(all(looplock::judge_lock_files(d, geteuid())).find("2 hard links") != std::string::npos);
}

TEST_CASE("metrics files: a missing directory, an update lock anyone can hold, a file only its owner reads") {
  TempDir dir;
  const std::string id = "196199d2965572bb";
  auto ps = looplock::judge_metrics_files(dir / "missing", id, geteuid());
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].problem.find("cannot be opened as a directory") != std::string::npos);
  CHECK(looplock::judge_metrics_files(dir.path(), id, geteuid()).empty());
  const std::string name = looplock::metrics_file_name(id);
  testutil::write_file(dir / ("." + name + ".lock"), "", 0644);
  REQUIRE(chmod((dir / ("." + name + ".lock")).c_str(), 0644) == 0);
  testutil::write_file(dir / name, "", 0600);
  REQUIRE(chmod((dir / name).c_str(), 0600) == 0);
  ps = looplock::judge_metrics_files(dir.path(), id, geteuid());
  REQUIRE(ps.size() == 2);
  CHECK(ps[0].problem.find("any local user can open this update lock") != std::string::npos);
  CHECK(ps[0].fix == "chmod 0660 " + dir / ("." + name + ".lock") + ".");
  CHECK(ps[1].problem.find("node_exporter, running as another user, cannot collect it") != std::string::npos);
  REQUIRE(chmod((dir / name).c_str(), 0640) == 0);  // the group can read it: the collector may be in it
  CHECK(looplock::judge_metrics_files(dir.path(), id, geteuid()).size() == 1);
}
