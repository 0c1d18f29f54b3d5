#include "run/notify.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/log.hpp"

using looplock::Json;
using looplock::NotifySettings;

TEST_CASE("notify_wanted: by default warnings, errors and held_too_long; --notify-on names them; all is all") {
  NotifySettings s;
  CHECK(looplock::notify_wanted(s, "lock_acquire_timeout", "error"));
  CHECK(looplock::notify_wanted(s, "lease_lost", "error"));
  CHECK(looplock::notify_wanted(s, "holder_write_failed", "warning"));
  CHECK(looplock::notify_wanted(s, "held_too_long", "warning"));
  CHECK_FALSE(looplock::notify_wanted(s, "started", "info"));
  CHECK_FALSE(looplock::notify_wanted(s, "noop-locked", "notice"));
  CHECK_FALSE(looplock::notify_wanted(s, "notify_failed", "warning"));  // never about a notifier
  s.on = {"started", "skipped"};
  CHECK(looplock::notify_wanted(s, "started", "info"));
  CHECK(looplock::notify_wanted(s, "skipped", "notice"));
  CHECK_FALSE(looplock::notify_wanted(s, "lock_acquire_timeout", "error"));
  s.on = {"all"};
  CHECK(looplock::notify_wanted(s, "acquired", "info"));
  CHECK_FALSE(looplock::notify_wanted(s, "notify_failed", "warning"));
}

TEST_CASE("the notifier's environment names no held lock, and names its event") {
  const looplock::EnvList env = {"PATH=/usr/bin",        "LOOPLOCK_FD=3",       "LOOPLOCK_HOLDER_PID=12",
                                 "LOOPLOCK_HOLDER_FD=3", "LOOPLOCK_AGENT=cron", "LOOPLOCK_EVENT=old"};
  const auto out = looplock::notifier_env(env, "ended");
  auto has = [&](const std::string& e) { return std::find(out.begin(), out.end(), e) != out.end(); };
  CHECK(has("PATH=/usr/bin"));
  CHECK(has("LOOPLOCK_AGENT=cron"));
  CHECK(has("LOOPLOCK_EVENT=ended"));
  CHECK_FALSE(has("LOOPLOCK_EVENT=old"));
  for (const auto& e : out) {
    CHECK_FALSE(e.starts_with("LOOPLOCK_FD="));
    CHECK_FALSE(e.starts_with("LOOPLOCK_HOLDER_PID="));
    CHECK_FALSE(e.starts_with("LOOPLOCK_HOLDER_FD="));
  }
}

TEST_CASE("held_too_long carries the run's pid, lock and operation from its started event") {
  using namespace std::chrono_literals;
  const Json started = {{"pid", 77}, {"lock_id", "abc"}, {"event", "started"}, {"operation", "tick"}};
  const Json j = looplock::held_too_long_event(started, 1500ms, 1s);
  CHECK(j["pid"] == 77);
  CHECK(j["lock_id"] == "abc");
  CHECK(j["level"] == "warning");
  CHECK(j["event"] == "held_too_long");
  CHECK(j["held_ms"] == 1500);
  CHECK(j["notify_after_ms"] == 1000);
  CHECK(j["message"] == "held_too_long: tick has held the lock for 1.5s and goes on (--notify-after 1.0s)");
}

namespace {
struct Collect : looplock::EventSink {
  std::vector<Json> seen;
  void take(const Json& e) override { seen.push_back(e); }
};
}  // namespace

TEST_CASE("the logger's sink hears every event, whatever -q and -v print") {
  Collect sink;
  looplock::Logger log(looplock::Verbosity::Quiet, looplock::LogFormat::Text, -1);
  log.set_sink(&sink);
  log.verbose("acquired", "a");
  log.warn("w", "b");
  log.result("noop-locked", "c");
  log.error("e", "d", "hint");
  log.event("info", "started", "s", {{"operation", "tick"}});
  REQUIRE(sink.seen.size() == 5);
  CHECK(sink.seen[0]["event"] == "acquired");
  CHECK(sink.seen[0]["level"] == "info");
  CHECK(sink.seen[3]["hint"] == "hint");
  CHECK(sink.seen[4]["operation"] == "tick");
  log.set_sink(nullptr);
  log.warn("w", "b");
  CHECK(sink.seen.size() == 5);
}
