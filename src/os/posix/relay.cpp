#include "os/relay.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

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
  int status = 0;
  while (waitpid(relay.pid, &status, 0) < 0 && errno == EINTR) {
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
  NotifierEnd end;
  int in[2];
  if (pipe2(in, O_CLOEXEC) != 0) {
    end.err = errno;
    return end;
  }
  const std::vector<std::string> argv{"/bin/sh", "-c", command};
  auto c_argv = c_strings(argv);
  auto c_env = c_strings(env);
  const pid_t pid = fork();
  if (pid < 0) {
    end.err = errno;
    ::close(in[0]);
    ::close(in[1]);
    return end;
  }
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGPIPE, SIG_DFL);
    if (dup2(in[0], 0) < 0) _exit(126);
    execve("/bin/sh", c_argv.data(), c_env.data());
    _exit(127);
  }
  setpgid(pid, pid);  // as the child does: no race with the KILL below
  ::close(in[0]);
  end.started = true;
  (void)write_all(in[1], input);
  ::close(in[1]);
  const Instant deadline = MonotonicClock::now() + timeout;
  for (;;) {
    const pid_t r = waitpid(pid, &end.status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (MonotonicClock::now() >= deadline) {
      end.timed_out = true;
      kill(-pid, SIGKILL);
      while (waitpid(pid, &end.status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    nap(std::chrono::milliseconds(5));
  }
  // What the notifier left in its group goes with it.
  kill(-pid, SIGKILL);
  return end;
}

}  // namespace looplock::sys
