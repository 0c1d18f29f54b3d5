#include "os/unique_fd.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

using looplock::UniqueFd;

namespace {
int fresh_fd() {
  int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  return fd;
}
bool is_closed(int fd) {
  errno = 0;
  return fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}
}  // namespace

TEST_CASE("default and owning construction") {
  UniqueFd none;
  CHECK_FALSE(none.valid());
  CHECK_FALSE(static_cast<bool>(none));
  CHECK(none.get() == -1);
  UniqueFd neg(-1);
  CHECK_FALSE(neg);

  int raw = fresh_fd();
  {
    UniqueFd fd(raw);
    CHECK(fd.valid());
    CHECK(static_cast<bool>(fd));
    CHECK(fd.get() == raw);
    CHECK_FALSE(is_closed(raw));
  }
  CHECK(is_closed(raw));  // closed on destruction
}

TEST_CASE("release gives the descriptor up") {
  int raw = fresh_fd();
  {
    UniqueFd fd(raw);
    CHECK(fd.release() == raw);
    CHECK_FALSE(fd);
    CHECK(fd.release() == -1);
  }
  CHECK_FALSE(is_closed(raw));
  ::close(raw);
}

TEST_CASE("reset closes the old descriptor and takes the new one") {
  int a = fresh_fd();
  int b = fresh_fd();
  UniqueFd fd(a);
  fd.reset(b);
  CHECK(is_closed(a));
  CHECK(fd.get() == b);
  fd.reset(b);  // the same descriptor: kept open
  CHECK_FALSE(is_closed(b));
  CHECK(fd.get() == b);
  fd.reset();
  CHECK(is_closed(b));
  CHECK_FALSE(fd);
}

TEST_CASE("moves transfer ownership") {
  int a = fresh_fd();
  UniqueFd x(a);
  UniqueFd y(std::move(x));
  CHECK_FALSE(x);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  CHECK(y.get() == a);
  CHECK_FALSE(is_closed(a));

  int b = fresh_fd();
  UniqueFd z(b);
  z = std::move(y);  // z's old descriptor is closed, a moves in
  CHECK(is_closed(b));
  CHECK(z.get() == a);
  CHECK_FALSE(y);  // NOLINT(bugprone-use-after-move)

  UniqueFd& same = z;
  z = std::move(same);  // self-move keeps the descriptor
  CHECK(z.get() == a);
  CHECK_FALSE(is_closed(a));

  { UniqueFd w(std::move(z)); }
  CHECK(is_closed(a));
}
