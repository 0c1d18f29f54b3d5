#include "os/relay.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "os/clock.hpp"
#include "os/sys.hpp"

namespace looplock::sys {

namespace {

// A child's signals as a fresh process has them: none blocked, every
// disposition the default (looplock takes its own signals for the run).
void plain_signals() {
  sigset_t none;
  sigemptyset(&none);
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
  }
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::optional<Relay> start_relay(const std::function<int(int events)>& body) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    errno = err;
    return std::nullopt;
  }
  if (pid == 0) {
    ::close(fds[1]);
    setpgid(0, 0);
    plain_signals();
    signal(SIGPIPE, SIG_IGN);  // a notifier that does not read its event
    _exit(body(fds[0]));
  }
  ::close(fds[0]);
  // Room for the events of a run while a notifier is slow (1 MiB where the
  // system allows it; 64 KiB otherwise).
  (void)fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
  return Relay{UniqueFd(fds[1]), pid};
}

void finish_relay(Relay& relay) {
  relay.events.reset();
  if (relay.pid <= 0) return;
  sigset_t ending;
  sigemptyset(&ending);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&ending, s);
  for (int status = 0;;) {
    const pid_t r = waitpid(relay.pid, &status, WNOHANG);
    if (r == relay.pid || (r < 0 && errno != EINTR)) break;
    sigset_t pending;
    if (sigpending(&pending) == 0) {
      bool asked = false;
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) asked = asked || sigismember(&pending, s) == 1;
      if (asked) break;  // the relay delivers the rest on its own
    }
    nap(std::chrono::milliseconds(10));
  }
  relay.pid = 0;
}

bool wait_readable(int fd, Deadline until) {
  for (;;) {
    int ms = -1;
    if (until) {
      const Duration left = *until - MonotonicClock::now();
      if (left <= Duration::zero()) return false;
      ms = static_cast<int>(std::min<long long>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), 1 << 30));
    }
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, ms);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the read say what is wrong
  }
}

std::optional<std::string> read_some(int fd, size_t limit) {
  std::string buf(limit, '\0');
  const ssize_t n = retry_eintr([&] { return ::read(fd, buf.data(), buf.size()); });
  if (n < 0) return std::nullopt;
  buf.resize(static_cast<size_t>(n));
  return buf;
}

NotifierEnd run_notifier(const std::string& command, const std::vector<std::string>& env, const std::string& input,
                         Duration timeout) {
  constexpr size_t kKept = 1024;
  NotifierEnd end;
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) {
    end.err = errno;
    return end;
  }
  if (pipe2(out, O_CLOEXEC | O_NONBLOCK) != 0) {
    end.err = errno;
    ::close(in[0]);
    ::close(in[1]);
    return end;
  }
  const std::vector<std::string> argv{"/bin/sh", "-c", command};
  auto c_argv = c_strings(argv);
  auto c_env = c_strings(env);
  const pid_t pid = fork();
  if (pid < 0) {
    end.err = errno;
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    return end;
  }
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGPIPE, SIG_DFL);
    const int flags = fcntl(out[1], F_GETFL);
    if (flags >= 0) (void)fcntl(out[1], F_SETFL, flags & ~O_NONBLOCK);
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(out[1], 2) < 0) _exit(126);
    execve("/bin/sh", c_argv.data(), c_env.data());
    _exit(127);
  }
  setpgid(pid, pid);  // as the child does: no race with the KILL below
  ::close(in[0]);
  ::close(out[1]);
  end.started = true;
  (void)write_all(in[1], input);
  ::close(in[1]);
  const Deadline deadline = later(MonotonicClock::now(), timeout);  // saturates: kForever never comes
  auto drain = [&] {
    char buf[4096];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) {
      end.output.append(buf, static_cast<size_t>(n));
      if (end.output.size() > kKept) end.output.erase(0, end.output.size() - kKept);
    }
  };
  for (;;) {
    drain();
    const pid_t r = waitpid(pid, &end.status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (deadline && MonotonicClock::now() >= *deadline) {
      end.timed_out = true;
      kill(-pid, SIGKILL);
      while (waitpid(pid, &end.status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    (void)poll(&p, 1, 5);
  }
  drain();
  ::close(out[0]);
  // What the notifier left in its group goes with it.
  kill(-pid, SIGKILL);
  return end;
}

}  // namespace looplock::sys
