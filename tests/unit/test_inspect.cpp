#include "cli/inspect.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "testutil.hpp"

using looplock::HolderRead;
using looplock::HolderRecord;
using looplock::InspectFacts;
using looplock::InspectReport;
using looplock::Json;

// The report renders the lock's verdict (its judgement is tested in
// test_verdict.cpp): these tests are about the rendering, text and JSON.

namespace {

InspectFacts base() {
  InspectFacts f;
  f.lock.lock_path = "loops/nightly/.state.lock";
  f.lock_id = "0123456789abcdef";
  f.lock.record.state = HolderRead::State::Empty;
  return f;
}

// A live holder with its record: the ordinary "held" case.
InspectFacts held_by_record() {
  InspectFacts f = base();
  looplock::LockHolder h;
  h.pid = 1234;
  h.command = "looplock";
  f.lock.holders = {h};
  f.lock.record.state = HolderRead::State::Valid;
  f.lock.record.record = testutil::sample_record();
  f.lock.record_age_ms = 60'000;
  f.lock.record_pid_alive = true;
  f.lock.record_same_process = true;
  return f;
}

std::vector<std::string> warnings(const InspectReport& r) {
  std::vector<std::string> out;
  for (const auto& w : r.json["warnings"]) out.push_back(w.get<std::string>());
  return out;
}

std::vector<std::string> keys(const Json& j) {
  std::vector<std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) out.push_back(it.key());
  return out;
}

Json incident(const char* code, const char* extra) {
  return Json::parse(
      std::string(R"({"schema":"file_lock_incident_v0","at":"2026-11-30T17:00:05.126Z","error_code":")") + code +
      R"(","lock_id":"0123456789abcdef","policy":"mutation","deadline_ms":5000,"waited_ms":5003,)"
      R"("holder":null,"holder_alive":null,"holder_pids":[1234],)"
      R"("waiter":{"pid":4321,"agent_id":"ci","operation":"deploy.py"},)" +
      extra + R"("operator_action":"x"})");
}

}  // namespace

TEST_CASE("free lock without a record: no warnings") {
  InspectReport r = looplock::build_report(base());
  CHECK(warnings(r).empty());
  CHECK(r.json["kernel"]["held"] == false);
  CHECK(r.json["kernel"]["mode"].is_null());
  CHECK(r.json["kernel"]["holder_pids"] == Json::array());
  CHECK(r.json["record"]["state"] == "empty");
  CHECK(r.json["record"]["status"] == "none");
  CHECK(r.json["record"]["holder"].is_null());
  CHECK(r.json["holder"] == "none");
  CHECK(r.json["operator_action"] == "none: the lock is free");
  CHECK(r.text.find("kernel    free\n") != std::string::npos);
  CHECK(r.text.find("holder    none\n") != std::string::npos);
  CHECK(r.text.find("record    none (the file is empty)\n") != std::string::npos);
  CHECK(r.text.find("warning") == std::string::npos);
  CHECK(r.text.find("incidents none") != std::string::npos);
}

TEST_CASE("the run ledger: one line per operation, an ended run never shown as a live process") {
  InspectFacts f = base();
  looplock::RunEntry e;
  e.operation = "tick";
  e.host = "h1";
  e.pid = 77;
  e.agent = "cron";
  e.started_ms = 1'790'000'000'000;
  e.ended_ms = e.started_ms + 1500;
  e.exit_status = 2;
  f.runs = {e};
  f.runs_damaged = {"gate"};
  InspectReport r = looplock::build_report(f);
  CHECK(r.text.find("last run  operation tick: host h1 pid 77 (agent cron), which started at ") != std::string::npos);
  CHECK(r.text.find("with status 2\n") != std::string::npos);
  CHECK(r.text.find("last run  operation gate: a damaged entry") != std::string::npos);
  REQUIRE(r.json["runs"].size() == 1);
  CHECK(r.json["runs"][0]["exit_status"] == 2);
  CHECK(r.json["runs_damaged"] == Json::array({"gate"}));
  CHECK(r.json["runs_error"].is_null());
  CHECK(warnings(r).empty());  // the ledger says what ran, not what is wrong with the lock
}

TEST_CASE("no run ledger: no line, empty keys") {
  InspectReport r = looplock::build_report(base());
  CHECK(r.text.find("last run") == std::string::npos);
  CHECK(r.json["runs"] == Json::array());
}

TEST_CASE("JSON keys") {
  InspectReport r = looplock::build_report(held_by_record());
  CHECK(keys(r.json) == std::vector<std::string>{"lock_file", "lock_id", "exists", "kernel", "holder", "holders",
                                                 "network_fs", "waiters", "holder_indexes", "record", "incidents",
                                                 "runs", "runs_damaged", "runs_error", "warnings", "operator_action"});
  CHECK(r.json["waiters"] == Json::array());
  CHECK(keys(r.json["kernel"]) ==
        std::vector<std::string>{"held", "unknown", "mode", "holder_pids", "fd_holder_pids", "tested_by_taking"});
  CHECK(r.json["kernel"]["unknown"].is_null());
  CHECK(r.json["kernel"]["fd_holder_pids"] == Json::array());
  CHECK(r.json["network_fs"].is_null());
  CHECK(keys(r.json["record"]) == std::vector<std::string>{"state", "status", "holder", "released", "age_ms",
                                                           "pid_alive", "same_process", "pid_note"});
  CHECK(keys(r.json["incidents"]) == std::vector<std::string>{"count", "error", "malformed", "examined", "latest", "recent"});
  CHECK(r.json["holders"] == Json::parse(R"([{"pid":1234,"command":"looplock","mode":"exclusive","locked_by":null,)"
                                         R"("uid":null,"exited":false}])"));
  CHECK(r.json["lock_file"] == "loops/nightly/.state.lock");
  CHECK(r.json["lock_id"] == "0123456789abcdef");
  CHECK(r.json["exists"] == true);
  CHECK(r.json["kernel"]["held"] == true);
  CHECK(r.json["kernel"]["mode"] == "exclusive");
  CHECK(r.json["kernel"]["holder_pids"] == Json::array({1234}));
  CHECK(r.json["record"]["state"] == "valid");
  CHECK(r.json["record"]["status"] == "current");
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

TEST_CASE("held by the recorded holder: the text report names it as every run does") {
  InspectReport r = looplock::build_report(held_by_record());
  CHECK(r.text.find("kernel    held (exclusive) by pid 1234\n") != std::string::npos);
  CHECK(r.text.find("holder    pid 1234 (agent cron, operation status.py, policy mutation, since "
                    "2026-11-30T17:00:00.123Z)\n") != std::string::npos);
  CHECK(r.text.find("record    current: pid 1234, agent cron, operation status.py, policy mutation\n") !=
        std::string::npos);
  CHECK(r.text.find("acquired 2026-11-30T17:00:00.123Z (1.0m ago), not released") != std::string::npos);
  CHECK(r.text.find("process   alive, same process (pid_start 987654)") != std::string::npos);
  std::string action = r.json["operator_action"];
  CHECK(action.find("pid 1234") != std::string::npos);
  CHECK(r.text.find(action) != std::string::npos);
  // Every text line ends with a newline and no line is empty.
  CHECK(r.text.back() == '\n');
  CHECK(r.text.find("\n\n") == std::string::npos);
}

TEST_CASE("a stale record is shown as such, apart from the holder") {
  InspectFacts f = held_by_record();
  f.lock.holders[0].pid = 2001;
  f.lock.holders[0].command = "flock";
  f.lock.record_pid_alive = false;
  f.lock.record_same_process.reset();
  InspectReport r = looplock::build_report(f);
  CHECK(r.text.find("holder    pid 2001 (flock): no looplock record\n") != std::string::npos);
  CHECK(r.text.find("record    stale (not the holder): pid 1234, agent cron") != std::string::npos);
  CHECK(r.text.find("process   dead (pid_start 987654)") != std::string::npos);
  CHECK(r.json["record"]["status"] == "stale");
  CHECK(r.json["holder"] == "pid 2001 (flock): no looplock record");
}

TEST_CASE("an -F run's record that ended, a released one, a missing file, unreadable content") {
  InspectFacts f = held_by_record();
  f.lock.holders.clear();
  f.lock.record.record->no_fork = true;
  f.lock.record_pid_alive = false;
  InspectReport r = looplock::build_report(f);
  CHECK(warnings(r).empty());
  CHECK(r.text.find("record    ended (an -F run writes no release): pid 1234") != std::string::npos);
  CHECK(r.text.find("not released (-F)") != std::string::npos);
  CHECK(r.json["record"]["holder"]["no_fork"] == true);

  f.lock.record.record = testutil::sample_record("2026-11-30T17:00:05.000Z");
  r = looplock::build_report(f);
  CHECK(r.text.find("record    released: pid 1234") != std::string::npos);
  CHECK(r.text.find("released 2026-11-30T17:00:05.000Z") != std::string::npos);
  CHECK(r.text.find("process") == std::string::npos);

  f = base();
  f.lock.exists = false;
  r = looplock::build_report(f);
  CHECK(r.json["exists"] == false);
  CHECK(r.json["record"]["state"] == "missing");
  CHECK(r.text.find("file      missing: the next run creates it") != std::string::npos);
  CHECK(warnings(r).empty());

  f = base();
  f.lock.record.state = HolderRead::State::Unreadable;
  f.lock.record.size = 17;
  r = looplock::build_report(f);
  CHECK(r.json["record"]["state"] == "unreadable");
  CHECK(r.text.find("record    unreadable\n") != std::string::npos);
  f.lock.record.state = HolderRead::State::Error;
  CHECK(looplock::build_report(f).json["record"]["state"] == "error");
}

TEST_CASE("a lock held through a descriptor its dead locker passed on") {
  InspectFacts f = base();
  looplock::LockHolder a, b;
  a.pid = 4100;
  a.locked_by = 4000;
  b.pid = 4101;
  b.locked_by = 4000;
  f.lock.holders = {a, b};
  f.lock.dead_kernel_pids = {4000};
  InspectReport r = looplock::build_report(f);
  CHECK(r.json["kernel"]["holder_pids"] == Json::array({4000}));  // as /proc/locks names it
  CHECK(r.json["kernel"]["fd_holder_pids"] == Json::array({4100, 4101}));
  std::string action = r.json["operator_action"];
  CHECK(action.find("pids 4100, 4101 are alive") != std::string::npos);
  CHECK(action.find("4000") == std::string::npos);
}

TEST_CASE("waiters: who, doing what, for how long at most") {
  InspectFacts f = held_by_record();
  f.waiters.push_back({.pid = 4321,
                       .exclusive = true,
                       .command = "looplock",
                       .agent_id = "ci",
                       .operation = "deploy.py",
                       .at_most_ms = 3'200});
  f.waiters.push_back({.pid = 4322, .exclusive = false, .command = "flock"});
  InspectReport r = looplock::build_report(f);
  CHECK(r.json["waiters"].size() == 2);
  CHECK(r.json["waiters"][0] == Json::parse(R"({"pid":4321,"mode":"exclusive","command":"looplock",)"
                                            R"("agent_id":"ci","operation":"deploy.py","waiting_at_most_ms":3200,)"
                                            R"("coalescing":false})"));
  CHECK(r.json["waiters"][1]["agent_id"].is_null());
  CHECK(r.text.find("waiting   pid 4321 (looplock: agent ci, operation deploy.py), exclusive, has waited at most 3.2s\n") !=
        std::string::npos);
  CHECK(r.text.find("waiting   pid 4322 (flock), shared\n") != std::string::npos);
  CHECK(warnings(r).empty());  // waiting is not a warning
  CHECK(looplock::build_report(base()).text.find("waiting   none\n") != std::string::npos);

  // -p coalesce: the waiter in its operation's seat is marked.
  f.waiters[0].coalescing = true;
  r = looplock::build_report(f);
  CHECK(r.json["waiters"][0]["coalescing"] == true);
  CHECK(r.text.find("has waited at most 3.2s; coalescing: later -p coalesce runs of deploy.py skip\n") != std::string::npos);
}

TEST_CASE("incidents: count, malformed and the latest row; a job looplock ended ran, it did not wait") {
  InspectFacts f = held_by_record();
  f.incidents.exists = true;
  f.incidents.count = 3;
  f.incidents.malformed = 1;
  f.incidents.examined = 2;
  f.incidents.latest = incident("lock_acquire_timeout", "");
  f.incidents.recent = {*f.incidents.latest};
  InspectReport r = looplock::build_report(f);
  CHECK(r.json["incidents"]["count"] == 3);
  CHECK(r.json["incidents"]["malformed"] == 1);
  CHECK(r.json["incidents"]["examined"] == 2);
  CHECK(r.json["incidents"]["latest"]["waiter"]["pid"] == 4321);
  CHECK(r.json["incidents"]["recent"].size() == 1);
  CHECK(r.text.find("3 (1 malformed among the newest 2); latest 2026-11-30T17:00:05.126Z lock_acquire_timeout: "
                    "waiter pid 4321 (deploy.py) waited 5.0s") != std::string::npos);
  CHECK(r.text.find("\nincident ") == std::string::npos);  // one row: the incidents line says it
  f.incidents.recent = {incident("max_time_exceeded", R"("ran_ms":304,"killed":false,"ran_after_term_ms":3,)"),
                        *f.incidents.latest};
  r = looplock::build_report(f);
  const size_t first = r.text.find("\nincident  ");
  REQUIRE(first != std::string::npos);
  CHECK(r.text.find("max_time_exceeded", first) < r.text.find("lock_acquire_timeout", first + 1));
  f.incidents.recent = {*f.incidents.latest};
  for (const char* code : {"max_time_exceeded", "lease_lost"}) {
    CAPTURE(code);
    f.incidents.latest = incident(code, R"("ran_ms":304,"killed":false,"ran_after_term_ms":3,)");
    r = looplock::build_report(f);
    CHECK(r.text.find(std::string(code) + ": pid 4321 (deploy.py) ran 304ms") != std::string::npos);
    CHECK(r.text.find("waited") == std::string::npos);
  }
}

TEST_CASE("the JSON entry of a DIR that could not be inspected") {
  Json e = looplock::error_entry("/nope", 66, "dir_missing", "loop directory /nope does not exist", "Create it.");
  CHECK(e == Json::parse(R"({"lock_file":"/nope/.state.lock","error":{"status":66,"event":"dir_missing",)"
                         R"("message":"loop directory /nope does not exist","hint":"Create it."}})"));
}

TEST_CASE("looplock_identity reads a waiter's command line as looplock does") {
  looplock::Environment env;
  env.looplock_agent = "cron";
  env.user_name = [] { return std::string("user"); };
  auto id = looplock::looplock_identity(
      {"looplock", "-w", "5", "/srv/loops/n", "--", "python3", "/x/tick.py", "--secret"}, env);
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

TEST_CASE("where the system lists no holders, a missing lock file is free and its waiters unknown") {
  InspectFacts f = base();
  f.lock.exists = false;
  f.lock.holders_unlisted = true;
  InspectReport r = looplock::build_report(f);
  CHECK(r.json["waiters"].is_null());
  CHECK(r.text.find("kernel    free (no lock file to hold; the system names no holder or waiter)\n") !=
        std::string::npos);
  CHECK(r.text.find("waiting   unknown\n") != std::string::npos);
  f.lock.holders_unlisted = false;  // Linux: /proc/locks lists them
  r = looplock::build_report(f);
  CHECK(r.json["waiters"].is_array());
  CHECK(r.text.find("kernel    free\n") != std::string::npos);
  CHECK(r.text.find("waiting   none\n") != std::string::npos);
}

TEST_CASE("--holders: a warning only when held indexes' current records disagree on N") {
  using Index = looplock::InspectFacts::Index;
  auto held = [](int index, int n, bool current = true) {
    Index x;
    x.index = index;
    x.held = true;
    looplock::HolderRecord r;
    r.pid = 100 + index;
    r.holders = n;
    r.index = index;
    x.record = r;
    x.record_current = current;
    return x;
  };
  CHECK_FALSE(looplock::holders_disagree({}));
  CHECK_FALSE(looplock::holders_disagree({held(0, 3), held(1, 3)}));
  CHECK_FALSE(looplock::holders_disagree({held(0, 3), held(1, 5, /*current=*/false)}));
  Index free_one = held(2, 5);
  free_one.held = false;
  CHECK_FALSE(looplock::holders_disagree({held(0, 3), free_one}));
  const auto w = looplock::holders_disagree({held(0, 2), held(1, 4)});
  REQUIRE(w);
  CHECK(w->find("index 0 by pid 100 with --holders 2; index 1 by pid 101 with --holders 4") != std::string::npos);
  CHECK(w->find("up to 4 runs hold the lock at once") != std::string::npos);
}
