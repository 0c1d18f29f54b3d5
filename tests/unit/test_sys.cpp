#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/lock_holders.hpp"
#include "os/posix/files.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <string>
#include <thread>

#include "cli/inspect.hpp"
#include "os/unique_fd.hpp"
#include "testutil.hpp"

namespace sys = looplock::sys;
using looplock::UniqueFd;
using testutil::TempDir;

TEST_CASE("retry_eintr repeats only on EINTR") {
  int calls = 0;
  int r = sys::retry_eintr([&] {
    ++calls;
    if (calls < 3) {
      errno = EINTR;
      return -1;
    }
    return 5;
  });
  CHECK(r == 5);
  CHECK(calls == 3);

  calls = 0;
  r = sys::retry_eintr([&] {
    ++calls;
    errno = EAGAIN;
    return -1;
  });
  CHECK(r == -1);
  CHECK(errno == EAGAIN);
  CHECK(calls == 1);
}

TEST_CASE("write_all and pread_all") {
  TempDir dir;
  UniqueFd fd(::open((dir / "f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  REQUIRE(fd);
  std::string data(100'000, 'x');
  data[0] = 'a';
  data.back() = 'z';
  REQUIRE(sys::write_all(fd.get(), data));
  // pread_all reads from the start whatever the file position.
  CHECK(sys::pread_all(fd.get(), 1 << 20) == data);
  CHECK(sys::pread_all(fd.get(), 10) == data.substr(0, 10));
  CHECK(sys::pread_all(fd.get(), 0) == "");
  CHECK(sys::write_all(fd.get(), ""));

  errno = 0;
  CHECK_FALSE(sys::write_all(-1, "x"));
  CHECK(errno == EBADF);
  CHECK_FALSE(sys::pread_all(-1, 10));
  // A pipe cannot be pread: an error, not a crash.
  int p[2];
  REQUIRE(pipe(p) == 0);
  UniqueFd r(p[0]), w(p[1]);
  CHECK_FALSE(sys::pread_all(r.get(), 10));
}

TEST_CASE("pwrite_all writes at the start and leaves the file position") {
  TempDir dir;
  UniqueFd fd(::open((dir / "f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  REQUIRE(fd);
  REQUIRE(sys::write_all(fd.get(), "0123456789"));
  CHECK(sys::pwrite_all(fd.get(), "ab"));
  CHECK(lseek(fd.get(), 0, SEEK_CUR) == 10);
  CHECK(sys::pread_all(fd.get(), 100) == "ab23456789");
  const std::string big(100'000, 'y');
  CHECK(sys::pwrite_all(fd.get(), big));
  CHECK(sys::pread_all(fd.get(), 1 << 20) == big);
  errno = 0;
  CHECK_FALSE(sys::pwrite_all(-1, "x"));
  CHECK(errno == EBADF);
}

TEST_CASE("write_all writes everything through a pipe") {
  int p[2];
  REQUIRE(pipe(p) == 0);
  UniqueFd r(p[0]), w(p[1]);
  const std::string data(1 << 20, 'q');  // far more than the pipe buffer
  std::string got;
  std::thread reader([&] {
    char buf[65536];
    for (ssize_t n; (n = read(r.get(), buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  });
  bool ok = sys::write_all(w.get(), data);
  w.reset();
  reader.join();
  CHECK(ok);
  CHECK(got == data);
}

TEST_CASE("read_file") {
  TempDir dir;
  testutil::write_file(dir / "f", "hello\nworld\n");
  CHECK(sys::read_file(dir / "f") == "hello\nworld\n");
  // The limit caps what a runaway file costs (it is not an exact length).
  testutil::write_file(dir / "big", std::string(1 << 20, 'b'));
  auto capped = sys::read_file(dir / "big", 10);
  REQUIRE(capped);
  CHECK(capped->size() >= 10);
  CHECK(capped->size() < 65536);
  errno = 0;
  CHECK_FALSE(sys::read_file(dir / "missing"));
  CHECK(errno == ENOENT);
  // /proc files report size 0 but have content.
  auto stat = sys::read_file("/proc/self/stat");
  REQUIRE(stat);
  CHECK(stat->rfind(std::to_string(getpid()) + " (", 0) == 0);
  CHECK_FALSE(sys::read_file(dir.path()));  // a directory cannot be read
}

TEST_CASE("clocks and the ISO 8601 time") {
  std::string now = sys::utc_now_iso8601();
  CAPTURE(now);
  CHECK(now.size() == 24);
  CHECK(std::regex_match(now, std::regex(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z)")));
  auto ms = looplock::sys::parse_utc_ms(now);
  REQUIRE(ms);
  CHECK(std::llabs(*ms - sys::realtime_ms()) < 5000);

  long long a = sys::monotonic_ns();
  long long b = sys::monotonic_ns();
  CHECK(b >= a);
  long long ms1 = sys::monotonic_ms();
  CHECK(std::llabs(ms1 - sys::monotonic_ns() / 1'000'000) <= 1000);
  CHECK(sys::realtime_ms() > 1'600'000'000'000LL);  // after 2020
}

TEST_CASE("file status on POSIX: identity, type, mode, owner, links and size; status_at does not follow a link") {
  TempDir dir;
  testutil::write_file(dir / "a", "12345");
  testutil::write_file(dir / "b", "");
  REQUIRE(chmod((dir / "a").c_str(), 0640) == 0);
  REQUIRE(link((dir / "a").c_str(), (dir / "a2").c_str()) == 0);
  REQUIRE(symlink("a", (dir / "l").c_str()) == 0);
  sys::FileStatus a, a2, b, l, by_fd;
  REQUIRE(sys::status_of_path(dir / "a", a));
  REQUIRE(sys::status_of_path(dir / "a2", a2));
  REQUIRE(sys::status_of_path(dir / "b", b));
  CHECK(sys::same_file(a, a2));
  CHECK_FALSE(sys::same_file(a, b));
  CHECK(S_ISREG(a.mode));
  CHECK((a.mode & 07777) == 0640);
  CHECK(a.owner == geteuid());
  CHECK(a.group == getegid());
  CHECK(a.links == 2);
  CHECK(a.size == 5);
  UniqueFd dfd(open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(sys::status_at(dfd.get(), "l", l));
  CHECK(S_ISLNK(l.mode));
  CHECK_FALSE(sys::same_file(a, l));
  REQUIRE(sys::status_of_fd(dfd.get(), by_fd));
  CHECK(S_ISDIR(by_fd.mode));
  errno = 0;
  CHECK_FALSE(sys::status_at(dfd.get(), "missing", l));
  CHECK(errno == ENOENT);
}

TEST_CASE("utc_iso8601 agrees with gmtime(3) across centuries, leap days and negative times") {
  for (long long ms : {0LL, 1LL, 999LL, 86'399'999LL, 951'782'400'000LL /* 2000-02-29 */, 1'796'062'414'123LL,
                       4'102'444'799'999LL /* 2099-12-31 */, 253'402'300'799'999LL /* 9999-12-31 */, -1LL,
                       -86'400'000LL, -2'208'988'800'000LL /* 1900-01-01 */}) {
    time_t secs = static_cast<time_t>(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
    tm utc{};
    gmtime_r(&secs, &utc);
    char want[64];
    std::snprintf(want, sizeof want, "%04d-%02d-%02dT%02d:%02d:%02d.%03lldZ", utc.tm_year + 1900, utc.tm_mon + 1,
                  utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, ms - static_cast<long long>(secs) * 1000);
    CHECK(looplock::sys::utc_iso8601(ms) == std::string(want));
  }
  for (long long ms = 0; ms < 200LL * 366 * 86'400'000LL; ms += 7'777'777'777LL) {
    time_t secs = static_cast<time_t>(ms / 1000);
    tm utc{};
    gmtime_r(&secs, &utc);
    char want[64];
    std::snprintf(want, sizeof want, "%04d-%02d-%02dT%02d:%02d:%02d.%03lldZ", utc.tm_year + 1900, utc.tm_mon + 1,
                  utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, ms % 1000);
    CHECK(looplock::sys::utc_iso8601(ms) == std::string(want));
  }
}

TEST_CASE("random_below stays below its bound and reaches all of it") {
  std::vector<int> seen(7, 0);
  for (int i = 0; i < 2000; ++i) {
    const auto v = looplock::sys::random_below(7);
    REQUIRE(v);
    REQUIRE(*v < 7);
    ++seen[*v];
  }
  for (int n : seen) CHECK(n > 150);  // 2000/7 = 286 expected each
  CHECK(looplock::sys::random_below(1) == 0ULL);
}

TEST_CASE("sleep_until_ns sleeps until then, and not for a time in the past") {
  const long long t0 = looplock::sys::monotonic_ns();
  looplock::sys::sleep_until_ns(t0 + 30'000'000);
  CHECK(looplock::sys::monotonic_ns() >= t0 + 30'000'000);
  const long long t1 = looplock::sys::monotonic_ns();
  looplock::sys::sleep_until_ns(t1 - 1'000'000'000);
  CHECK(looplock::sys::monotonic_ns() - t1 < 1'000'000'000);
}

TEST_CASE("user_name: /etc/passwd's name, else the number, never NSS") {
  // uid 0 is in every /etc/passwd; a uid no system lists is its number
  // (the static looplock never asks NSS: test_users.py runs it so).
  CHECK(looplock::sys::user_name(0) == "root");
  CHECK(looplock::sys::user_name(4000000123u) == "4000000123");
}

TEST_CASE("path_of_fd on POSIX: the directory's canonical path, none once it is removed") {
  TempDir dir;
  std::filesystem::create_directory(dir / "d");
  REQUIRE(symlink((dir / "d").c_str(), (dir / "link").c_str()) == 0);
  UniqueFd fd(open((dir / "link").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(fd);
  const auto real = sys::real_path(dir / "link");
  REQUIRE(real);
  CHECK(sys::path_of_fd(fd.get()) == real);
  CHECK(real->ends_with("/d"));
  REQUIRE(rmdir((dir / "d").c_str()) == 0);
  CHECK_FALSE(sys::path_of_fd(fd.get()));  // the kernel says "(deleted)"
}

TEST_CASE("exec_program on POSIX: the program replaces the process, with the environment given; a missing one is ENOENT") {
  char* argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"), const_cast<char*>("exit $CODE"), nullptr};
  CHECK(looplock::sys::exec_program("/nonexistent/looplock-test", argv, {"CODE=7"}) == ENOENT);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(100 + looplock::sys::exec_program("/bin/sh", argv, {"CODE=7"}) % 100);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
}

TEST_CASE("own_uid and own_euid are getuid(2) and geteuid(2); own_executable is /proc/self/exe") {
  CHECK(looplock::sys::own_uid() == getuid());
  CHECK(looplock::sys::own_euid() == geteuid());
  CHECK(looplock::sys::in_group(getegid()));
  CHECK(looplock::sys::own_executable() == std::filesystem::read_symlink("/proc/self/exe").string());
}

TEST_CASE("what POSIX tells about a process: its arguments, its environment and its user, from /proc") {
  const auto args = looplock::sys::process_args(getpid());
  REQUIRE(args);
  REQUIRE_FALSE(args->empty());
  CHECK(std::filesystem::path(args->front()).filename() == "test_sys");
  CHECK(looplock::sys::process_env(getpid(), "PATH") == std::string(std::getenv("PATH")));
  CHECK(looplock::sys::process_uid(getpid()) == getuid());
}

TEST_CASE("network file systems are named; local ones are not") {
  CHECK(looplock::sys::network_fs_name(0x6969) == "nfs");
  CHECK(looplock::sys::network_fs_name(0xff534d42) == "cifs");
  CHECK(looplock::sys::network_fs_name(0xfe534d42) == "smb2");
  CHECK(looplock::sys::network_fs_name(0x00c36400) == "ceph");
  CHECK(looplock::sys::network_fs_name(0x01021997) == "9p");
  CHECK_FALSE(looplock::sys::network_fs_name(0xEF53));      // ext4
  CHECK_FALSE(looplock::sys::network_fs_name(0x01021994));  // tmpfs
  CHECK_FALSE(looplock::sys::network_fs_name(0x58465342));  // xfs
  CHECK_FALSE(looplock::sys::network_fs_name(0x794c7630));  // overlayfs
  CHECK_FALSE(looplock::sys::network_fs_name(0x9123683E));  // btrfs

  looplock::UniqueFd proc(::open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(proc);
  CHECK_FALSE(looplock::sys::network_file_system(proc.get()));
  CHECK_FALSE(looplock::sys::network_file_system(-1));  // an error is not a warning
}

TEST_CASE("on Linux: descendants, a process ending, who holds a lock, a descriptor kept from commands") {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  const auto kids = looplock::sys::descendants(getpid());
  CHECK(std::find(kids.begin(), kids.end(), child) != kids.end());
  CHECK_FALSE(looplock::sys::process_ending(child, 0));
  CHECK(looplock::sys::process_ending(child, getpgrp()));  // in the group looplock signalled
  kill(child, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(looplock::sys::process_ending(child, 0));

  testutil::TempDir tmp;
  const looplock::UniqueFd dir = looplock::sys::open_directory(tmp.path());
  const looplock::UniqueFd fd = looplock::sys::open_in(
      dir.get(), "lock",
      {.access = looplock::sys::OpenIn::Access::ReadWrite, .create = looplock::sys::OpenIn::Create::New, .mode = 0600});
  REQUIRE(fd);
  looplock::sys::FileStatus st;
  REQUIRE(looplock::sys::status_of_fd(fd.get(), st));
  CHECK(looplock::sys::holding_lock({getpid()}, st).empty());
  REQUIRE(looplock::sys::try_lock(fd.get(), true));
  CHECK(looplock::sys::holding_lock({getpid()}, st) == std::vector<looplock::Pid>{getpid()});
  CHECK(looplock::sys::own_fd_holds_lock(fd.get(), st, true) == true);
  CHECK(looplock::sys::fd_holds_lock(getpid(), fd.get(), st, true));
  const auto held = looplock::sys::holders_among({getpid()}, st);
  REQUIRE(held.size() == 1);
  CHECK(held[0].exclusive);
  const auto table = looplock::sys::lock_table(st);
  REQUIRE(table);
  REQUIRE(table->holders.size() == 1);
  CHECK(table->holders[0].pid == getpid());
  CHECK(table->waiters.empty());
  CHECK((fcntl(fd.get(), F_GETFD) & FD_CLOEXEC) != 0);  // open_in's own
  REQUIRE(fcntl(fd.get(), F_SETFD, 0) == 0);
  CHECK(looplock::sys::keep_from_commands(fd.get()));
  CHECK((fcntl(fd.get(), F_GETFD) & FD_CLOEXEC) != 0);
}

TEST_CASE("on Linux: ancestry, pid namespaces and groups from /proc") {
  CHECK(looplock::sys::is_self_or_ancestor(getpid(), getpid()));
  CHECK(looplock::sys::is_self_or_ancestor(getppid(), getpid()));
  CHECK_FALSE(looplock::sys::is_self_or_ancestor(0, getpid()));
  CHECK(looplock::sys::pids_comparable());
  const auto mine = looplock::sys::namespace_pids(0);
  REQUIRE_FALSE(mine.empty());
  CHECK(mine.back() == getpid());  // in its own namespace, last
  const auto groups = looplock::sys::process_groups(getpid());
  REQUIRE(groups);
  CHECK(std::find(groups->begin(), groups->end(), getegid()) != groups->end());
}
