#include "nesting.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "testutil.hpp"
#include "unique_fd.hpp"

using looplock::EnvList;
using looplock::UniqueFd;
using testutil::TempDir;

namespace {

EnvList holder_env(const std::string& pid, const std::string& fd) {
  return {"PATH=/bin", "LOOPLOCK_HOLDER_PID=" + pid, "LOOPLOCK_HOLDER_FD=" + fd};
}
EnvList holder_env(pid_t pid, int fd) { return holder_env(std::to_string(pid), std::to_string(fd)); }

struct Lock {
  UniqueFd fd;
  struct stat st {};
  explicit Lock(const std::string& path) {
    fd.reset(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    REQUIRE(fd);
    REQUIRE(fstat(fd.get(), &st) == 0);
  }
};

}  // namespace

TEST_CASE("no or garbage environment: no outer holder") {
  TempDir dir;
  Lock lock(dir / ".state.lock");
  REQUIRE(flock(lock.fd.get(), LOCK_EX) == 0);
  const pid_t self = getpid();
  const std::string fd = std::to_string(lock.fd.get());
  const std::string pid = std::to_string(self);

  CHECK_FALSE(looplock::find_outer_holder({}, lock.st, true, self));
  CHECK_FALSE(looplock::find_outer_holder({"LOOPLOCK_HOLDER_PID=" + pid}, lock.st, true, self));
  CHECK_FALSE(looplock::find_outer_holder({"LOOPLOCK_HOLDER_FD=" + fd}, lock.st, true, self));
  for (const auto& [p, f] : std::vector<std::pair<std::string, std::string>>{
           {"", fd}, {pid, ""}, {"abc", fd}, {pid, "x"}, {pid + "x", fd}, {pid, fd + " "}, {" " + pid, fd},
           {"-" + pid, fd}, {pid, "-1"}, {"0", fd}, {"+" + pid, fd}, {"99999999999999999999", fd}}) {
    CAPTURE(p);
    CAPTURE(f);
    CHECK_FALSE(looplock::find_outer_holder(holder_env(p, f), lock.st, true, self));
  }
  // The real values work (the control for the cases above).
  auto h = looplock::find_outer_holder(holder_env(pid, fd), lock.st, true, self);
  REQUIRE(h);
  CHECK(h->pid == self);
  CHECK(h->fd == lock.fd.get());
}

TEST_CASE("the holder must hold this very lock on that fd") {
  TempDir dir;
  Lock lock(dir / ".state.lock");
  Lock other(dir / "other");
  const pid_t self = getpid();

  // Not locked yet.
  CHECK_FALSE(looplock::find_outer_holder(holder_env(self, lock.fd.get()), lock.st, true, self));
  REQUIRE(flock(lock.fd.get(), LOCK_EX) == 0);
  CHECK(looplock::find_outer_holder(holder_env(self, lock.fd.get()), lock.st, true, self));
  CHECK(looplock::find_outer_holder(holder_env(self, lock.fd.get()), lock.st, false, self));
  // Another file's fd, or asked about another file.
  CHECK_FALSE(looplock::find_outer_holder(holder_env(self, other.fd.get()), lock.st, true, self));
  CHECK_FALSE(looplock::find_outer_holder(holder_env(self, lock.fd.get()), other.st, true, self));
  // A closed fd number.
  CHECK_FALSE(looplock::find_outer_holder(holder_env(self, 100000), lock.st, true, self));
  // Shared: enough for a shared inner run, not for an exclusive one.
  REQUIRE(flock(lock.fd.get(), LOCK_SH) == 0);
  CHECK_FALSE(looplock::find_outer_holder(holder_env(self, lock.fd.get()), lock.st, true, self));
  CHECK(looplock::find_outer_holder(holder_env(self, lock.fd.get()), lock.st, false, self));
  // Released: a stale environment.
  REQUIRE(flock(lock.fd.get(), LOCK_UN) == 0);
  CHECK_FALSE(looplock::find_outer_holder(holder_env(self, lock.fd.get()), lock.st, false, self));
}

TEST_CASE("the holder must be a live ancestor") {
  TempDir dir;
  Lock lock(dir / ".state.lock");
  REQUIRE(flock(lock.fd.get(), LOCK_EX) == 0);
  const pid_t self = getpid();

  // A child that shares the locked open file description: it holds the lock
  // too, but it is not our ancestor.
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(p[1]);
    char c;
    alarm(20);
    (void)!read(p[0], &c, 1);
    _exit(0);
  }
  close(p[0]);
  CHECK_FALSE(looplock::find_outer_holder(holder_env(child, lock.fd.get()), lock.st, true, self));
  close(p[1]);
  REQUIRE(testutil::wait_child(child));
  // Dead pid.
  CHECK_FALSE(looplock::find_outer_holder(holder_env(child, lock.fd.get()), lock.st, true, self));

  // From a grandchild, this process is the outer holder.
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    pid_t grandchild = fork();
    if (grandchild == 0) {
      auto h = looplock::find_outer_holder(holder_env(self, lock.fd.get()), lock.st, true, getpid());
      char ok = h && h->pid == self && h->fd == lock.fd.get() ? 'y' : 'n';
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
