#include "records/holders.hpp"

#include <doctest/doctest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "base/error.hpp"
#include "os/clock.hpp"
#include "os/files.hpp"
#include "records/holder.hpp"
#include "records/lockfile.hpp"
#include "testutil.hpp"

using looplock::Acquisition;
using looplock::WaitPlan;
using testutil::TempDir;

TEST_CASE("index files are named by their index, and only such names are read back") {
  CHECK(looplock::index_name(0) == ".state.lock.holders.0");
  CHECK(looplock::index_name(1023) == ".state.lock.holders.1023");
  CHECK(looplock::index_of_name(".state.lock.holders.7") == 7);
  for (const char* odd : {".state.lock.holders.", ".state.lock.holders.07", ".state.lock.holders.1x",
                          ".state.lock.holders.-1", ".state.lock.holder", ".state.lock.holders.99999999"}) {
    CHECK_FALSE(looplock::index_of_name(odd));
  }
}

TEST_CASE("a holder record carries N and its index; one without them is the exclusive holder's") {
  looplock::HolderRecord r{.lock_id = "0123",
                           .pid = 42,
                           .pid_start = "7",
                           .agent_id = "cron",
                           .operation = "deploy",
                           .policy = "mutation",
                           .acquired_at = "2026-12-04T10:00:00.000Z",
                           .released_at = std::nullopt,
                           .hold = std::nullopt};
  CHECK(looplock::encode_holder(r).find("holders") == std::string::npos);
  r.holders = 3;
  r.index = 2;
  const std::string text = looplock::encode_holder(r);
  CHECK(text.find(R"("holders":3,"index":2,"check":")") != std::string::npos);
  const auto back = looplock::parse_holder(text);
  REQUIRE(back);
  CHECK(back->holders == 3);
  CHECK(back->index == 2);
  CHECK(text.substr(0, text.find(R"(,"check":")")) + "}" == looplock::dump_json(looplock::holder_to_json(r)));
  CHECK_FALSE(looplock::holder_from_json(looplock::Json::parse(
      R"({"schema":"file_lock_holder_v0","lock_id":"x","pid":1,"pid_start":"","agent_id":"a","operation":"o",)"
      R"("policy":"mutation","acquired_at":"2026-11-30T17:00:00.123Z","released_at":null,"index":-1})")));
}

TEST_CASE("the lowest free index is taken; with all held, the wait ends at its deadline") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  const WaitPlan now{WaitPlan::Kind::NoWait, looplock::Duration::zero()};
  const auto start = looplock::MonotonicClock::now();
  auto a = looplock::take_index(d, 2, now, start, [] {});
  REQUIRE(a.status == Acquisition::Acquired);
  CHECK(a.index == 0);
  auto b = looplock::take_index(d, 2, now, start, [] {});
  REQUIRE(b.status == Acquisition::Acquired);
  CHECK(b.index == 1);
  // A run with a larger N takes the next one; one with N = 2 finds all held.
  auto c = looplock::take_index(d, 3, now, start, [] {});
  REQUIRE(c.status == Acquisition::Acquired);
  CHECK(c.index == 2);
  auto busy = looplock::take_index(d, 2, now, start, [] {});
  CHECK(busy.status == Acquisition::Busy);
  CHECK(busy.held.size() == 2);
  bool waited = false;
  auto late = looplock::take_index(d, 2, {WaitPlan::Kind::Bounded, std::chrono::milliseconds(150)},
                                   looplock::MonotonicClock::now(), [&] { waited = true; });
  CHECK(late.status == Acquisition::TimedOut);
  CHECK(waited);
  // Index 0 freed: the next run takes it.
  a.file.fd.reset();
  auto again = looplock::take_index(d, 2, now, start, [] {});
  REQUIRE(again.status == Acquisition::Acquired);
  CHECK(again.index == 0);
  CHECK(looplock::indexes_in(d) == std::vector<int>{0, 1, 2});
}

TEST_CASE("an unsafe index file is refused") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  REQUIRE(symlink("/etc/passwd", (dir.path() + "/.state.lock.holders.0").c_str()) == 0);
  try {
    (void)looplock::take_index(d, 2, {WaitPlan::Kind::NoWait, looplock::Duration::zero()},
                               looplock::MonotonicClock::now(), [] {});
    FAIL("not refused");
  } catch (const looplock::Fatal& f) {
    CHECK(f.status() == 73);
    CHECK(std::string(f.what()).find("unsafe holder index") != std::string::npos);
  }
}

TEST_CASE("an index file is opened to read only when it is a regular file; a FIFO is never opened") {
  TempDir dir;
  const looplock::LockDir d = looplock::open_lock_dir(dir.path());
  testutil::write_file(dir / looplock::index_name(0), "", 0640);
  REQUIRE(mkfifo((dir.path() + "/" + looplock::index_name(1)).c_str(), 0640) == 0);  // an open would block
  REQUIRE(symlink("/etc/passwd", (dir.path() + "/" + looplock::index_name(2)).c_str()) == 0);
  const auto regular = looplock::open_index_to_read(d, 0);
  REQUIRE(regular);
  CHECK(regular->st.regular());
  CHECK_FALSE(looplock::open_index_to_read(d, 1));
  CHECK_FALSE(looplock::open_index_to_read(d, 2));
  CHECK_FALSE(looplock::open_index_to_read(d, 3));  // none
}
