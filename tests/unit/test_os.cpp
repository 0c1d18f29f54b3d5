// What src/os/sys.hpp promises on every system: this file runs on Linux and,
// in the Windows cross build, under wine (tests/unit/meson.build). The POSIX
// implementation's own cases are in test_sys.cpp.
#include "os/digest.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/process.hpp"
#include "os/signal_names.hpp"
#include "os/sys.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

namespace sys = looplock::sys;

TEST_CASE("the monotonic clock does not go back, and sleep_until_ns reaches its time") {
  const long long a = sys::monotonic_ns();
  const long long b = sys::monotonic_ns();
  CHECK(b >= a);
  const long long until = b + 20'000'000;
  sys::sleep_until_ns(until);
  CHECK(sys::monotonic_ns() >= until);
  CHECK(sys::monotonic_ms() >= until / 1'000'000);
}

TEST_CASE("the wall clock is the C++ library's") {
  const long long ours = sys::realtime_ms();
  const long long theirs =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  CHECK(theirs - ours >= 0);
  CHECK(theirs - ours < 60'000);  // generous: the same clock, read twice
  CHECK(sys::parse_utc_ms(sys::utc_now_iso8601()).value() >= ours - 1);
}

TEST_CASE("utc_iso8601 and parse_utc_ms agree both ways") {
  for (long long ms = 0; ms < 200LL * 366 * 86'400'000LL; ms += 7'777'777'777LL) {
    CAPTURE(ms);
    CHECK(sys::parse_utc_ms(sys::utc_iso8601(ms)) == ms);
  }
  CHECK(sys::utc_iso8601(0) == "1970-01-01T00:00:00.000Z");
  CHECK(sys::utc_iso8601(951'782'400'000LL) == "2000-02-29T00:00:00.000Z");
}

TEST_CASE("parse_utc_ms") {
  using looplock::sys::parse_utc_ms;
  CHECK(parse_utc_ms("1970-01-01T00:00:00.000Z") == 0);
  CHECK(parse_utc_ms("2000-01-01T00:00:00.000Z") == 946'684'800'000LL);
  CHECK(parse_utc_ms("2026-11-30T17:00:00.123Z") == 1'796'058'000'123LL);
  CHECK(parse_utc_ms("2024-02-29T23:59:59.999Z") == 1'709'251'199'999LL);
  for (const char* bad : {"", "garbage", "2026-11-30T17:00:00Z", "2026-11-30T17:00:00.123", "2026-11-30 17:00:00.123Z",
                          "2026-11-30T17:00:00.123+", "2026-11-30T17:00:00.1234Z", "2026-11-30T17:00:00,123Z",
                          "XXXX-11-30T17:00:00.123Z"}) {
    std::string shown = bad;
    CAPTURE(shown);
    CHECK_FALSE(parse_utc_ms(bad));
  }
}

TEST_CASE("parse_utc_ms is strict: fixed digits, no signs, values in range") {
  // "...00.12Z " would otherwise read as 12 ms instead of 120 ms.
  for (const char* bad : {"2026-11-30T17:00:00.12Z ", "2026-1-30T17:00:00.123Z ", "+026-11-30T17:00:00.123Z",
                          "2026-11-30T17:00:00.+12Z", "2026-13-01T00:00:00.000Z", "2026-11-30T25:00:00.000Z",
                          "2026-11-31T00:00:00.000Z", "2026-02-29T00:00:00.000Z", "2026-04-00T00:00:00.000Z"}) {
    std::string shown = bad;
    CAPTURE(shown);
    CHECK_FALSE(looplock::sys::parse_utc_ms(bad));
  }
}

TEST_CASE("random_below stays below its bound and reaches every value") {
  CHECK(sys::random_below(1) == 0ULL);
  std::set<unsigned long long> seen;
  for (int i = 0; i < 2000; ++i) {
    const auto v = sys::random_below(4);
    REQUIRE(v);
    REQUIRE(*v < 4);
    seen.insert(*v);
  }
  CHECK(seen.size() == 4);  // each value is missed 2000 times in a row with odds 4 * (3/4)^2000
}

TEST_CASE("this process, this host") {
  CHECK(sys::own_pid() > 0);
  CHECK_FALSE(sys::host_name().empty());
}

TEST_CASE("this process's executable can be executed; a missing file cannot") {
  const auto self = sys::own_executable();
  REQUIRE(self);
  CHECK(std::filesystem::path(*self).is_absolute());
  CHECK(std::filesystem::path(*self).stem() == "test_os");
  CHECK(sys::execute_access(*self) == 0);
  CHECK(sys::execute_access(*self + ".missing") == ENOENT);
  CHECK(sys::own_uid() == sys::own_uid());
}

TEST_CASE("a process is alive and has a start; a record of this very process is never proven dead") {
  const auto self = sys::own_pid();
  CHECK(sys::process_alive(self));
  REQUIRE(sys::own_start());
  CHECK_FALSE(sys::own_start()->empty());
  CHECK(sys::process_start(self) == sys::own_start());
  for (const looplock::Pid none : {0, -1}) {
    CHECK_FALSE(sys::process_alive(none));
    CHECK_FALSE(sys::process_start(none));
  }
  CHECK_FALSE(sys::proven_dead(sys::boot_id(), sys::pid_namespace(), self, *sys::own_start()));
  CHECK_FALSE(sys::proven_dead("", "", self, "1"));               // a record without the facts
  CHECK(sys::boot_id().empty() == sys::pid_namespace().empty());  // both known, or neither
}

TEST_CASE("what the system tells about a process: its name and age") {
  const auto self = sys::own_pid();
  CHECK(sys::process_name(self) == "test_os");
  const auto age = sys::process_age_ms(self);
  REQUIRE(age);
  CHECK(*age >= 0);
  CHECK(*age < 24LL * 3600 * 1000);
  CHECK_FALSE(sys::process_name(-1));
  CHECK_FALSE(sys::process_age_ms(-1));
}

TEST_CASE("read_file reads a whole file, up to its limit") {
  const auto path = std::filesystem::temp_directory_path() / ("looplock-test-os-" + std::to_string(sys::own_pid()));
  {
    std::ofstream out(path, std::ios::binary);
    out << "line one\nline two\n" << std::string(10000, 'x');
  }
  const auto whole = sys::read_file(path.string());
  REQUIRE(whole);
  CHECK(whole->size() == 18 + 10000);
  CHECK(whole->substr(0, 9) == "line one\n");
  CHECK(sys::read_file(path.string(), 5) == "line ");
  std::filesystem::remove(path);
  CHECK_FALSE(sys::read_file(path.string()));
}

TEST_CASE("sha256_hex: the known vectors, from the system's own implementation") {
  CHECK(sys::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sys::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sys::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sys::sha256_hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  CHECK(sys::sha256_hex(std::string("a\0b", 3)) != sys::sha256_hex("a"));  // bytes, not a C string
}

TEST_CASE("status_of_path: a regular file's size, and its identity") {
  const auto base = std::filesystem::temp_directory_path() / ("looplock-test-os-st-" + std::to_string(sys::own_pid()));
  std::filesystem::create_directory(base);
  {
    std::ofstream(base / "a", std::ios::binary) << "12345";
    std::ofstream(base / "b", std::ios::binary) << "";
  }
  sys::FileStatus a, again, b, dir;
  REQUIRE(sys::status_of_path((base / "a").string(), a));
  REQUIRE(sys::status_of_path((base / "a").string(), again));
  REQUIRE(sys::status_of_path((base / "b").string(), b));
  REQUIRE(sys::status_of_path(base.string(), dir));
  CHECK(a.size == 5);
  CHECK((a.mode & 0170000) == 0100000);    // a regular file, numbered as POSIX numbers it
  CHECK((dir.mode & 0170000) == 0040000);  // a directory
  CHECK(a.links == 1);
  CHECK(sys::same_file(a, again));
  CHECK_FALSE(sys::same_file(a, b));
  std::filesystem::remove_all(base);
  CHECK_FALSE(sys::status_of_path((base / "a").string(), a));
}

TEST_CASE("open_for_reading, pread_all, status_of_fd and the paths the system knows") {
  const auto base =
      std::filesystem::temp_directory_path() / ("looplock-test-os-open-" + std::to_string(sys::own_pid()));
  std::filesystem::create_directory(base);
  const auto path = base / "opened.txt";
  std::ofstream(path, std::ios::binary) << "hello\nworld";
  {
    const looplock::UniqueFd fd = sys::open_for_reading(path.string());
    REQUIRE(fd);
    CHECK(sys::pread_all(fd.get(), 100) == "hello\nworld");
    CHECK(sys::pread_all(fd.get(), 5) == "hello");  // from the start again: the offset stays
    sys::FileStatus st;
    REQUIRE(sys::status_of_fd(fd.get(), st));
    CHECK(st.regular());
    CHECK(st.size == 11);
    const auto by_fd = sys::path_of_fd(fd.get());
    REQUIRE(by_fd);
    CHECK(by_fd->ends_with("opened.txt"));
    const auto real = sys::real_path(path.string());
    REQUIRE(real);
    CHECK(real->ends_with("opened.txt"));
  }
  CHECK(sys::working_dir() == std::filesystem::current_path().string());
  CHECK_FALSE(sys::open_for_reading((base / "missing").string()));
  CHECK_FALSE(sys::real_path((base / "missing").string()));
  std::filesystem::remove_all(base);
}

TEST_CASE("signals by name and number, both ways, over the system's table") {
  using looplock::parse_signal;
  using looplock::signal_name;
  // The C++ standard's six, which every system's table names.
  for (const char* name : {"INT", "ILL", "FPE", "SEGV", "TERM", "ABRT"}) {
    CAPTURE(std::string(name));
    const auto sig = parse_signal(name);
    REQUIRE(sig);
    CHECK(signal_name(*sig) == name);
    CHECK(parse_signal("sig" + std::string(name)) == sig);
    CHECK(parse_signal(std::to_string(*sig)) == sig);
  }
  CHECK(parse_signal("term") == parse_signal("TERM"));
  for (const char* bad : {"", "NOPE", "SIG", "0", "1000", "-1", "RTMIN+999"}) {
    CAPTURE(std::string(bad));
    CHECK_FALSE(parse_signal(bad));
  }
}

TEST_CASE("files in a directory: created, appended to, renamed and removed by name") {
  const auto base =
      std::filesystem::temp_directory_path() / ("looplock-test-os-files-" + std::to_string(sys::own_pid()));
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  std::ofstream(base / "plain") << "x";
  CHECK_FALSE(sys::open_directory((base / "missing").string()));
  CHECK(errno == ENOENT);
  CHECK_FALSE(sys::open_directory((base / "plain").string()));
  CHECK(errno == ENOTDIR);
  {
    const looplock::UniqueFd dir = sys::open_directory(base.string());
    REQUIRE(dir);
    CHECK(dir.get() >= 3);

    using Access = sys::OpenIn::Access;
    using Create = sys::OpenIn::Create;
    CHECK_FALSE(sys::open_in(dir.get(), "rows", {.access = Access::Read}));
    CHECK(errno == ENOENT);
    const sys::OpenIn appending{.access = Access::ReadWrite, .create = Create::IfMissing, .mode = 0660, .append = true};
    {
      const looplock::UniqueFd rows = sys::open_in(dir.get(), "rows", appending);
      REQUIRE(rows);
      CHECK(sys::append_row(rows.get(), "one\n"));
    }
    {
      const looplock::UniqueFd rows = sys::open_in(dir.get(), "rows", appending);
      REQUIRE(rows);
      CHECK(sys::append_row(rows.get(), "two\n"));
      CHECK(sys::pread_all(rows.get(), 100) == "one\ntwo\n");
      CHECK(sys::pread_all(rows.get(), 3, 4) == "two");
      CHECK(sys::pread_some(rows.get(), 100, 4) == "two\n");
      CHECK(sys::pread_some(rows.get(), 100, 8) == "");
    }
    CHECK_FALSE(sys::open_in(dir.get(), "rows", {.access = Access::Write, .create = Create::New, .mode = 0660}));
    CHECK(errno == EEXIST);
    sys::FileStatus st;
    REQUIRE(sys::status_at(dir.get(), "rows", st));
    CHECK(st.regular());
    CHECK(st.size == 8);
    CHECK(st.links == 1);
    REQUIRE(sys::status_at(dir.get(), "plain", st));
    CHECK(st.regular());
    CHECK(sys::may_access(dir.get(), "plain", {.read = true}));
    CHECK(sys::may_access(dir.get(), ".", {.write = true, .search = true}));
    CHECK_FALSE(sys::may_access(dir.get(), "missing", {.read = true}));
    CHECK(errno == ENOENT);

    CHECK(sys::rename_in(dir.get(), "rows", "plain"));  // replacing it
    CHECK_FALSE(sys::status_at(dir.get(), "rows", st));
    CHECK(errno == ENOENT);
    REQUIRE(sys::status_at(dir.get(), "plain", st));
    CHECK(st.size == 8);
    {
      const looplock::UniqueFd f = sys::open_in(dir.get(), "plain", {.access = Access::ReadWrite});
      REQUIRE(f);
      const bool reserved = sys::reserve_space(f.get(), 1 << 16);
      INFO("errno " << errno);
      CHECK(reserved);
      CHECK(sys::pread_all(f.get(), 1 << 20)->substr(0, 8) == "one\ntwo\n");
    }
    CHECK(sys::remove_in(dir.get(), "plain"));
    CHECK_FALSE(sys::status_at(dir.get(), "plain", st));
  }
  std::filesystem::remove_all(base);
}

TEST_CASE("a lock on a file: one holder at a time, a wait bounded by its deadline") {
  const auto base =
      std::filesystem::temp_directory_path() / ("looplock-test-os-lock-" + std::to_string(sys::own_pid()));
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  {
    const looplock::UniqueFd dir = sys::open_directory(base.string());
    REQUIRE(dir);
    const sys::OpenIn how{
        .access = sys::OpenIn::Access::ReadWrite, .create = sys::OpenIn::Create::IfMissing, .mode = 0660};
    const looplock::UniqueFd a = sys::open_in(dir.get(), "lock", how);
    const looplock::UniqueFd b = sys::open_in(dir.get(), "lock", how);
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(sys::try_lock(a.get(), true));
    CHECK_FALSE(sys::try_lock(b.get(), true));
    CHECK(errno == EWOULDBLOCK);

    int ticks = 0;
    const long long start = sys::monotonic_ns();
    const auto timed_out = sys::lock_until(b.get(), true, looplock::instant_ns(start + 300'000'000),
                                           std::chrono::milliseconds(50), [&] { ++ticks; });
    CHECK(timed_out.end == sys::LockWait::End::TimedOut);
    CHECK(sys::monotonic_ns() - start >= 300'000'000);
    CHECK(ticks >= 1);
    const auto past = sys::lock_until(b.get(), true, looplock::instant_ns(start), {}, [] {});
    CHECK(past.end == sys::LockWait::End::TimedOut);

    REQUIRE(sys::unlock(a.get()));
    const auto locked =
        sys::lock_until(b.get(), true, looplock::MonotonicClock::now() + std::chrono::seconds(60), {}, [] {});
    CHECK(locked.end == sys::LockWait::End::Locked);
    CHECK_FALSE(sys::try_lock(a.get(), true));
  }  // every descriptor closed: Windows removes no directory with a file open in it
  // ... but on Windows the wait that timed out is left waiting, its handle
  // open until this process exits (os/files.hpp): the directory may stay.
  std::error_code ignored;
  std::filesystem::remove_all(base, ignored);
}

TEST_CASE("this process is not ending; no descriptor -1 is a terminal") {
  CHECK_FALSE(sys::process_ending(sys::own_pid(), 0));
  CHECK_FALSE(sys::is_terminal(-1));
  CHECK_FALSE(sys::terminal_width(-1));
}
