#include "local/wait_line.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>

using namespace std::chrono_literals;

namespace {
const std::string kWho = "pid 123 (flock): no looplock record";
const std::string kPath = "/srv/loops/nightly-build/.state.lock";
}  // namespace

TEST_CASE("the wait line: the times first, then the holder, then the lock") {
  CHECK(looplock::wait_status_line(1s, std::nullopt, kWho, kPath, 200) ==
        "looplock: waiting 1.0s (no deadline) for " + kWho + " on " + kPath);
  CHECK(looplock::wait_status_line(12s, 18s, kWho, kPath, 200) ==
        "looplock: waiting 12.0s (18.0s left) for " + kWho + " on " + kPath);
}

TEST_CASE("too wide: the path is cut from its start, never the holder") {
  const std::string head = "looplock: waiting 1.0s (no deadline) for " + kWho;
  for (size_t width : {head.size(), head.size() + 5, head.size() + 20}) {
    CAPTURE(width);
    const std::string line = looplock::wait_status_line(1s, std::nullopt, kWho, kPath, width);
    CHECK(line.size() <= width);
    CHECK(line.starts_with(head));
  }
  // Room for some of the path: its end stays.
  const size_t width = head.size() + 7 + 26;
  const std::string cut = looplock::wait_status_line(1s, std::nullopt, kWho, kPath, width);
  CHECK(cut == head + " on .../nightly-build/.state.lock");
  // No room for a useful part of it: left out.
  CHECK(looplock::wait_status_line(1s, std::nullopt, kWho, kPath, head.size() + 10) == head);
  // Only a holder wider than the line is cut, after its pid.
  const std::string narrow = looplock::wait_status_line(1s, std::nullopt, kWho, kPath, 50);
  CHECK(narrow.size() == 50);
  CHECK(narrow.find("pid 123") != std::string::npos);
}
