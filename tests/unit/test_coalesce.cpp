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
      looplock::encode_holder(w) + looplock::encode_absorbed(w, 11, "5", "2026-12-04T10:00:01.000Z") +
      looplock::encode_absorbed(other, 12, "6", "2026-12-04T10:00:01.000Z") + "garbage\n" +
      "{\"absorbed_by\":{\"pid\":\"x\"}}\n" + looplock::encode_absorbed(w, 13, "7", "2026-12-04T10:00:02.000Z") +
      "{\"absorbed_by\":{\"pid\":" + std::to_string(w.pid);  // cut short
  CHECK(looplock::count_absorbed(content, w) == 2);
  CHECK(looplock::count_absorbed(content, other) == 1);
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
  CHECK(looplock::absorb(d, second, 4242, "99"));
  CHECK(looplock::absorb(d, second, 4243, "100"));

  // Another operation has a seat of its own.
  looplock::Seat gate = looplock::take_seat(d, me("check-gate"));
  CHECK(gate.taken());
  CHECK(looplock::leave_seat(gate, me("check-gate")) == 0);

  CHECK(looplock::leave_seat(first, w) == 2);
  CHECK_FALSE(first.taken());
  CHECK(read_all(dir / first.name).empty());  // emptied as it was left

  // Free again: the next run sits down.
  looplock::Seat next = looplock::take_seat(d, w);
  CHECK(next.taken());
  CHECK(looplock::leave_seat(next, w) == 0);
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
