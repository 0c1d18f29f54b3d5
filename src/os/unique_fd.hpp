// A move-only owner of a file descriptor (after libcamera's UniqueFD and
// ccache's util::Fd): closes in the destructor; release() gives it up.
#pragma once

#include <utility>

namespace looplock {

namespace sys {
// close(2) on POSIX, the C runtime's _close on Windows (os/posix/sys.cpp,
// os/windows/sys.cpp).
void close_fd(int fd) noexcept;
}  // namespace sys

class UniqueFd {
public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }

  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the current descriptor (if any) and takes ownership of `fd`.
  // close() is not retried on EINTR: on Linux the descriptor is gone anyway.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0 && fd_ != fd) {
      sys::close_fd(fd_);
    }
    fd_ = fd;
  }

private:
  int fd_ = -1;
};

}  // namespace looplock
