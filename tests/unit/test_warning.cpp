#include "os/posix/warning.hpp"

#include <doctest/doctest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <ctime>
#include <algorithm>
#include <vector>

#include "os/ids.hpp"
#include "os/posix/procfs.hpp"

using looplock::Pid;

namespace {

volatile sig_atomic_t got = 0;

// A child in process group `pgid` (0: a new one of its own) that treats
// USR1 as `how` says ('c' catches, 'i' ignores, 'b' blocks, 'd' default),
// and exits 7 when a caught USR1 came. It reports ready through a pipe.
Pid child(Pid pgid, char how) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const Pid pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setpgid(0, pgid);
    struct sigaction sa {};
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = how == 'c' ? [](int) { got = 1; } : how == 'i' ? SIG_IGN : SIG_DFL;
    sigaction(SIGUSR1, &sa, nullptr);
    if (how == 'b') {
      sigset_t s;
      sigemptyset(&s);
      sigaddset(&s, SIGUSR1);
      sigprocmask(SIG_BLOCK, &s, nullptr);
    }
    (void)write(fds[1], "r", 1);
    for (int i = 0; i < 200 && !got; ++i) usleep(10'000);
    _exit(got ? 7 : 0);
  }
  close(fds[1]);
  char c;
  REQUIRE(read(fds[0], &c, 1) == 1);
  close(fds[0]);
  setpgid(pid, pgid == 0 ? pid : pgid);  // either side may set it first
  return pid;
}

int reap(Pid pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

}  // namespace

TEST_CASE("parse_signal_masks reads SigBlk, SigIgn and SigCgt") {
  const auto m = looplock::procfs::parse_signal_masks(
      "Name:\tpython3\nSigQ:\t0/63465\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n"
      "SigBlk:\t0000000000000200\nSigIgn:\t0000000001001000\nSigCgt:\t0000000180000202\n");
  REQUIRE(m);
  CHECK(m->catches(SIGUSR1));  // bit 9 of 0x...202
  CHECK(m->catches(SIGINT));   // bit 1
  CHECK_FALSE(m->catches(SIGUSR2));
  CHECK(m->blocked == 0x200);
  CHECK(m->ignored == 0x1001000);
  CHECK_FALSE(m->catches(0));
  CHECK_FALSE(m->catches(65));
  CHECK_FALSE(looplock::procfs::parse_signal_masks("SigBlk:\t0\nSigCgt:\t0\n"));  // no SigIgn
}

TEST_CASE("a warning pass sends the signal to each process of the group that catches it, once") {
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);  // as looplock is the job's
  const Pid leader = child(0, 'd');
  const Pid catcher = child(leader, 'c');
  const Pid ignorer = child(leader, 'i');
  const Pid blocker = child(leader, 'b');
  const Pid outsider = child(0, 'c');  // catches it, but in another group
  looplock::sys::GroupWarning w(getpid(), leader, SIGUSR1);
  REQUIRE(w.pass());
  CHECK(w.sent() == std::vector<Pid>{catcher});
  auto skipped = w.skipped();
  std::sort(skipped.begin(), skipped.end());
  std::vector<Pid> expected{leader, ignorer, blocker};
  std::sort(expected.begin(), expected.end());
  CHECK(skipped == expected);
  REQUIRE(w.pass());  // once: the catcher is not sent it again
  CHECK(w.sent() == std::vector<Pid>{catcher});
  CHECK(WEXITSTATUS(reap(catcher)) == 7);
  CHECK(WEXITSTATUS(reap(outsider)) == 0);
  for (Pid p : {leader, ignorer, blocker}) {
    kill(p, SIGKILL);
    reap(p);
  }
  CHECK_FALSE(looplock::sys::signal_in_group(catcher, leader, SIGUSR1));  // gone
}
