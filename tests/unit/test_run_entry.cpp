// The entries every run ledger shares (records/run_entry.hpp): pure, so this
// file runs on Linux and, in the Windows cross build, under wine.
#include "records/run_entry.hpp"

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "base/json.hpp"
#include "samples.hpp"

using looplock::RunEntry;
using looplock::Slot;
using testutil::kT;
using testutil::run_entry;


TEST_CASE("a run entry round-trips through JSON, and a damaged one is none") {
  RunEntry e = run_entry("tick.py", kT, kT + 2000);
  e.exit_status = 137;
  e.fencing_token = 99;
  const auto back = looplock::run_entry_from_json(looplock::run_entry_to_json(e));
  REQUIRE(back);
  CHECK(back->operation == "tick.py");
  CHECK(back->host == "h1");
  CHECK(back->pid == 4242);
  CHECK(back->agent == "cron");
  CHECK(back->started_ms == kT);
  CHECK(back->ended_ms == kT + 2000);
  CHECK(back->exit_status == 137);
  CHECK(back->fencing_token == 99);

  const auto running = looplock::run_entry_from_json(looplock::run_entry_to_json(run_entry("t", kT)));
  REQUIRE(running);
  CHECK_FALSE(running->ended_ms);
  CHECK_FALSE(running->exit_status);

  looplock::Json j = looplock::run_entry_to_json(e);
  for (const char* key : {"operation", "host", "pid", "agent_id", "started_ms"}) {
    looplock::Json broken = j;
    broken.erase(key);
    CHECK_MESSAGE(!looplock::run_entry_from_json(broken), key);
    broken = j;
    broken[key] = looplock::Json::array();
    CHECK_MESSAGE(!looplock::run_entry_from_json(broken), key);
  }
  looplock::Json broken = j;
  broken["ended_ms"] = "soon";
  CHECK_FALSE(looplock::run_entry_from_json(broken));
  broken = j;
  broken["pid"] = 0;
  CHECK_FALSE(looplock::run_entry_from_json(broken));
  CHECK_FALSE(looplock::run_entry_from_json(looplock::Json("x")));
}

TEST_CASE("describe_run says a run ended, and never presents it as a live process") {
  const std::string ended = looplock::describe_run(run_entry("t", kT, kT + 1500));
  CHECK(ended.find("host h1 pid 4242 (agent cron)") == 0);
  CHECK(ended.find("started at ") != std::string::npos);
  CHECK(ended.find("ended at ") != std::string::npos);
  CHECK(ended.find("with status 0") != std::string::npos);
  CHECK(ended.find("running") == std::string::npos);
  const std::string open = looplock::describe_run(run_entry("t", kT));
  CHECK(open.find("has not recorded its end") != std::string::npos);
}

TEST_CASE("judge_slot: the slot is DURATION from the recorded start, by this looplock's start") {
  const long long d = 4000;
  CHECK(looplock::judge_slot(std::nullopt, kT, d).slot == Slot::Free);
  // Ended within DURATION: done; at DURATION or later: free.
  CHECK(looplock::judge_slot(run_entry("t", kT - 3999, kT - 3000), kT, d).slot == Slot::Done);
  CHECK(looplock::judge_slot(run_entry("t", kT - 4000, kT - 3000), kT, d).slot == Slot::Free);
  CHECK(looplock::judge_slot(run_entry("t", kT - 60000, kT - 59000), kT, d).slot == Slot::Free);
  // Not ended within DURATION: running (or its looplock died).
  CHECK(looplock::judge_slot(run_entry("t", kT - 100), kT, d).slot == Slot::Running);
  // A start in the future (another host's clock is ahead) up to DURATION
  // counts, with how far ahead; further is damaged.
  const auto ahead = looplock::judge_slot(run_entry("t", kT + 3000, kT + 3500), kT, d);
  CHECK(ahead.slot == Slot::Done);
  CHECK(ahead.ahead_ms == 3000);
  CHECK(looplock::judge_slot(run_entry("t", kT + 4000, kT + 4500), kT, d).slot == Slot::Done);
  const auto far = looplock::judge_slot(run_entry("t", kT + 4001, kT + 4500), kT, d);
  CHECK(far.slot == Slot::Damaged);
  CHECK(far.ahead_ms == 4001);
  CHECK(looplock::judge_slot(run_entry("t", kT - 5, kT - 1), kT, d).ahead_ms == 0);
}

TEST_CASE("with_entry replaces the operation's entry; past 64 operations the oldest out of their slot go") {
  std::vector<RunEntry> es;
  es = looplock::with_entry(es, run_entry("a", kT), kT).entries;
  es = looplock::with_entry(es, run_entry("b", kT + 1), kT).entries;
  es = looplock::with_entry(es, run_entry("a", kT + 2, kT + 3), kT).entries;
  REQUIRE(es.size() == 2);
  CHECK(es[0].operation == "b");
  CHECK(es[1].operation == "a");
  CHECK(es[1].ended_ms == kT + 3);
  // Entries without a slot length (earlier versions) or whose slot is over go first.
  for (int i = 0; i < 100; ++i) es = looplock::with_entry(es, run_entry("op" + std::to_string(i), kT + i), kT).entries;
  CHECK(es.size() == looplock::kMaxLedgerOperations);
  CHECK(es.front().operation == "op36");  // the oldest went first
  CHECK(es.back().operation == "op99");
}

TEST_CASE("an entry inside its own slot is never dropped below the hard cap: the ledger grows, and says so") {
  auto slotted = [](std::string op, long long started, long long once_per_ms) {
    RunEntry e = run_entry(std::move(op), started, started + 10);
    e.once_per_ms = once_per_ms;
    return e;
  };
  std::vector<RunEntry> es;
  es = looplock::with_entry(es, slotted("good", kT, 300'000), kT).entries;  // a 5-minute slot, now
  // 100 other operations, each with a 1-minute slot, all inside it.
  looplock::LedgerUpdate u;
  for (int i = 0; i < 100; ++i) {
    u = looplock::with_entry(es, slotted("bad" + std::to_string(i), kT + i, 60'000), kT + 100);
    es = u.entries;
  }
  CHECK(es.size() == 101);
  CHECK(es.front().operation == "good");
  CHECK(u.crowded == 101);
  CHECK(u.dropped_in_slot == 0);
  // A minute later the "bad" slots are over, "good"'s is not: they go, it stays.
  u = looplock::with_entry(es, slotted("next", kT + 70'000, 60'000), kT + 70'000);
  CHECK(u.entries.size() == looplock::kMaxLedgerOperations);
  CHECK(u.entries.front().operation == "good");
  CHECK(u.crowded == 0);
  // At the hard cap the oldest go whatever their slot.
  es.clear();
  for (size_t i = 0; i < looplock::kMaxLedgerEntries + 3; ++i) {
    u = looplock::with_entry(es, slotted("op" + std::to_string(i), kT, 60'000), kT);
    es = u.entries;
  }
  CHECK(es.size() == looplock::kMaxLedgerEntries);
  CHECK(es.front().operation == "op3");
  CHECK(u.dropped_in_slot == 1);
}
TEST_CASE("an entry keeps its slot length and its looplock's identity; earlier entries read without them") {
  RunEntry e = run_entry("t", kT, kT + 1);
  e.once_per_ms = 240'000;
  e.pid_start = "68907";
  e.boot_id = "0b5d2c1e-8f4a-4d3b-9c1e-2a6f7b8c9d0e";
  e.pid_ns = "4026531836";
  const auto back = looplock::run_entry_from_json(looplock::run_entry_to_json(e));
  REQUIRE(back);
  CHECK(back->once_per_ms == 240'000);
  CHECK(back->pid_start == "68907");
  CHECK(back->boot_id == e.boot_id);
  CHECK(back->pid_ns == "4026531836");
  const auto old = looplock::run_entry_from_json(looplock::run_entry_to_json(run_entry("t", kT)));
  REQUIRE(old);
  CHECK_FALSE(old->once_per_ms);
  CHECK(old->pid_start.empty());
  looplock::Json wrong = looplock::run_entry_to_json(e);
  wrong["once_per_ms"] = "4m";
  CHECK_FALSE(looplock::run_entry_from_json(wrong));
}
