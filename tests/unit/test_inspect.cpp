#include "inspect.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "testutil.hpp"

using looplock::HolderRead;
using looplock::HolderRecord;
using looplock::InspectFacts;
using looplock::InspectReport;
using looplock::Json;

namespace {

constexpr long long kHourMs = 3'600'000;

HolderRecord record(std::optional<std::string> released = std::nullopt) {
  return testutil::sample_record(std::move(released));
}

InspectFacts base() {
  InspectFacts f;
  f.lock_path = "loops/nightly/.state.lock";
  f.lock_id = "0123456789abcdef";
  f.exists = true;
  f.holder.state = HolderRead::State::Empty;
  f.stale_after_ms = 2 * kHourMs;
  return f;
}

// A live holder with its record: the ordinary "held" case.
InspectFacts held_by_record() {
  InspectFacts f = base();
  f.kernel = {{1234, true}};
  f.holder.state = HolderRead::State::Valid;
  f.holder.record = record();
  f.age_ms = 60'000;
  f.pid_alive = true;
  f.same_process = true;
  return f;
}

std::vector<std::string> warnings(const InspectReport& r) {
  std::vector<std::string> out;
  for (const auto& w : r.json["warnings"]) out.push_back(w.get<std::string>());
  return out;
}

bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const auto& s : v)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

std::vector<std::string> keys(const Json& j) {
  std::vector<std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) out.push_back(it.key());
  return out;
}

}  // namespace

TEST_CASE("free lock without a record: no warnings") {
  InspectReport r = looplock::build_report(base());
  CHECK(warnings(r).empty());
  CHECK(r.json["kernel"]["held"] == false);
  CHECK(r.json["kernel"]["mode"].is_null());
  CHECK(r.json["kernel"]["holder_pids"] == Json::array());
  CHECK(r.json["record"]["state"] == "empty");
  CHECK(r.json["record"]["holder"].is_null());
  CHECK(r.json["operator_action"] == "none: the lock is free");
  CHECK(r.text.find("free") != std::string::npos);
  CHECK(r.text.find("warning") == std::string::npos);
  CHECK(r.text.find("incidents none") != std::string::npos);
}

TEST_CASE("JSON keys") {
  InspectReport r = looplock::build_report(held_by_record());
  CHECK(keys(r.json) == std::vector<std::string>{"lock_file", "lock_id", "exists", "kernel", "network_fs", "waiters",
                                                 "record", "incidents", "warnings", "operator_action"});
  CHECK(r.json["waiters"] == Json::array());
  CHECK(keys(r.json["kernel"]) ==
        std::vector<std::string>{"held", "unknown", "mode", "holder_pids", "fd_holder_pids"});
  CHECK(r.json["kernel"]["unknown"].is_null());
  CHECK(r.json["kernel"]["fd_holder_pids"] == Json::array());
  CHECK(r.json["network_fs"].is_null());
  CHECK(keys(r.json["record"]) ==
        std::vector<std::string>{"state", "holder", "released", "age_ms", "pid_alive", "same_process", "pid_note"});
  CHECK(keys(r.json["incidents"]) == std::vector<std::string>{"count", "malformed", "latest"});
  CHECK(r.json["lock_file"] == "loops/nightly/.state.lock");
  CHECK(r.json["lock_id"] == "0123456789abcdef");
  CHECK(r.json["exists"] == true);
  CHECK(r.json["kernel"]["held"] == true);
  CHECK(r.json["kernel"]["mode"] == "exclusive");
  CHECK(r.json["kernel"]["holder_pids"] == Json::array({1234}));
  CHECK(r.json["record"]["state"] == "valid");
  CHECK(r.json["record"]["holder"]["pid"] == 1234);
  CHECK(r.json["record"]["holder"]["schema"] == "file_lock_holder_v0");
  CHECK(r.json["record"]["released"] == false);
  CHECK(r.json["record"]["age_ms"] == 60'000);
  CHECK(r.json["record"]["pid_alive"] == true);
  CHECK(r.json["record"]["same_process"] == true);
  CHECK(r.json["incidents"]["count"] == 0);
  CHECK(r.json["incidents"]["latest"].is_null());
  CHECK(warnings(r).empty());
  // The dump never throws and is one line.
  std::string dumped = looplock::dump_json(r.json);
  CHECK(dumped.find('\n') == std::string::npos);
}

TEST_CASE("held by the recorded holder: text report and action") {
  InspectReport r = looplock::build_report(held_by_record());
  CHECK(r.text.find("held (exclusive) by pid 1234") != std::string::npos);
  CHECK(r.text.find("pid 1234, agent cron, operation status.py, policy mutation") != std::string::npos);
  CHECK(r.text.find("acquired 2026-11-30T17:00:00.123Z (1.0m ago), not released") != std::string::npos);
  CHECK(r.text.find("alive, same process") != std::string::npos);
  std::string action = r.json["operator_action"];
  CHECK(action.find("pid 1234") != std::string::npos);
  CHECK(action.find("Never delete the lock file") != std::string::npos);
  CHECK(r.text.find(action) != std::string::npos);
  // Every text line ends with a newline and no line is empty.
  CHECK(r.text.back() == '\n');
  CHECK(r.text.find("\n\n") == std::string::npos);
}

TEST_CASE("free lock with an unreleased record: the holder crashed") {
  InspectFacts f = held_by_record();
  f.kernel.clear();
  f.pid_alive = false;
  f.same_process.reset();
  InspectReport r = looplock::build_report(f);
  auto w = warnings(r);
  CHECK(any_contains(w, "crashed"));
  CHECK(any_contains(w, "pid 1234 is dead"));
  CHECK(r.json["operator_action"] == "none: the lock is free");
  CHECK(r.text.find("dead") != std::string::npos);

  // A record whose process still lives but holds nothing: crashed is still said.
  f.pid_alive = true;
  f.same_process = true;
  r = looplock::build_report(f);
  CHECK(any_contains(warnings(r), "crashed"));
}

TEST_CASE("free lock with a released record: nothing to warn about") {
  InspectFacts f = base();
  f.holder.state = HolderRead::State::Valid;
  f.holder.record = record("2026-11-30T17:00:05.000Z");
  f.pid_alive = false;
  InspectReport r = looplock::build_report(f);
  CHECK(warnings(r).empty());
  CHECK(r.json["record"]["released"] == true);
  CHECK(r.text.find("released 2026-11-30T17:00:05.000Z") != std::string::npos);
}

TEST_CASE("held without a record (flock(1) or another tool)") {
  for (auto state : {HolderRead::State::Empty, HolderRead::State::Valid}) {
    InspectFacts f = base();
    f.kernel = {{555, true}};
    if (state == HolderRead::State::Valid) {
      f.holder.state = state;
      f.holder.record = record("2026-11-30T17:00:05.000Z");  // an old released record
    }
    InspectReport r = looplock::build_report(f);
    auto w = warnings(r);
    CHECK(any_contains(w, "held by pid 555 without a current holder record"));
    CHECK(std::string(r.json["operator_action"]).find("pid 555") != std::string::npos);
  }
  // A shared hold writes no record: that is normal.
  InspectFacts f = base();
  f.kernel = {{7, false}, {8, false}};
  InspectReport r = looplock::build_report(f);
  CHECK(warnings(r).empty());
  CHECK(r.json["kernel"]["mode"] == "shared");
  CHECK(r.json["kernel"]["holder_pids"] == Json::array({7, 8}));
  CHECK(r.text.find("held (shared) by pid 7, 8") != std::string::npos);
}

TEST_CASE("the record's pid was reused by another process") {
  InspectFacts f = held_by_record();
  f.same_process = false;
  InspectReport r = looplock::build_report(f);
  CHECK(any_contains(warnings(r), "pid reused"));
  CHECK(r.json["record"]["same_process"] == false);
  CHECK(r.text.find("pid reused by another process") != std::string::npos);
}

TEST_CASE("the kernel names another pid than the record") {
  InspectFacts f = held_by_record();
  f.kernel = {{99, true}};
  InspectReport r = looplock::build_report(f);
  CHECK(any_contains(warnings(r), "the kernel says pid 99 holds the lock, not the record's pid 1234"));
  CHECK(std::string(r.json["operator_action"]).find("pid 99") != std::string::npos);
}

TEST_CASE("stale: held longer than --stale-after") {
  InspectFacts f = held_by_record();
  f.age_ms = 3 * kHourMs + 5 * 60'000;
  InspectReport r = looplock::build_report(f);
  auto w = warnings(r);
  CHECK(any_contains(w, "held for 3.0h, longer than --stale-after 2.0h"));
  CHECK(any_contains(w, "pid 1234"));

  f.age_ms = kHourMs;
  CHECK(warnings(looplock::build_report(f)).empty());
  f.age_ms = 2 * kHourMs;  // exactly the limit is not stale yet
  CHECK(warnings(looplock::build_report(f)).empty());
  f.stale_after_ms = 30 * 60'000;
  CHECK(any_contains(warnings(looplock::build_report(f)), "longer than --stale-after 30.0m"));
  // Unknown age (acquired_at not parseable): no stale warning, no crash.
  f.age_ms.reset();
  InspectReport no_age = looplock::build_report(f);
  CHECK(warnings(no_age).empty());
  CHECK(no_age.json["record"]["age_ms"].is_null());
}

TEST_CASE("unreadable content is reported as such") {
  InspectFacts f = base();
  f.holder.state = HolderRead::State::Unreadable;
  f.holder.size = 17;
  InspectReport r = looplock::build_report(f);
  CHECK(any_contains(warnings(r), "17 bytes that are not a valid holder record"));
  CHECK(r.json["record"]["state"] == "unreadable");
  CHECK(r.json["record"]["holder"].is_null());
  CHECK(r.text.find("no record (unreadable)") != std::string::npos);

  f.holder.state = HolderRead::State::Error;
  r = looplock::build_report(f);
  CHECK(r.json["record"]["state"] == "error");
}

TEST_CASE("missing lock file, unsafe directory and non-regular lock path") {
  InspectFacts f = base();
  f.exists = false;
  InspectReport r = looplock::build_report(f);
  CHECK(r.json["exists"] == false);
  CHECK(r.json["record"]["state"] == "missing");
  CHECK(r.text.find("missing") != std::string::npos);
  CHECK(warnings(r).empty());

  f = base();
  f.dir_unsafe = true;
  CHECK(any_contains(warnings(looplock::build_report(f)), "world-writable without the sticky bit"));

  f = base();
  f.not_regular = "a symbolic link";
  r = looplock::build_report(f);
  CHECK(any_contains(warnings(r), "the lock path is a symbolic link, not a regular file"));
  CHECK(r.json["record"]["state"] == "not read");
  CHECK(r.text.find("not read (not a regular file)") != std::string::npos);
}

TEST_CASE("a network file system is warned about") {
  InspectFacts f = base();
  f.network_fs = "nfs";
  InspectReport r = looplock::build_report(f);
  CHECK(any_contains(warnings(r), "network file system (nfs)"));
  CHECK(r.json["network_fs"] == "nfs");
}

TEST_CASE("a lock held through a descriptor its dead locker passed on") {
  InspectFacts f = base();
  f.kernel = {{4000, true}};
  f.dead_kernel_pids = {4000};
  f.fd_holders = {4100, 4101};
  InspectReport r = looplock::build_report(f);
  auto w = warnings(r);
  CHECK(any_contains(w, "the kernel names pid 4000, which has exited"));
  CHECK(any_contains(w, "by pid 4100, 4101"));
  CHECK(r.json["kernel"]["fd_holder_pids"] == Json::array({4100, 4101}));
  // The action names the processes that really hold it.
  std::string action = r.json["operator_action"];
  CHECK(action.find("pid 4100, 4101") != std::string::npos);
  CHECK(action.find("4000") == std::string::npos);

  f.fd_holders.clear();
  r = looplock::build_report(f);
  CHECK(any_contains(warnings(r), "could not be found"));
}

TEST_CASE("waiters: who, doing what, for how long at most") {
  InspectFacts f = held_by_record();
  f.waiters.push_back({4321, true, "looplock", "ci", "deploy.py", 3'200});
  f.waiters.push_back({4322, false, "flock", std::nullopt, std::nullopt, std::nullopt});
  InspectReport r = looplock::build_report(f);
  CHECK(r.json["waiters"].size() == 2);
  CHECK(r.json["waiters"][0] == Json::parse(R"({"pid":4321,"mode":"exclusive","command":"looplock",)"
                                            R"("agent_id":"ci","operation":"deploy.py","waiting_at_most_ms":3200})"));
  CHECK(r.json["waiters"][1]["agent_id"].is_null());
  CHECK(r.text.find("waiting   pid 4321 (looplock: agent ci, operation deploy.py), exclusive, for at most 3.2s\n") !=
        std::string::npos);
  CHECK(r.text.find("waiting   pid 4322 (flock), shared\n") != std::string::npos);
  CHECK(warnings(r).empty());  // waiting is not a warning
  CHECK(looplock::build_report(base()).text.find("waiting   none\n") != std::string::npos);
}

TEST_CASE("looplock_identity reads a waiter's command line as looplock does") {
  looplock::Environment env{std::string("cron"), std::nullopt, std::nullopt, [] { return std::string("user"); }};
  auto id = looplock::looplock_identity({"looplock", "-w", "5", "/srv/loops/n", "--", "python3", "/x/tick.py", "--secret"},
                                        env);
  REQUIRE(id);
  CHECK(id->first == "cron");
  CHECK(id->second == "tick.py");
  env.looplock_agent.reset();
  id = looplock::looplock_identity({"looplock", "--operation", "op", "D", "-c", "x"}, env);
  REQUIRE(id);
  CHECK(*id == std::make_pair(std::string("user"), std::string("op")));
  CHECK_FALSE(looplock::looplock_identity({"looplock", "--inspect", "D"}, env));
  CHECK_FALSE(looplock::looplock_identity({"looplock", "--bogus"}, env));
}

TEST_CASE("incidents: count, malformed and the latest row") {
  InspectFacts f = held_by_record();
  f.incidents.exists = true;
  f.incidents.count = 3;
  f.incidents.malformed = 1;
  f.incidents.latest = Json::parse(
      R"({"schema":"file_lock_incident_v0","at":"2026-11-30T17:00:05.126Z","error_code":"lock_acquire_timeout",)"
      R"("lock_id":"0123456789abcdef","policy":"mutation","deadline_ms":5000,"waited_ms":5003,"holder":null,)"
      R"("holder_alive":null,"holder_pids":[1234],"waiter":{"pid":4321,"agent_id":"ci","operation":"deploy.py"},)"
      R"("operator_action":"x"})");
  InspectReport r = looplock::build_report(f);
  CHECK(r.json["incidents"]["count"] == 3);
  CHECK(r.json["incidents"]["malformed"] == 1);
  CHECK(r.json["incidents"]["latest"]["waiter"]["pid"] == 4321);
  CHECK(r.text.find("3 (1 malformed); latest 2026-11-30T17:00:05.126Z lock_acquire_timeout: waiter pid 4321 "
                    "(deploy.py) waited 5.0s") != std::string::npos);
}

