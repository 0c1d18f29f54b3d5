#include "os/sys.hpp"
#include "records/lockfile.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "os/ids.hpp"
#include "os/unique_fd.hpp"
#include "testutil.hpp"

using looplock::AcquireResult;
using looplock::Acquisition;
using looplock::Fatal;
using looplock::LockDir;
using looplock::LockFile;
using looplock::LockMode;
using looplock::Pid;
using looplock::UniqueFd;
using looplock::WaitPlan;
using testutil::TempDir;

namespace {

using namespace std::chrono_literals;

looplock::WaitPlan plan_of(looplock::WaitPlan::Kind kind, looplock::Duration timeout) { return {kind, timeout}; }

struct CountingObserver : looplock::AcquireObserver {
  int waits = 0;
  int replaced = 0;
  std::function<void()> on_wait_hook;
  void on_wait(const LockFile&) override {
    ++waits;
    if (on_wait_hook) on_wait_hook();
  }
  void on_replaced(int count, bool /*dir_moved*/) override { replaced = count; }
};

int fatal_status(const std::function<void()>& f) {
  try {
    f();
  } catch (const Fatal& e) {
    return e.status();
  }
  return -1;
}

// Another open file description of the lock file, holding flock(2) `op`.
UniqueFd hold(const std::string& path, int op) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  REQUIRE(fd);
  REQUIRE(flock(fd.get(), op | LOCK_NB) == 0);
  return fd;
}

// Whether someone else holds the lock: a fresh open file description cannot take it.
bool lock_taken(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd);
  if (flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return false;
  REQUIRE(errno == EWOULDBLOCK);
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A helper thread that must never take the process's SIGALRM (the deadline
// timer's signal is for the waiting thread).
std::thread quiet_thread(std::function<void()> f) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  std::thread t(std::move(f));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return t;
}

}  // namespace

TEST_CASE("open_lock_dir") {
  TempDir dir;
  SUBCASE("an ordinary directory") {
    LockDir d = looplock::open_lock_dir(dir.path());
    CHECK(d.path == dir.path());
    CHECK(d.fd.get() >= 3);
    CHECK(S_ISDIR(d.st.mode));
  }
  SUBCASE("missing: 66") {
    CHECK(fatal_status([&] { looplock::open_lock_dir(dir / "missing"); }) == 66);
    CHECK(fatal_status([&] { looplock::open_lock_dir(dir / "missing", false); }) == 66);
  }
  SUBCASE("a file: 66") {
    testutil::write_file(dir / "file", "x");
    CHECK(fatal_status([&] { looplock::open_lock_dir(dir / "file"); }) == 66);
  }
  SUBCASE("empty path: 66") {
    CHECK(fatal_status([&] { looplock::open_lock_dir(""); }) == 66);
  }
  SUBCASE("world-writable without the sticky bit: 73") {
    REQUIRE(mkdir((dir / "ww").c_str(), 0755) == 0);
    REQUIRE(chmod((dir / "ww").c_str(), 0777) == 0);
    CHECK(fatal_status([&] { looplock::open_lock_dir(dir / "ww"); }) == 73);
    // --inspect only reads: it opens it anyway.
    LockDir d = looplock::open_lock_dir(dir / "ww", /*check_safety=*/false);
    CHECK(d.fd);
  }
  SUBCASE("world-writable with the sticky bit is fine") {
    REQUIRE(mkdir((dir / "sticky").c_str(), 0755) == 0);
    REQUIRE(chmod((dir / "sticky").c_str(), 01777) == 0);
    CHECK(looplock::open_lock_dir(dir / "sticky").fd);
  }
  SUBCASE("a symlink to a directory is followed") {
    REQUIRE(symlink(dir.path().c_str(), (dir / "link").c_str()) == 0);
    CHECK(looplock::open_lock_dir(dir / "link").fd);
  }
}

TEST_CASE("dir_mode_unsafe") {
  CHECK(looplock::dir_mode_unsafe(0777));
  CHECK(looplock::dir_mode_unsafe(0757));
  CHECK(looplock::dir_mode_unsafe(0002));
  CHECK_FALSE(looplock::dir_mode_unsafe(01777));
  CHECK_FALSE(looplock::dir_mode_unsafe(0775));
  CHECK_FALSE(looplock::dir_mode_unsafe(0755));
  CHECK_FALSE(looplock::dir_mode_unsafe(0700));
}

TEST_CASE("open_lock_file creates a 0660 regular file (other users cannot open it) and never truncates") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  const std::string path = dir / ".state.lock";
  mode_t old = umask(0);
  LockFile f = looplock::open_lock_file(d);
  umask(old);
  CHECK(f.fd.get() >= 3);
  CHECK_FALSE(f.read_only);
  looplock::sys::FileStatus st;
  REQUIRE(looplock::sys::status_at(AT_FDCWD, path.c_str(), st));
  CHECK(S_ISREG(st.mode));
  CHECK((st.mode & 07777) == 0660);
  CHECK(st.size == 0);
  CHECK(st.inode == f.st.inode);
  CHECK((fcntl(f.fd.get(), F_GETFD) & FD_CLOEXEC) != 0);

  // Opening an existing file keeps its content (the previous record).
  testutil::write_file(path, "previous record\n");
  LockFile again = looplock::open_lock_file(d);
  CHECK(again.st.inode == st.inode);
  CHECK(testutil::slurp(path) == "previous record\n");
  CHECK(looplock::lock_path_intact(d, again) == true);
}

TEST_CASE("open_lock_file refuses unsafe lock paths with 73") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  const std::string path = dir / ".state.lock";
  auto open_status = [&] { return fatal_status([&] { looplock::open_lock_file(d); }); };

  SUBCASE("symlink to a regular file") {
    testutil::write_file(dir / "target", "keep");
    REQUIRE(symlink("target", path.c_str()) == 0);
    CHECK(open_status() == 73);
    CHECK(testutil::slurp(dir / "target") == "keep");
  }
  SUBCASE("dangling symlink") {
    REQUIRE(symlink("nowhere", path.c_str()) == 0);
    CHECK(open_status() == 73);
    CHECK(access((dir / "nowhere").c_str(), F_OK) != 0);
  }
  SUBCASE("directory") {
    REQUIRE(mkdir(path.c_str(), 0755) == 0);
    CHECK(open_status() == 73);
  }
  SUBCASE("FIFO (and no hang)") {
    REQUIRE(mkfifo(path.c_str(), 0644) == 0);
    CHECK(open_status() == 73);
  }
  SUBCASE("two hard links") {
    testutil::write_file(path, "");
    REQUIRE(link(path.c_str(), (dir / "other-name").c_str()) == 0);
    CHECK(open_status() == 73);
  }
  SUBCASE("owned by neither the caller nor DIR's owner") {
    if (geteuid() != 0) {
      MESSAGE("not root: cannot chown, skipped");
      return;
    }
    testutil::write_file(path, "");
    REQUIRE(chown(path.c_str(), 54321, 54321) == 0);
    CHECK(open_status() == 73);
    // Owned by DIR's owner: trusted.
    REQUIRE(chown(dir.path().c_str(), 54321, 54321) == 0);
    LockDir d2 = looplock::open_lock_dir(dir.path());
    CHECK(looplock::open_lock_file(d2).fd);
  }
}

TEST_CASE("descriptors are moved above stdin, stdout and stderr") {
  TempDir dir;
  // In a child, with 0, 1 and 2 closed, so that open() would return them.
  Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(0);
    close(1);
    close(2);
    int code = 0;
    try {
      LockDir d = looplock::open_lock_dir(dir.path());
      if (d.fd.get() < 3) code |= 1;
      LockFile f = looplock::open_lock_file(d);
      if (f.fd.get() < 3) code |= 2;
      // The descriptors that were tried on the way are not left open.
      if (fcntl(0, F_GETFD) != -1 || fcntl(1, F_GETFD) != -1 || fcntl(2, F_GETFD) != -1) code |= 4;
    } catch (...) {
      code |= 8;
    }
    _exit(code);
  }
  auto status = testutil::wait_child(child);
  REQUIRE(status);
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
}

TEST_CASE("acquire_lock on a free lock") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  const std::string path = dir / ".state.lock";
  for (WaitPlan plan : {plan_of(WaitPlan::Kind::Bounded, 0ms), plan_of(WaitPlan::Kind::Bounded, 5000ms),
                        plan_of(WaitPlan::Kind::NoWait, 0ms), plan_of(WaitPlan::Kind::Unbounded, 0ms)}) {
    CountingObserver obs;
    AcquireResult r = looplock::acquire_lock(d, plan, LockMode::Exclusive, obs, looplock::MonotonicClock::now());
    REQUIRE(r.status == Acquisition::Acquired);
    CHECK(r.file.fd);
    CHECK(r.replaced == 0);
    CHECK(obs.waits == 0);
    CHECK(r.waited >= 0ms);
    CHECK(r.waited < 2000ms);
    CHECK(lock_taken(path));
    CHECK(looplock::lock_path_intact(d, r.file) == true);
    r.file.fd.reset();
    CHECK_FALSE(lock_taken(path));
  }
}

TEST_CASE("acquire_lock while another open file description holds the lock") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  const std::string path = dir / ".state.lock";
  UniqueFd holder = hold(path, LOCK_EX);

  SUBCASE("NoWait: Busy at once, the file is returned for reading the holder") {
    CountingObserver obs;
    auto t0 = std::chrono::steady_clock::now();
    AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::NoWait, 0ms), LockMode::Exclusive, obs,
                                             looplock::MonotonicClock::now());
    CHECK(r.status == Acquisition::Busy);
    CHECK(seconds_since(t0) < 1.0);
    CHECK(r.file.fd);
    CHECK(obs.waits == 0);
    looplock::sys::FileStatus st;
    REQUIRE(looplock::sys::status_of_path(path, st));
    CHECK(r.file.st.inode == st.inode);
  }
  SUBCASE("Bounded 0: one attempt, TimedOut at once") {
    CountingObserver obs;
    auto t0 = std::chrono::steady_clock::now();
    AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::Bounded, 0ms), LockMode::Exclusive, obs,
                                             looplock::MonotonicClock::now());
    CHECK(r.status == Acquisition::TimedOut);
    CHECK(seconds_since(t0) < 1.0);
    CHECK(obs.waits == 0);
    CHECK(r.file.fd);
  }
  SUBCASE("Bounded 100 ms: TimedOut after the deadline, on_wait once") {
    CountingObserver obs;
    auto t0 = std::chrono::steady_clock::now();
    AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::Bounded, 100ms), LockMode::Exclusive, obs,
                                             looplock::MonotonicClock::now());
    double took = seconds_since(t0);
    CHECK(r.status == Acquisition::TimedOut);
    CHECK(took >= 0.09);
    CHECK(took < 2.0);
    CHECK(r.waited >= 90ms);
    CHECK(obs.waits == 1);
    CHECK(obs.replaced == 0);
    CHECK(r.file.fd);
  }
  SUBCASE("Shared against an exclusive holder: Busy") {
    CountingObserver obs;
    AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::NoWait, 0ms), LockMode::Shared, obs,
                                             looplock::MonotonicClock::now());
    CHECK(r.status == Acquisition::Busy);
  }
  CHECK(lock_taken(path));  // the holder still holds it
}

TEST_CASE("shared locks coexist; exclusive waits for them") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  const std::string path = dir / ".state.lock";
  UniqueFd reader = hold(path, LOCK_SH);
  CountingObserver obs;
  AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::Bounded, 0ms), LockMode::Shared, obs,
                                           looplock::MonotonicClock::now());
  CHECK(r.status == Acquisition::Acquired);
  AcquireResult x = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::Bounded, 0ms), LockMode::Exclusive, obs,
                                           looplock::MonotonicClock::now());
  CHECK(x.status == Acquisition::TimedOut);
}

TEST_CASE("a waiter takes the lock as soon as it is released") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  const std::string path = dir / ".state.lock";

  for (WaitPlan plan : {plan_of(WaitPlan::Kind::Bounded, 10'000ms), plan_of(WaitPlan::Kind::Unbounded, 0ms)}) {
    UniqueFd holder = hold(path, LOCK_EX);
    std::thread releaser;
    CountingObserver obs;
    // Released while the waiter waits (after it said so): no sleep decides the order.
    obs.on_wait_hook = [&] {
      releaser = quiet_thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        holder.reset();
      });
    };
    auto t0 = std::chrono::steady_clock::now();
    AcquireResult r = looplock::acquire_lock(d, plan, LockMode::Exclusive, obs, looplock::MonotonicClock::now());
    double took = seconds_since(t0);
    if (releaser.joinable()) releaser.join();
    CHECK(r.status == Acquisition::Acquired);
    CHECK(obs.waits == 1);
    CHECK(took >= 0.04);
    CHECK(took < 5.0);  // the deadline is 10 s: it did not wait for it
    CHECK(r.waited >= 40ms);
  }
}

TEST_CASE("the deadline holds with SIGALRM blocked or ignored, and the signal state is restored") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  UniqueFd holder = hold(dir / ".state.lock", LOCK_EX);

  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  struct sigaction saved {};
  REQUIRE(sigaction(SIGALRM, &ign, &saved) == 0);
  sigset_t alrm, old_mask;
  sigemptyset(&alrm);
  sigaddset(&alrm, SIGALRM);
  REQUIRE(sigprocmask(SIG_BLOCK, &alrm, &old_mask) == 0);

  CountingObserver obs;
  auto t0 = std::chrono::steady_clock::now();
  AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::Bounded, 150ms), LockMode::Exclusive, obs,
                                           looplock::MonotonicClock::now());
  double took = seconds_since(t0);

  struct sigaction after {};
  sigaction(SIGALRM, nullptr, &after);
  sigset_t mask_after;
  sigprocmask(SIG_BLOCK, nullptr, &mask_after);
  sigset_t pending;
  sigpending(&pending);
  bool alrm_pending = sigismember(&pending, SIGALRM);

  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGALRM, &saved, nullptr);

  CHECK(r.status == Acquisition::TimedOut);
  CHECK(took >= 0.14);
  CHECK(took < 2.0);
  CHECK((after.sa_handler == SIG_IGN));
  CHECK(sigismember(&mask_after, SIGALRM));
  CHECK_FALSE(alrm_pending);
}

TEST_CASE("the deadline holds with a SA_RESTART SIGALRM handler installed") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  UniqueFd holder = hold(dir / ".state.lock", LOCK_EX);
  static int calls = 0;
  struct sigaction restart {};
  restart.sa_handler = [](int) { ++calls; };
  restart.sa_flags = SA_RESTART;
  sigemptyset(&restart.sa_mask);
  struct sigaction saved {};
  REQUIRE(sigaction(SIGALRM, &restart, &saved) == 0);
  CountingObserver obs;
  auto t0 = std::chrono::steady_clock::now();
  AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::Bounded, 150ms), LockMode::Exclusive, obs,
                                           looplock::MonotonicClock::now());
  double took = seconds_since(t0);
  struct sigaction after {};
  sigaction(SIGALRM, &saved, &after);
  CHECK(r.status == Acquisition::TimedOut);
  CHECK(took < 2.0);
  CHECK((after.sa_handler == restart.sa_handler));  // the caller's handler is back
}

TEST_CASE("lock_path_intact and dir_intact") {
  TempDir dir;
  REQUIRE(mkdir((dir / "loop").c_str(), 0755) == 0);
  LockDir d = looplock::open_lock_dir(dir / "loop");
  const std::string path = dir / "loop/.state.lock";
  CountingObserver obs;
  AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::Bounded, 0ms), LockMode::Exclusive, obs,
                                           looplock::MonotonicClock::now());
  REQUIRE(r.status == Acquisition::Acquired);
  CHECK(looplock::lock_path_intact(d, r.file) == true);
  CHECK(looplock::dir_intact(d) == true);

  SUBCASE("unlinked") {
    REQUIRE(unlink(path.c_str()) == 0);
    CHECK(looplock::lock_path_intact(d, r.file) == false);
    testutil::write_file(path, "");  // recreated: another inode
    CHECK(looplock::lock_path_intact(d, r.file) == false);
  }
  SUBCASE("replaced by rename") {
    testutil::write_file(dir / "loop/new", "");
    REQUIRE(rename((dir / "loop/new").c_str(), path.c_str()) == 0);
    CHECK(looplock::lock_path_intact(d, r.file) == false);
  }
  SUBCASE("directory renamed") {
    REQUIRE(rename((dir / "loop").c_str(), (dir / "moved").c_str()) == 0);
    CHECK(looplock::dir_intact(d) == false);
    REQUIRE(mkdir((dir / "loop").c_str(), 0755) == 0);  // another directory at the path
    CHECK(looplock::dir_intact(d) == false);
  }
  SUBCASE("directory removed") {
    r.file.fd.reset();
    REQUIRE(unlink(path.c_str()) == 0);
    REQUIRE(rmdir((dir / "loop").c_str()) == 0);
    CHECK(looplock::dir_intact(d) == false);
  }
}

TEST_CASE("a lock file replaced while waited for is retaken on the new file") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  const std::string path = dir / ".state.lock";
  UniqueFd holder = hold(path, LOCK_EX);
  std::thread replacer;
  CountingObserver obs;
  obs.on_wait_hook = [&] {
    replacer = quiet_thread([&] {
      // Replace the file under the waiter, then release the old inode: the
      // waiter locks an orphan and must notice.
      testutil::write_file(dir / "fresh", "");
      rename((dir / "fresh").c_str(), path.c_str());
      holder.reset();
    });
  };
  AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::Bounded, 5000ms), LockMode::Exclusive, obs,
                                           looplock::MonotonicClock::now());
  if (replacer.joinable()) replacer.join();
  REQUIRE(r.status == Acquisition::Acquired);
  CHECK(r.replaced == 1);
  CHECK(obs.replaced == 1);
  looplock::sys::FileStatus st;
  REQUIRE(looplock::sys::status_of_path(path, st));
  CHECK(r.file.st.inode == st.inode);
  CHECK(looplock::lock_path_intact(d, r.file) == true);
  CHECK(lock_taken(path));
}

TEST_CASE("an EINTR storm does not stretch the deadline") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  UniqueFd holder = hold(dir / ".state.lock", LOCK_EX);

  // A handler without SA_RESTART: every signal interrupts flock(2).
  static volatile sig_atomic_t seen = 0;
  struct sigaction h {};
  h.sa_handler = [](int) { seen = seen + 1; };
  sigemptyset(&h.sa_mask);
  struct sigaction saved {};
  REQUIRE(sigaction(SIGUSR1, &h, &saved) == 0);

  const Pid target = getpid();
  Pid storm = fork();
  REQUIRE(storm >= 0);
  if (storm == 0) {
    alarm(20);
    for (;;) {
      kill(target, SIGUSR1);
      usleep(200);
    }
  }
  CountingObserver obs;
  auto t0 = std::chrono::steady_clock::now();
  AcquireResult r = looplock::acquire_lock(d, plan_of(WaitPlan::Kind::Bounded, 300ms), LockMode::Exclusive, obs,
                                           looplock::MonotonicClock::now());
  double took = seconds_since(t0);
  kill(storm, SIGKILL);
  testutil::wait_child(storm);
  sigaction(SIGUSR1, &saved, nullptr);

  CHECK(r.status == Acquisition::TimedOut);
  CHECK(took >= 0.29);
  CHECK(took < 2.0);
  CHECK(seen > 0);  // the storm did reach this process
}


TEST_CASE("the umask applies to the lock file's 0660, and an existing file's mode is never changed") {
  TempDir dir;
  LockDir d = looplock::open_lock_dir(dir.path());
  const std::string path = dir / ".state.lock";
  mode_t old = umask(027);
  { LockFile f = looplock::open_lock_file(d); }
  umask(old);
  looplock::sys::FileStatus st;
  REQUIRE(looplock::sys::status_at(AT_FDCWD, path.c_str(), st));
  CHECK((st.mode & 07777) == 0640);
  REQUIRE(chmod(path.c_str(), 0644) == 0);
  { LockFile f = looplock::open_lock_file(d); }
  REQUIRE(looplock::sys::status_at(AT_FDCWD, path.c_str(), st));
  CHECK((st.mode & 07777) == 0644);
}

TEST_CASE("refuse_lock_file: the rules a run and --inspect share") {
  looplock::sys::FileStatus dir;
  dir.mode = S_IFDIR | 0755;
  dir.owner = 1000;
  looplock::sys::FileStatus f;
  f.mode = S_IFREG | 0660;
  f.links = 1;
  f.owner = 1000;
  CHECK_FALSE(looplock::refuse_lock_file(f, dir, 1000));
  CHECK_FALSE(looplock::refuse_lock_file(f, dir, 0));  // DIR's owner's file, for root too
  f.owner = 0;
  CHECK_FALSE(looplock::refuse_lock_file(f, dir, 0));  // the caller's own
  f.owner = 2000;
  auto r = looplock::refuse_lock_file(f, dir, 0);
  REQUIRE(r);
  CHECK(r->why == "it is owned by uid 2000, neither you nor DIR's owner");
  CHECK(r->event == "unsafe_lock_file");
  f.owner = 1000;
  f.links = 2;
  r = looplock::refuse_lock_file(f, dir, 1000);
  REQUIRE(r);
  CHECK(r->why == "it has 2 hard links; a lock file must have exactly one");
  f.links = 1;
  f.mode = S_IFLNK | 0777;
  CHECK(looplock::refuse_lock_file(f, dir, 1000)->why.find("symbolic link") != std::string::npos);
  f.mode = S_IFIFO | 0644;
  CHECK(looplock::refuse_lock_file(f, dir, 1000)->why == "it is a FIFO, not a regular file");
  dir.mode = S_IFDIR | 0777;
  auto d = looplock::refuse_dir(dir, "D");
  REQUIRE(d);
  CHECK(d->event == "unsafe_loop_dir");
  CHECK(d->hint.find("chmod o-w D") != std::string::npos);
  dir.mode = S_IFDIR | 01777;
  CHECK_FALSE(looplock::refuse_dir(dir, "D"));
}
