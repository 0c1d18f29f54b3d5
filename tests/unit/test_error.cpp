#include "base/error.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "base/exit_codes.hpp"

using looplock::Fatal;

TEST_CASE("Fatal carries status, message and hint") {
  Fatal f(73, "unsafe lock file x", "Move it away.");
  CHECK(f.status() == 73);
  CHECK(std::string(f.what()) == "unsafe lock file x");
  CHECK(f.hint() == "Move it away.");
  Fatal g(64, "missing DIR");
  CHECK(g.hint().empty());
  const std::runtime_error& base = f;  // caught as a runtime_error too
  CHECK(std::string(base.what()) == "unsafe lock file x");
}

TEST_CASE("errno_message and fail_errno") {
  CHECK(looplock::errno_message("cannot open x", ENOENT) == std::string("cannot open x: ") + std::strerror(ENOENT));
  try {
    looplock::fail_errno(71, "cannot fork", EAGAIN, "Too many processes?");
    FAIL("fail_errno returned");
  } catch (const Fatal& f) {
    CHECK(f.status() == 71);
    CHECK(std::string(f.what()) == std::string("cannot fork: ") + std::strerror(EAGAIN));
    CHECK(f.hint() == "Too many processes?");
  }
  CHECK_THROWS_AS(looplock::fail_errno(66, "x", ENOENT), Fatal);
}

TEST_CASE("status_for_errno: resource exhaustion and kernel failures are 71") {
  for (int err : {EMFILE, ENFILE, ENOMEM, ENOLCK, EAGAIN, EIO}) {
    CAPTURE(err);
    CHECK(looplock::status_for_errno(err, 73) == 71);
  }
  for (int err : {ENOENT, EACCES, EPERM, ELOOP, EROFS, ENOTDIR, EEXIST}) {
    CAPTURE(err);
    CHECK(looplock::status_for_errno(err, 73) == 73);
    CHECK(looplock::status_for_errno(err, 66) == 66);
  }
}

TEST_CASE("the exit status table") {
  namespace ec = looplock::exit_code;
  CHECK(ec::kOk == 0);
  CHECK(ec::kUsage == 64);
  CHECK(ec::kNoInput == 66);
  CHECK(ec::kOsError == 71);
  CHECK(ec::kCantCreate == 73);
  CHECK(ec::kVanished == 74);
  CHECK(ec::kTimeout == 75);
  CHECK(ec::kNotExecutable == 126);
  CHECK(ec::kNotFound == 127);
}

TEST_CASE("fail(): a recoverable failure that ends the run after all becomes one Fatal") {
  try {
    looplock::fail(71, {.what = "cannot arm the deadline timer", .err = EAGAIN, .hint = "Without it."});
    FAIL("no Fatal");
  } catch (const looplock::Fatal& f) {
    CHECK(f.status() == 71);
    CHECK(std::string(f.what()) == "cannot arm the deadline timer: " + std::string(std::strerror(EAGAIN)));
    CHECK(f.hint() == "Without it.");
    CHECK(f.event() == "os_error");
  }
  try {
    looplock::fail(73, {.what = "the metrics file stayed busy"}, "metrics_write_failed");
    FAIL("no Fatal");
  } catch (const looplock::Fatal& f) {
    CHECK(f.status() == 73);
    CHECK(std::string(f.what()) == "the metrics file stayed busy");  // no errno: no strerror
    CHECK(f.event() == "metrics_write_failed");
  }
}
