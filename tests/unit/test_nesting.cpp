#include "records/nesting.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "os/ids.hpp"
#include "os/posix/procfs.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "testutil.hpp"

using looplock::EnvList;
using looplock::Pid;
using looplock::UniqueFd;
using testutil::TempDir;

namespace {

EnvList holder_env(const std::string& pid, const std::string& fd) {
  return {"PATH=/bin", "LOOPLOCK_HOLDER_PID=" + pid, "LOOPLOCK_HOLDER_FD=" + fd};
}
EnvList holder_env(Pid pid, int fd) { return holder_env(std::to_string(pid), std::to_string(fd)); }

struct Lock {
  UniqueFd dir;
  UniqueFd fd;
  looplock::sys::FileStatus st;
  explicit Lock(const TempDir& d, const char* name = ".state.lock") {
    dir.reset(::open(d.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    REQUIRE(dir);
    fd.reset(::openat(dir.get(), name, O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    REQUIRE(fd);
    REQUIRE(looplock::sys::status_of_fd(fd.get(), st));
  }
  // Another open file description of the same file.
  UniqueFd reopen() const {
    UniqueFd other(::openat(dir.get(), ".state.lock", O_RDONLY | O_CLOEXEC));
    REQUIRE(other);
    return other;
  }
};

std::optional<looplock::OuterHolder> outer(const EnvList& env, const Lock& l, bool exclusive, Pid self = getpid()) {
  return looplock::find_outer_holder(env, l.dir.get(), l.st, exclusive, self);
}

// Whether a fresh open file description could take the lock now.
bool free_now(const Lock& l, int op = LOCK_EX) {
  UniqueFd other = l.reopen();
  return flock(other.get(), op | LOCK_NB) == 0;
}

}  // namespace

TEST_CASE("no or garbage environment: no outer holder") {
  TempDir dir;
  Lock lock(dir);
  REQUIRE(flock(lock.fd.get(), LOCK_EX) == 0);
  const Pid self = getpid();
  const std::string fd = std::to_string(lock.fd.get());
  const std::string pid = std::to_string(self);

  CHECK_FALSE(outer({}, lock, true));
  CHECK_FALSE(outer({"LOOPLOCK_HOLDER_PID=" + pid}, lock, true));
  for (const auto& f :
       std::vector<std::string>{"", "x", fd + " ", " " + fd, "-1", "+" + fd, "99999999999999999999", "100000"}) {
    CAPTURE(f);
    CHECK_FALSE(outer(holder_env(pid, f), lock, true));
  }
  // The real values work (the control for the cases above).
  auto h = outer(holder_env(pid, fd), lock, true);
  REQUIRE(h);
  CHECK(h->pid == self);
  CHECK(h->fd == lock.fd.get());
  CHECK(h->inherited);
  // The pid does not matter when this process's own descriptor holds the
  // lock: it is inside the critical section whoever passed it on (and in
  // another pid namespace the number would mean nothing).
  h = outer(holder_env("garbage", fd), lock, true);
  REQUIRE(h);
  CHECK(h->pid == 0);
  // LOOPLOCK_FD is looked at too.
  h = outer({"LOOPLOCK_HOLDER_PID=" + pid, "LOOPLOCK_HOLDER_FD=100000", "LOOPLOCK_FD=" + fd}, lock, true);
  REQUIRE(h);
  CHECK(h->fd == lock.fd.get());
}

TEST_CASE("the lock must be held through that very descriptor") {
  TempDir dir;
  Lock lock(dir);
  Lock other(dir, "other");
  const Pid self = getpid();

  CHECK_FALSE(outer(holder_env(self, lock.fd.get()), lock, true));  // not locked yet
  REQUIRE(flock(lock.fd.get(), LOCK_EX) == 0);
  CHECK(outer(holder_env(self, lock.fd.get()), lock, true));
  CHECK(outer(holder_env(self, lock.fd.get()), lock, false));
  // Another file's fd, or asked about another file.
  CHECK_FALSE(outer(holder_env(self, other.fd.get()), lock, true));
  CHECK_FALSE(outer(holder_env(self, lock.fd.get()), other, true));
  // Shared: enough for a shared inner run, not for an exclusive one.
  REQUIRE(flock(lock.fd.get(), LOCK_SH) == 0);
  CHECK_FALSE(outer(holder_env(self, lock.fd.get()), lock, true));
  CHECK(outer(holder_env(self, lock.fd.get()), lock, false));
  // Released: a stale environment.
  REQUIRE(flock(lock.fd.get(), LOCK_UN) == 0);
  CHECK_FALSE(outer(holder_env(self, lock.fd.get()), lock, false));
  // Held, but through another open file description of the same file.
  UniqueFd holder = lock.reopen();
  REQUIRE(flock(holder.get(), LOCK_EX) == 0);
  CHECK_FALSE(outer(holder_env(self, lock.fd.get()), lock, true));
}

TEST_CASE("without the descriptor: the named holder must be a live ancestor holding it") {
  TempDir dir;
  Lock lock(dir);
  REQUIRE(flock(lock.fd.get(), LOCK_EX) == 0);
  const Pid self = getpid();

  // A child that holds the lock through a descriptor number this process
  // does not have: it is not our ancestor.
  constexpr int kChildFd = 200;
  REQUIRE(fcntl(kChildFd, F_GETFD) == -1);
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(p[1]);
    if (dup2(lock.fd.get(), kChildFd) < 0) _exit(1);
    char c;
    alarm(20);
    (void)!write(p[0], "", 0);
    (void)!read(p[0], &c, 1);
    _exit(0);
  }
  close(p[0]);
  auto child_has_fd = [&] {
    looplock::sys::FileStatus st;
    return looplock::sys::status_of_path(("/proc/" + std::to_string(child) + "/fd/" + std::to_string(kChildFd)), st);
  };
  for (int i = 0; i < 2000 && !child_has_fd(); ++i) usleep(1000);
  REQUIRE(child_has_fd());
  CHECK_FALSE(outer(holder_env(child, kChildFd), lock, true));
  close(p[1]);
  REQUIRE(testutil::wait_child(child));
  CHECK_FALSE(outer(holder_env(child, kChildFd), lock, true));  // and dead

  // From a grandchild that closed the descriptor, this process is the outer
  // holder (through its /proc entries).
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    Pid grandchild = fork();
    if (grandchild == 0) {
      const int fd = lock.fd.get();
      close(fd);
      auto h = looplock::find_outer_holder(holder_env(self, fd), lock.dir.get(), lock.st, true, getpid());
      char ok = h && h->pid == self && h->fd == fd && !h->inherited ? 'y' : 'n';
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

TEST_CASE("the probe used without /proc changes nothing and tells an exclusive holder") {
  TempDir dir;
  Lock lock(dir);
  // Free: not held through fd, and still free afterwards (nothing taken).
  CHECK_FALSE(looplock::probe_holds_through(lock.fd.get(), lock.dir.get(), lock.st));
  CHECK(free_now(lock));
  // Held exclusively through fd: yes, and still held.
  REQUIRE(flock(lock.fd.get(), LOCK_EX) == 0);
  CHECK(looplock::probe_holds_through(lock.fd.get(), lock.dir.get(), lock.st));
  CHECK_FALSE(free_now(lock, LOCK_SH));
  REQUIRE(flock(lock.fd.get(), LOCK_UN) == 0);
  // Held exclusively through another description: no, and fd took nothing.
  {
    UniqueFd holder = lock.reopen();
    REQUIRE(flock(holder.get(), LOCK_EX) == 0);
    CHECK_FALSE(looplock::probe_holds_through(lock.fd.get(), lock.dir.get(), lock.st));
    REQUIRE(flock(holder.get(), LOCK_UN) == 0);
    CHECK(free_now(lock));  // fd holds nothing
  }
  // Held shared through fd: not told (a shared inner run takes its own
  // shared lock), and the shared lock is untouched.
  REQUIRE(flock(lock.fd.get(), LOCK_SH) == 0);
  CHECK_FALSE(looplock::probe_holds_through(lock.fd.get(), lock.dir.get(), lock.st));
  CHECK_FALSE(free_now(lock, LOCK_EX));
  CHECK(free_now(lock, LOCK_SH));
}

TEST_CASE("an inherited deadline holds only while the looplock that set it is a live ancestor") {
  const auto start = looplock::sys::own_start();
  REQUIRE(start);
  const Pid self = getpid();
  auto owner = [](long long pid, const std::string& st) {
    return EnvList{"LOOPLOCK_DEADLINE=1700000000.000", "LOOPLOCK_DEADLINE_OWNER=" + std::to_string(pid) + ":" + st};
  };
  CHECK(looplock::deadline_owner_lives(owner(self, *start), self));  // this process: an ancestor of itself
  const Pid parent = getppid();
  if (auto ps = looplock::procfs::pid_start(parent)) CHECK(looplock::deadline_owner_lives(owner(parent, *ps), self));
  CHECK_FALSE(looplock::deadline_owner_lives(owner(self, *start + "0"), self));  // another start: a reused pid
  CHECK_FALSE(looplock::deadline_owner_lives(EnvList{"LOOPLOCK_DEADLINE=1700000000.000"}, self));  // no owner
  // A live process that is not an ancestor: a child.
  const Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  auto cs = looplock::procfs::pid_start(child);
  REQUIRE(cs);
  CHECK_FALSE(looplock::deadline_owner_lives(owner(child, *cs), self));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}
