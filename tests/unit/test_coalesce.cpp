#include "records/coalesce.hpp"

#include <doctest/doctest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "base/error.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "records/lockfile.hpp"
#include "testutil.hpp"

using looplock::HolderRecord;
using testutil::TempDir;

namespace {

HolderRecord me(const std::string& operation) {
  return HolderRecord{.lock_id = "0123",
                      .pid = looplock::sys::own_pid(),
                      .pid_start = looplock::sys::own_start().value_or(""),
                      .agent_id = "cron",
                      .operation = operation,
                      .policy = "coalesce",
                      .acquired_at = "2026-12-04T10:00:00.000Z",
                      .released_at = std::nullopt,
                      .hold = std::nullopt};
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("each operation has its own seat, named by a hash of its name") {
  const std::string a = looplock::coalesce_name("tick");
  CHECK(a.starts_with(".state.lock.coalesce."));
  CHECK(a.size() == std::string(".state.lock.coalesce.").size() + 16);
  CHECK(a == looplock::coalesce_name("tick"));
  CHECK(a != looplock::coalesce_name("check-gate"));
  // A shared and an exclusive run of one operation have seats of their own.
  CHECK(looplock::coalesce_name("tick", true) != a);
  CHECK(looplock::coalesce_name("tick", false) == a);
  // Any name makes a file name: slashes, bytes that are not UTF-8, 10 KB.
  for (const std::string& odd : {std::string("a/b"), std::string("\xff\xfe"), std::string(10000, 'x')}) {
    const std::string n = looplock::coalesce_name(odd);
    CHECK(n.find('/') == std::string::npos);
    CHECK(n.size() < 64);
  }
}

TEST_CASE("absorbed lines count only for the run they name") {
  const HolderRecord w = me("tick");
  HolderRecord other = w;
  other.pid_start = "1";
  const std::string content =
      looplock::encode_holder(w) + looplock::encode_absorbed(w, 11, "5", "2026-12-04T10:00:01.000Z", 1000) +
      looplock::encode_absorbed(other, 12, "6", "2026-12-04T10:00:01.000Z", 5000) + "garbage\n" +
      "{\"absorbed_by\":{\"pid\":\"x\"}}\n" +
      looplock::encode_absorbed(w, 13, "7", "2026-12-04T10:00:02.000Z", 2000) +
      "{\"absorbed_by\":{\"pid\":" + std::to_string(w.pid);  // cut short
  CHECK(looplock::count_absorbed(content, w).count == 2);
  CHECK(looplock::count_absorbed(content, w).newest_started_ms == 2000);  // the newest start it absorbed
  CHECK(looplock::count_absorbed(content, other).count == 1);
  CHECK(looplock::count_absorbed(content, other).newest_started_ms == 5000);
  // An earlier version's line has no start: counted, no instant.
  const std::string old = looplock::encode_holder(w) + R"({"absorbed_by":{"pid":)" + std::to_string(w.pid) +
                          R"(,"pid_start":")" + w.pid_start + R"("},"pid":11,"pid_start":"5","at":"x"})" + "\n";
  CHECK(looplock::count_absorbed(old, w).count == 1);
  CHECK_FALSE(looplock::count_absorbed(old, w).newest_started_ms);
  const auto r = looplock::seat_record(content);
  REQUIRE(r);
  CHECK(r->pid == w.pid);
  CHECK(r->operation == "tick");
  CHECK_FALSE(looplock::seat_record(""));
  CHECK_FALSE(looplock::seat_record("{\"schema\":"));
}

TEST_CASE("the seat: one run takes it, the next finds it taken and names it, the count comes back") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  const HolderRecord w = me("tick");
  looplock::Seat first = looplock::take_seat(d, w);
  REQUIRE(first.taken());
  CHECK(first.name == looplock::coalesce_name("tick"));

  // A second open file of the same process is another contender for flock(2).
  looplock::Seat second = looplock::take_seat(d, me("tick"));
  CHECK_FALSE(second.taken());
  REQUIRE(second.waiter);
  CHECK(second.waiter->pid == w.pid);
  CHECK(second.waiter->acquired_at == w.acquired_at);
  CHECK(looplock::absorb(d, second, 4242, "99", 7000));
  CHECK(looplock::absorb(d, second, 4243, "100", 6000));

  // Another operation has a seat of its own.
  looplock::Seat gate = looplock::take_seat(d, me("check-gate"));
  CHECK(gate.taken());
  CHECK(looplock::leave_seat(gate, me("check-gate")).count == 0);
  // The same operation run shared has a seat of its own.
  looplock::Seat shared = looplock::take_seat(d, me("tick"), /*shared=*/true);
  CHECK(shared.taken());
  CHECK(looplock::leave_seat(shared, me("tick")).count == 0);

  const looplock::Absorbed got = looplock::leave_seat(first, w);
  CHECK(got.count == 2);
  CHECK(got.newest_started_ms == 7000);
  CHECK_FALSE(first.taken());
  CHECK(read_all(dir / first.name).empty());  // emptied as it was left

  // Free again: the next run sits down.
  looplock::Seat next = looplock::take_seat(d, w);
  CHECK(next.taken());
  CHECK(looplock::leave_seat(next, w).count == 0);
}

TEST_CASE("a run that takes the seat of a waiter that died there says what that waiter had absorbed") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  HolderRecord dead = me("tick");
  dead.pid_start = "1";  // this pid, another start: a process gone
  const std::string name = looplock::coalesce_name("tick");
  testutil::write_file(dir / name,
                       looplock::encode_holder(dead) +
                           looplock::encode_absorbed(dead, 11, "5", "2026-12-04T10:00:01.000Z", 1000) +
                           looplock::encode_absorbed(dead, 12, "6", "2026-12-04T10:00:02.000Z", 2000),
                       0660);
  looplock::Seat s = looplock::take_seat(d, me("tick"));
  REQUIRE(s.taken());
  CHECK(s.inherited == 2);
  REQUIRE(s.dead_waiter);
  CHECK(s.dead_waiter->pid_start == "1");
  CHECK(looplock::leave_seat(s, me("tick")).count == 0);  // its lines are gone with it
  // A seat left empty names nobody.
  looplock::Seat again = looplock::take_seat(d, me("tick"));
  CHECK(again.inherited == 0);
  CHECK_FALSE(again.dead_waiter);
  (void)looplock::leave_seat(again, me("tick"));
}

TEST_CASE("a seat's record whose process is gone does not name a waiter") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  HolderRecord dead = me("tick");
  dead.pid_start = "1";  // this pid, another start: not this process
  const std::string name = looplock::coalesce_name("tick");
  testutil::write_file(dir / name, looplock::encode_holder(dead), 0660);
  const int held = ::open((dir / name).c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);
  const looplock::Seat s = looplock::take_seat(d, me("tick"));  // looks for 1 s
  CHECK_FALSE(s.taken());
  CHECK_FALSE(s.waiter);
  ::close(held);
}

TEST_CASE("an unsafe seat file is refused (73), as every file beside the lock file") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  const std::string name = looplock::coalesce_name("tick");
  testutil::write_file(dir / "target", "", 0660);
  REQUIRE(::link((dir / "target").c_str(), (dir / name).c_str()) == 0);
  int status = 0;
  try {
    (void)looplock::take_seat(d, me("tick"));
  } catch (const looplock::Fatal& f) {
    status = f.status();
    CHECK(std::string(f.what()).find("hard links") != std::string::npos);
  }
  CHECK(status == 73);
}
