#include "os/hold_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstring>

#include "os/digest.hpp"
#include "os/posix/procfs.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"

namespace looplock::sys {

namespace {

// TERM, INT and HUP, blocked and read from a signalfd while a hold's
// processes wait; the old mask comes back when it goes.
class EndSignals {
public:
  EndSignals() {
    sigemptyset(&set_);
    for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set_, s);
    sigset_t blocked = set_;
    sigaddset(&blocked, SIGPIPE);  // a write to a pipe nobody reads: EPIPE instead
    sigprocmask(SIG_BLOCK, &blocked, &old_);
    fd_.reset(signalfd(-1, &set_, SFD_CLOEXEC | SFD_NONBLOCK));
  }
  ~EndSignals() {
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    const timespec none{0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &none) == SIGPIPE) {
    }
    sigprocmask(SIG_SETMASK, &old_, nullptr);
  }
  EndSignals(const EndSignals&) = delete;
  EndSignals& operator=(const EndSignals&) = delete;

  int fd() const { return fd_.get(); }
  // The signal that arrived, or 0.
  int take() const {
    signalfd_siginfo info{};
    if (read(fd_.get(), &info, sizeof info) != static_cast<ssize_t>(sizeof info)) return 0;
    return static_cast<int>(info.ssi_signo);
  }

private:
  sigset_t set_{};
  sigset_t old_{};
  UniqueFd fd_;
};

UniqueFd open_pidfd(Pid pid) { return UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))); }

}  // namespace

std::optional<Detached> detach_holder() {
  int ends[2];
  if (pipe2(ends, O_CLOEXEC) != 0) return std::nullopt;
  UniqueFd read_end(ends[0]);
  UniqueFd write_end(ends[1]);
  // Above stdio: with 0, 1 or 2 closed, the pipe could have taken them.
  if (write_end.get() < 3) write_end.reset(fcntl(write_end.get(), F_DUPFD_CLOEXEC, 3));
  if (!write_end) return std::nullopt;
  const pid_t pid = fork();
  if (pid < 0) return std::nullopt;
  if (pid > 0) return Detached{pid, std::move(read_end)};
  read_end.reset();
  // The child: nothing it does may stop at the caller's terminal, its
  // session or its working directory (which could then not be unmounted),
  // and it keeps none of the caller's descriptors but stderr (a pipe a
  // caller reads to its end would else wait for the hold).
  if (setsid() < 0 || chdir("/") != 0) _exit(71);
  // (Not owned: with stdin closed it is 0 itself; close_range() below
  // closes it when it is not.)
  const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null < 0 || (null != 0 && dup2(null, 0) < 0) || (null != 1 && dup2(null, 1) < 0)) _exit(71);
  const unsigned keep = static_cast<unsigned>(write_end.get());
  if (keep > 3) syscall(SYS_close_range, 3U, keep - 1, 0U);
  syscall(SYS_close_range, keep + 1, ~0U, 0U);
  return Detached{0, std::move(write_end)};
}

bool quiet_stderr() {
  const UniqueFd null(open("/dev/null", O_RDWR | O_CLOEXEC));
  return null && dup2(null.get(), 2) >= 0;
}

HolderReport await_holder(Pid child, int report_fd, int tie, const std::function<int(const std::string&)>& deliver) {
  HolderReport out;
  const EndSignals signals;
  std::string got;
  for (;;) {
    pollfd fds[3] = {{report_fd, POLLIN, 0}, {signals.fd(), POLLIN, 0}, {out.tie_ended ? -1 : tie, POLLIN, 0}};
    if (retry_eintr([&] { return poll(fds, 3, -1); }) < 0) break;
    if (fds[2].revents & (POLLIN | POLLHUP)) {
      out.tie_ended = true;  // a hold that would end at once: none
      kill(child, SIGTERM);
    }
    if (fds[1].revents & POLLIN) {
      if (const int s = signals.take(); s != 0) {
        if (out.signal == 0) out.signal = s;
        kill(child, SIGTERM);
      }
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char buf[512];
    const ssize_t n = retry_eintr([&] { return read(report_fd, buf, sizeof buf); });
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    if (got.find('\n') == std::string::npos) continue;
    out.line = got.substr(0, got.find('\n'));
    // Told to end meanwhile, or the line goes nowhere: nobody could know
    // the value, so no hold.
    if (out.signal == 0 && !out.tie_ended) out.deliver_err = deliver(*out.line);
    if (out.signal != 0 || out.tie_ended || out.deliver_err != 0) stop_holder(child);
    return out;
  }
  int status = 0;
  if (retry_eintr([&] { return waitpid(child, &status, 0); }) == child) out.wait_status = status;
  return out;
}

void stop_holder(Pid child) {
  kill(child, SIGTERM);
  int status = 0;
  (void)retry_eintr([&] { return waitpid(child, &status, 0); });
}

namespace {

// The abstract socket of a hold: in this network namespace, never a file,
// named after the secret, so that nobody who lacks it can take the name
// first.
sockaddr_un hold_socket_name(const std::string& key, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = "looplock/hold/" + key;
  a.sun_path[0] = '\0';
  const size_t n = std::min(name.size(), sizeof a.sun_path - 2);
  name.copy(a.sun_path + 1, n);
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

// One message of `size` bytes at `data` with room for one descriptor
// (SCM_RIGHTS); it points into itself, so it stays where it is made.
struct FdMessage {
  FdMessage(void* data, size_t size) : iov{data, size} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;

  iovec iov;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
};

void set_timeouts(int fd) {
  const timeval second{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &second, sizeof second);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &second, sizeof second);
}

// One step's request: its secret, within a second; the descriptor (and the
// exports) when it matches. The connection of a step that got it, which
// stays open while the step runs; else none.
UniqueFd serve_one(int listener, const SentinelSpec& spec) {
  UniqueFd conn(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn) return conn;
  set_timeouts(conn.get());
  char secret[64];
  const ssize_t n = retry_eintr([&] { return recv(conn.get(), secret, sizeof secret, 0); });
  if (n <= 0 || sha256_hex(std::string_view(secret, static_cast<size_t>(n))) != spec.secret_sha256) return UniqueFd();
  std::string payload = "F" + spec.exports;
  FdMessage m(payload.data(), payload.size());
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &spec.lock_fd, sizeof(int));
  if (retry_eintr([&] { return sendmsg(conn.get(), &m.msg, MSG_NOSIGNAL); }) < 0) return UniqueFd();
  return conn;
}

// The sentinel's end: a hold ended by its tie tells each step still
// connected ("E"); the status says whether steps were still inside.
int end_with_steps(std::vector<UniqueFd>& steps, bool tie_ended) {
  if (steps.empty()) return 0;
  if (tie_ended) {
    for (const auto& s : steps) (void)send(s.get(), "E", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  return kSentinelStepsInside;
}

UniqueFd listen_for_steps(const SentinelSpec& spec) {
  UniqueFd s(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  socklen_t len = 0;
  const sockaddr_un a = hold_socket_name(spec.socket_key, len);
  if (!s || bind(s.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0 || listen(s.get(), 8) != 0) {
    return UniqueFd();
  }
  return s;
}

// The caller's line, once the sentinel listens; false when it is gone.
bool report(const SentinelSpec& spec) {
  const UniqueFd fd(spec.report_fd);
  return fd && write_all(fd.get(), spec.report_line + "\n");
}

}  // namespace

std::string hold_socket_key(std::string_view secret) {
  return sha256_hex("looplock hold socket " + std::string(secret)).substr(0, 32);
}

int hold_sentinel(const SentinelSpec& spec) {
  const EndSignals signals;  // SIGPIPE too: a caller that is gone is EPIPE
  if (signals.fd() < 0) return 71;
  // The holder's end (KILLed) ends the sentinel too, which would else keep
  // the lock through its descriptor.
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) return 71;
  if (getppid() != spec.holder) return 1;
  UniqueFd tie;
  if (spec.tied_to != 0) {
    tie = open_pidfd(spec.tied_to);
    if (!tie) return errno == ESRCH ? 1 : 71;
    // Opened after the pid was named: the same process only with the same start.
    if (process_start(spec.tied_to) != spec.tied_start) return 1;
  }
  const UniqueFd listener = listen_for_steps(spec);
  if (!listener) return 71;
  if (!report(spec)) return 1;
  // The steps that hold the lock through the descriptor now: each keeps
  // its connection open while it runs.
  std::vector<UniqueFd> steps;
  for (;;) {
    std::vector<pollfd> fds = {{signals.fd(), POLLIN, 0}, {listener.get(), POLLIN, 0}, {tie.get(), POLLIN, 0}};
    for (const auto& s : steps) fds.push_back({s.get(), POLLIN, 0});
    if (retry_eintr([&] { return poll(fds.data(), fds.size(), -1); }) < 0) return 71;
    // A step that ended (its looplock closed the connection, or died; or
    // --release, which proved the hold through it), before the end is told.
    for (size_t i = fds.size(); i-- > 3;) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) steps.erase(steps.begin() + static_cast<long>(i - 3));
    }
    if ((fds[0].revents & POLLIN) && signals.take() != 0) return end_with_steps(steps, false);
    if (fds[2].revents & (POLLIN | POLLHUP)) return end_with_steps(steps, true);
    if (fds[1].revents & POLLIN) {
      if (UniqueFd conn = serve_one(listener.get(), spec)) steps.push_back(std::move(conn));
    }
  }
}

HoldShare fetch_hold_fd(Pid holder, const std::string& holder_start, std::string_view secret) {
  socklen_t len = 0;
  const sockaddr_un a = hold_socket_name(hold_socket_key(secret), len);
  UniqueFd s(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s) return {};
  set_timeouts(s.get());
  if (retry_eintr([&] { return connect(s.get(), reinterpret_cast<const sockaddr*>(&a), len); }) != 0) return {};
  // The secret goes only to the holder's own child, of the same user.
  ucred peer{};
  socklen_t peer_len = sizeof peer;
  const auto stat = getsockopt(s.get(), SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) == 0
                        ? read_file("/proc/" + std::to_string(peer.pid) + "/stat", 4096)
                        : std::nullopt;
  if (!stat || procfs::parse_stat_ppid(*stat) != std::optional<Pid>(holder) || process_start(holder) != holder_start ||
      process_uid(holder) != std::optional<Uid>(peer.uid)) {
    errno = EPERM;
    return {};
  }
  if (retry_eintr([&] { return send(s.get(), secret.data(), secret.size(), MSG_NOSIGNAL); }) < 0) return {};
  char payload[4096];
  FdMessage m(payload, sizeof payload);
  const ssize_t n = retry_eintr([&] { return recvmsg(s.get(), &m.msg, MSG_CMSG_CLOEXEC); });
  if (n <= 0) return {};
  const cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int))) {
    errno = EPROTO;
    return {};
  }
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return {UniqueFd(fd), std::string(payload + 1, static_cast<size_t>(n) - 1), std::move(s)};
}

bool hold_tie_ended(int conn) {
  char c = 0;
  return conn >= 0 && retry_eintr([&] { return recv(conn, &c, 1, MSG_DONTWAIT | MSG_PEEK); }) == 1 && c == 'E';
}

bool pidfds_available() {
  const UniqueFd self = open_pidfd(getpid());
  return self.valid();
}

std::optional<PinnedProcess> PinnedProcess::pin(Pid pid, const std::string& start) {
  if (pid <= 0) {
    errno = ESRCH;
    return std::nullopt;
  }
  UniqueFd fd = open_pidfd(pid);
  if (!fd) return std::nullopt;
  if (start.empty() || process_start(pid) != start) {
    errno = ESRCH;
    return std::nullopt;
  }
  return PinnedProcess(std::move(fd));
}

bool PinnedProcess::terminate() const { return syscall(SYS_pidfd_send_signal, fd_.get(), SIGTERM, nullptr, 0) == 0; }

bool PinnedProcess::wait_end(std::chrono::milliseconds bound) const {
  pollfd p{fd_.get(), POLLIN, 0};
  const long long until = monotonic_ms() + bound.count();
  for (;;) {
    const long long left = until - monotonic_ms();
    const int r = poll(&p, 1, static_cast<int>(left > 0 ? left : 0));
    if (r > 0) return true;
    if (r == 0 || (r < 0 && errno != EINTR)) return false;
  }
}

std::optional<std::string> process_executable(Pid pid) {
  char buf[4096];
  const std::string link = "/proc/" + std::to_string(pid) + "/exe";
  const ssize_t n = readlink(link.c_str(), buf, sizeof buf);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof buf) return std::nullopt;
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace looplock::sys
