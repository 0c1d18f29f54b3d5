#include "os/posix/procfs.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "os/ids.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "testutil.hpp"

using looplock::Gid;
using looplock::Pid;

namespace procfs = looplock::procfs;
using looplock::UniqueFd;
using testutil::TempDir;

namespace {

// A /proc/PID/stat line with this comm, ppid and start time (field 22).
std::string stat_line(const std::string& comm, const std::string& ppid, const std::string& start) {
  std::string s = "4242 (" + comm + ") S " + ppid + " 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 " + start +
                  " 12345678 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
  return s;
}

looplock::sys::FileStatus fake_stat(unsigned maj, unsigned min, ino_t ino) {
  looplock::sys::FileStatus st;
  st.device = makedev(maj, min);
  st.inode = ino;
  return st;
}

// A child that waits until its stdin pipe closes (or 20 s pass), then exits.
struct Sleeper {
  Pid pid = -1;
  int release_fd = -1;
  Sleeper() {
    int p[2];
    REQUIRE(pipe2(p, O_CLOEXEC) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(p[1]);
      char c;
      alarm(20);
      (void)!read(p[0], &c, 1);
      _exit(0);
    }
    close(p[0]);
    release_fd = p[1];
  }
  ~Sleeper() {
    close(release_fd);
    testutil::wait_child(pid);
  }
};

}  // namespace

TEST_CASE("parse_stat_start and parse_stat_ppid with tricky command names") {
  for (const std::string comm : {"sleep", "(a) b)", "a b c", ") 1 2 3 (", "x) S 99 (", "", "))", "tab\there"}) {
    CAPTURE(comm);
    std::string line = stat_line(comm, "42", "987654");
    CHECK(procfs::parse_stat_start(line) == "987654");
    CHECK(procfs::parse_stat_ppid(line) == 42);
  }
  // Without the trailing newline too.
  std::string line = stat_line("x", "7", "55");
  line.pop_back();
  CHECK(procfs::parse_stat_start(line) == "55");
  CHECK(procfs::parse_stat_ppid(line) == 7);
}

TEST_CASE("a start time read in a time namespace is the one the initial namespace shows") {
  const std::string offsets = "monotonic           0         0\nboottime         1000         0\n";
  CHECK(procfs::start_in_initial_time_ns(std::string("150000"), offsets, 100) == "50000");
  CHECK(procfs::start_in_initial_time_ns(std::string("150000"), "monotonic 5 0\nboottime 0 0\n", 100) == "150000");
  CHECK(procfs::start_in_initial_time_ns(std::string("150000"), "boottime 2 500000000\n", 100) == "149750");
  CHECK(procfs::start_in_initial_time_ns(std::string("150000"), "boottime 2 5000001\n", 100) == "150000");  // not whole ticks
  CHECK(procfs::start_in_initial_time_ns(std::string("150000"), "", 100) == "150000");          // no time namespaces
  CHECK(procfs::start_in_initial_time_ns(std::string("150000"), "boottime x y\n", 100) == "150000");  // odd: as read
  CHECK(procfs::start_in_initial_time_ns(std::string("5"), offsets, 100) == "5");  // cannot be: as read
  CHECK_FALSE(procfs::start_in_initial_time_ns(std::nullopt, offsets, 100));
}

TEST_CASE("parse_stat_* tolerate odd content") {
  CHECK_FALSE(procfs::parse_stat_start(""));
  CHECK_FALSE(procfs::parse_stat_ppid(""));
  CHECK_FALSE(procfs::parse_stat_start("4242 no parens S 1 2 3"));
  CHECK_FALSE(procfs::parse_stat_ppid("4242 no parens S 1 2 3"));
  CHECK_FALSE(procfs::parse_stat_start("4242 (x) S 1 2 3"));  // too few fields
  CHECK(procfs::parse_stat_ppid("4242 (x) S 1 2 3") == 1);
  CHECK_FALSE(procfs::parse_stat_ppid("4242 (x) S"));
  CHECK_FALSE(procfs::parse_stat_ppid("4242 (x) S abc"));
  CHECK_FALSE(procfs::parse_stat_start(stat_line("x", "1", "12abc")));
  CHECK_FALSE(procfs::parse_stat_start(stat_line("x", "1", "-5")));
}

TEST_CASE("pid_start, parent_pid and pid_alive of real processes") {
  auto start = procfs::pid_start(getpid());
  REQUIRE(start);
  CHECK_FALSE(start->empty());
  CHECK(start->find_first_not_of("0123456789") == std::string::npos);
  CHECK(procfs::pid_start(getpid()) == start);  // stable
  auto stat = testutil::slurp("/proc/self/stat");
  REQUIRE(stat);
  CHECK(procfs::parse_stat_start(*stat) == start);

  CHECK(procfs::parent_pid(getpid()) == getppid());
  CHECK(procfs::pid_alive(getpid()));
  CHECK(procfs::pid_alive(1));  // alive, whether or not we may signal it
  CHECK_FALSE(procfs::pid_alive(0));
  CHECK_FALSE(procfs::pid_alive(-1));

  Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  REQUIRE(testutil::wait_child(child));
  CHECK_FALSE(procfs::pid_alive(child));
  CHECK_FALSE(procfs::pid_start(child));
  CHECK_FALSE(procfs::parent_pid(child));
}

TEST_CASE("ended: a zombie has ended, a process whose main thread alone ended has not") {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A thread that waits for the pipe; the main thread ends alone.
    close(pipe_fds[1]);
    std::thread waits([fd = pipe_fds[0]] {
      char c;
      (void)!read(fd, &c, 1);
      _exit(0);
    });
    waits.detach();
    syscall(SYS_exit, 0);  // ends the calling thread only
  }
  close(pipe_fds[0]);
  const auto state = [&] {
    auto stat = testutil::slurp("/proc/" + std::to_string(child) + "/stat");
    return stat ? stat->substr(stat->rfind(')') + 2, 1) : std::string();
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (state() != "Z" && std::chrono::steady_clock::now() < deadline) usleep(1000);
  REQUIRE(state() == "Z");  // the main thread is a zombie: the process lives on
  CHECK_FALSE(procfs::ended(child));
  CHECK(looplock::sys::process_alive(child));
  close(pipe_fds[1]);  // the last thread ends: the whole process is a zombie
  while (!procfs::ended(child) && std::chrono::steady_clock::now() < deadline) usleep(1000);
  CHECK(procfs::ended(child));
  CHECK_FALSE(looplock::sys::process_alive(child));
  CHECK(procfs::pid_alive(child));  // kill(pid, 0) still finds it until it is reaped
  REQUIRE(testutil::wait_child(child));
  CHECK_FALSE(procfs::ended(child));  // gone: not a zombie (process_alive says it is not alive)
}

TEST_CASE("is_self_or_ancestor") {
  CHECK(procfs::is_self_or_ancestor(getpid(), getpid()));
  CHECK(procfs::is_self_or_ancestor(getppid(), getpid()));
  CHECK_FALSE(procfs::is_self_or_ancestor(0, getpid()));
  CHECK_FALSE(procfs::is_self_or_ancestor(-1, getpid()));

  Sleeper unrelated;  // a live child: not an ancestor of this process
  CHECK_FALSE(procfs::is_self_or_ancestor(unrelated.pid, getpid()));
  // ... but this process is one of the child's ancestors, and so is its parent.
  CHECK(procfs::is_self_or_ancestor(getpid(), unrelated.pid));
  CHECK(procfs::is_self_or_ancestor(getppid(), unrelated.pid));
  CHECK(procfs::is_self_or_ancestor(unrelated.pid, unrelated.pid));

  // A grandchild sees this process as an ancestor.
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  const Pid me = getpid();
  Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    Pid grandchild = fork();
    if (grandchild == 0) {
      char ok = procfs::is_self_or_ancestor(me, getpid()) && !procfs::is_self_or_ancestor(unrelated.pid, getpid())
                    ? 'y'
                    : 'n';
      (void)!write(p[1], &ok, 1);
      _exit(0);
    }
    int st;
    waitpid(grandchild, &st, 0);
    _exit(0);
  }
  close(p[1]);
  CHECK(testutil::read_until(p[0], "y"));
  close(p[0]);
  REQUIRE(testutil::wait_child(child));
}

TEST_CASE("parse_proc_locks") {
  const looplock::sys::FileStatus file = fake_stat(0xfe, 0x00, 10952825);
  const std::string content =
      "1: FLOCK  ADVISORY  WRITE 2181 fe:00:10952825 0 EOF\n"
      "2: FLOCK  ADVISORY  READ  2182 fe:00:10952825 0 EOF\n"
      "2: -> FLOCK  ADVISORY  WRITE 2183 fe:00:10952825 0 EOF\n"  // a waiter
      "3: POSIX  ADVISORY  WRITE 2184 fe:00:10952825 0 EOF\n"     // fcntl lock, not flock
      "4: OFDLCK ADVISORY  READ  -1 fe:00:10952825 0 EOF\n"
      "5: FLOCK  ADVISORY  WRITE 2185 fe:00:10952826 0 EOF\n"  // another inode
      "6: FLOCK  ADVISORY  WRITE 2186 fe:01:10952825 0 EOF\n"  // another device
      "7: FLOCK  ADVISORY  WRITE 2187 00:2d:10952825 0 EOF\n"
      "8: LEASE  ACTIVE    READ  2188 fe:00:10952825 0 EOF\n"
      "garbage line\n"
      "\n"
      "9: FLOCK  ADVISORY  WRITE 2189 fe:00:10952825 0 EOF";  // no final newline
  auto locks = procfs::parse_proc_locks(content, file);
  REQUIRE(locks.size() == 3);
  CHECK(locks[0].pid == 2181);
  CHECK(locks[0].exclusive);
  CHECK(locks[1].pid == 2182);
  CHECK_FALSE(locks[1].exclusive);
  CHECK(locks[2].pid == 2189);
  CHECK(locks[2].exclusive);

  CHECK(procfs::parse_proc_locks("", file).empty());
  // Device numbers are hex: major 259 is "103".
  const looplock::sys::FileStatus nvme = fake_stat(259, 2, 77);
  auto l = procfs::parse_proc_locks("1: FLOCK  ADVISORY  WRITE 10 103:02:77 0 EOF\n", nvme);
  REQUIRE(l.size() == 1);
  CHECK(l[0].pid == 10);
  CHECK(procfs::parse_proc_locks("1: FLOCK  ADVISORY  WRITE 10 259:02:77 0 EOF\n", nvme).empty());
}

TEST_CASE("parse_fdinfo_holds") {
  const looplock::sys::FileStatus file = fake_stat(0xfe, 0x00, 10952825);
  const std::string head = "pos:\t0\nflags:\t02100002\nmnt_id:\t29\nino:\t10952825\n";
  const std::string write_lock = head + "lock:\t1: FLOCK  ADVISORY  WRITE 2181 fe:00:10952825 0 EOF\n";
  const std::string read_lock = head + "lock:\t1: FLOCK  ADVISORY  READ  2181 fe:00:10952825 0 EOF\n";
  CHECK(procfs::parse_fdinfo_holds(write_lock, file, true));
  CHECK(procfs::parse_fdinfo_holds(write_lock, file, false));
  CHECK_FALSE(procfs::parse_fdinfo_holds(read_lock, file, true));
  CHECK(procfs::parse_fdinfo_holds(read_lock, file, false));
  CHECK_FALSE(procfs::parse_fdinfo_holds(head, file, false));
  CHECK_FALSE(procfs::parse_fdinfo_holds("", file, false));
  CHECK_FALSE(
      procfs::parse_fdinfo_holds(head + "lock:\t1: POSIX  ADVISORY  WRITE 2181 fe:00:10952825 0 EOF\n", file, false));
  CHECK_FALSE(
      procfs::parse_fdinfo_holds(head + "lock:\t1: FLOCK  ADVISORY  WRITE 2181 fe:00:10952826 0 EOF\n", file, false));
  CHECK_FALSE(procfs::parse_fdinfo_holds(head + "lock:\t1: -> FLOCK  ADVISORY  WRITE 2181 fe:00:10952825 0 EOF\n", file,
                                         false));
  // A lock line elsewhere than after "lock:" does not count.
  CHECK_FALSE(procfs::parse_fdinfo_holds(head + "1: FLOCK  ADVISORY  WRITE 2181 fe:00:10952825 0 EOF\n", file, false));
}

TEST_CASE("flock_holders and fd_holds_flock on a real lock") {
  TempDir dir;
  const std::string path = dir / "lockfile";
  testutil::write_file(path, "");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  REQUIRE(fd);
  looplock::sys::FileStatus st;
  REQUIRE(looplock::sys::status_of_fd(fd.get(), st));

  CHECK(procfs::flock_holders(st).value().empty());
  CHECK_FALSE(procfs::fd_holds_flock(getpid(), fd.get(), st, false));

  REQUIRE(flock(fd.get(), LOCK_EX) == 0);
  auto holders = procfs::flock_holders(st).value();
  REQUIRE(holders.size() == 1);
  CHECK(holders[0].pid == getpid());
  CHECK(holders[0].exclusive);
  CHECK(procfs::fd_holds_flock(getpid(), fd.get(), st, true));
  CHECK(procfs::fd_holds_flock(getpid(), fd.get(), st, false));

  // Another descriptor of the same file that does not hold the lock.
  UniqueFd other(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(other);
  CHECK_FALSE(procfs::fd_holds_flock(getpid(), other.get(), st, false));
  // The locking fd, but asked about another file.
  testutil::write_file(dir / "second", "");
  looplock::sys::FileStatus st2;
  REQUIRE(looplock::sys::status_of_path((dir / "second"), st2));
  CHECK_FALSE(procfs::fd_holds_flock(getpid(), fd.get(), st2, false));
  CHECK(procfs::flock_holders(st2).value().empty());
  // Bad pid or fd.
  CHECK_FALSE(procfs::fd_holds_flock(getpid(), -1, st, false));
  CHECK_FALSE(procfs::fd_holds_flock(0, fd.get(), st, false));
  CHECK_FALSE(procfs::fd_holds_flock(getpid(), 100000, st, false));

  // Downgraded to shared.
  REQUIRE(flock(fd.get(), LOCK_SH) == 0);
  CHECK_FALSE(procfs::fd_holds_flock(getpid(), fd.get(), st, true));
  CHECK(procfs::fd_holds_flock(getpid(), fd.get(), st, false));
  holders = procfs::flock_holders(st).value();
  REQUIRE(holders.size() == 1);
  CHECK_FALSE(holders[0].exclusive);
  auto by_fd = procfs::fd_holders({getpid()}, st);
  REQUIRE(by_fd.size() == 1);
  CHECK_FALSE(by_fd[0].exclusive);

  REQUIRE(flock(fd.get(), LOCK_UN) == 0);
  CHECK_FALSE(procfs::fd_holds_flock(getpid(), fd.get(), st, false));
  CHECK(procfs::flock_holders(st).value().empty());
}

TEST_CASE("own_start, proc_is_ours, comm and ns_pids") {
  CHECK(looplock::sys::own_start() == procfs::pid_start(getpid()));
  CHECK(procfs::proc_is_ours());
  auto name = procfs::comm(getpid());
  REQUIRE(name);
  CHECK(name->starts_with("test_procfs"));
  auto mine = procfs::ns_pids(0);
  REQUIRE_FALSE(mine.empty());
  CHECK(mine.back() == getpid());
  CHECK(procfs::ns_pids(getpid()) == mine);
  CHECK(procfs::parse_ns_pids("Name:\tx\nNSpid:\t4321\t1\nNSpgid:\t4321\t1\n") == std::vector<Pid>{4321, 1});
  CHECK(procfs::parse_ns_pids("Name:\tx\n").empty());
  CHECK(procfs::parse_ns_pids("NSpid:\t12\tx\n").empty());
}

TEST_CASE("descendants and pids_holding_flock") {
  TempDir dir;
  const std::string path = dir / "lockfile";
  testutil::write_file(path, "");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  REQUIRE(fd);
  looplock::sys::FileStatus st;
  REQUIRE(looplock::sys::status_of_fd(fd.get(), st));

  // A child and a grandchild that wait for the pipe to close; the grandchild
  // holds the lock through its own open file description.
  int release[2], ready[2];
  REQUIRE(pipe2(release, O_CLOEXEC) == 0);
  REQUIRE(pipe2(ready, O_CLOEXEC) == 0);
  Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(release[1]);
    Pid grandchild = fork();
    if (grandchild == 0) {
      int own = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (own < 0 || flock(own, LOCK_EX) != 0) _exit(1);
      std::string msg = "ready " + std::to_string(getpid()) + "\n";
      (void)!write(ready[1], msg.data(), msg.size());
      char c;
      alarm(20);
      (void)!read(release[0], &c, 1);
      _exit(0);
    }
    char c;
    alarm(20);
    (void)!read(release[0], &c, 1);
    int s;
    waitpid(grandchild, &s, 0);
    _exit(0);
  }
  close(release[0]);
  close(ready[1]);
  std::string got;
  {
    // Read "ready PID\n".
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd pf{ready[0], POLLIN, 0};
      if (poll(&pf, 1, 100) > 0) {
        char buf[64];
        ssize_t n = read(ready[0], buf, sizeof buf);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
      }
    }
  }
  close(ready[0]);
  REQUIRE(got.rfind("ready ", 0) == 0);
  const Pid grandchild = static_cast<Pid>(std::stol(got.substr(6)));

  auto all = procfs::descendants(getpid());
  CHECK(std::find(all.begin(), all.end(), child) != all.end());
  CHECK(std::find(all.begin(), all.end(), grandchild) != all.end());
  auto below_child = procfs::descendants(child);
  CHECK(below_child == std::vector<Pid>{grandchild});
  CHECK(procfs::descendants(grandchild).empty());

  CHECK(procfs::pids_holding_flock({child, grandchild}, st) == std::vector<Pid>{grandchild});
  CHECK(procfs::pids_holding_flock({getpid()}, st).empty());  // our fd is not locked
  CHECK(procfs::pids_holding_flock({}, st).empty());

  close(release[1]);
  REQUIRE(testutil::wait_child(child));
}

TEST_CASE("parse_group_ids: the real and effective group, then the supplementary ones") {
  const std::string status = "Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1001\t1002\t1003\n"
                             "FDSize:\t64\nGroups:\t27 5000 \nNStgid:\t1\n";
  CHECK(looplock::procfs::parse_group_ids(status) == std::vector<Gid>{1000, 1001, 27, 5000});
  CHECK(looplock::procfs::parse_group_ids("Gid:\t7\t7\t7\t7\nGroups:\t\n") == std::vector<Gid>{7, 7});
  CHECK(looplock::procfs::parse_group_ids("Name:\tx\n").empty());
  const auto mine = looplock::procfs::group_ids(getpid());
  REQUIRE(mine);
  CHECK(std::find(mine->begin(), mine->end(), getgid()) != mine->end());
}
