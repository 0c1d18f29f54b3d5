// The etcd doubles of the unit tests: a clock that moves only when told, a
// scripted Transport (test_etcd.cpp's client tests), and a small in-memory
// etcd that answers the cluster lock's requests (test_cluster.cpp). Include
// once per test file, after <doctest/doctest.h>.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/duration.hpp"
#include "cluster/etcd.hpp"

namespace {

using namespace looplock;
using namespace looplock::etcd;

// The fake clock and the rows count nanoseconds.
constexpr long long kMs = 1'000'000LL;
constexpr long long kSec = 1'000'000'000LL;

// Time that only moves when told: a transport's step takes its time, a
// pause takes its time. It counts nanoseconds of the monotonic clock.
struct FakeClock : Clock {
  long long t = 1'000 * kSec;
  std::vector<long long> sleeps;
  Instant now() override { return instant_ns(t); }
  void sleep_until(Instant until) override {
    sleeps.push_back(ns_of(until) - t);
    t = std::max(t, ns_of(until));
  }
};

// A call's bounds in the rows' nanoseconds: by `at_ns`, each attempt
// `attempt_ns` (0: until then).
[[maybe_unused]] etcd::Deadline by(long long at_ns, long long attempt_ns = 0, bool grow = true,
                                   const sys::Interrupts* interrupt_on = nullptr) {
  return {.at = instant_ns(at_ns),
          .attempt = attempt_ns > 0 ? std::optional(Duration(attempt_ns)) : std::nullopt,
          .grow = grow,
          .interrupt_on = interrupt_on};
}

struct Call {
  std::string url;
  std::string path;
  std::string body;
  std::string token;
  long long at = 0;
  long long connect_deadline_ns = 0;
  long long deadline_ns = 0;
  bool stream = false;
  bool fresh = false;
  long long server_timeout_ns = 0;
};

// How one exchange goes.
struct Step {
  // Delay: (from MiniEtcd's fault) the member is frozen until took_ns from
  // now, then answers as usual, if that is before the request's deadline.
  enum Kind { Answer, Refused, ConnectTimeout, Silent, TlsError, Delay, Signal } kind = Answer;
  int status = 200;
  std::string body;
  long long took_ns = kMs;
};
[[maybe_unused]] Step answer(std::string body, long long took = kMs) {
  return {.kind = Step::Answer, .status = 200, .body = std::move(body), .took_ns = took};
}
[[maybe_unused]] Step http(int status, std::string body) {
  return {.kind = Step::Answer, .status = status, .body = std::move(body), .took_ns = kMs};
}
[[maybe_unused]] Step failing(Step::Kind kind) { return {.kind = kind, .status = 0, .body = "", .took_ns = 0}; }
[[maybe_unused]] Step refused() { return failing(Step::Refused); }
[[maybe_unused]] Step connect_timeout() { return failing(Step::ConnectTimeout); }
[[maybe_unused]] Step silent() { return failing(Step::Silent); }
[[maybe_unused]] Step signal_pending() { return failing(Step::Signal); }

// A Transport whose every exchange is decided by `handler` (or taken from
// `script` in order), on the fake clock.
struct FakeTransport : Transport {
  FakeClock& clock;
  std::vector<Step> script;
  std::function<Step(const Endpoint&, const Request&)> handler;
  std::vector<Call> calls;
  Security security;
  explicit FakeTransport(FakeClock& c) : clock(c) {}

  void configure(const Security& s) override { security = s; }
  Exchange post(const Endpoint& ep, const Request& req, HttpResponse& out, std::string& error) override {
    calls.push_back({.url = ep.text + std::string(req.path),
                     .path = std::string(req.path),
                     .body = std::string(req.body),
                     .token = std::string(req.token),
                     .at = clock.t,
                     .connect_deadline_ns = ns_of(req.connect_deadline),
                     .deadline_ns = ns_of(req.deadline),
                     .stream = bool(req.enough),
                     .fresh = req.fresh_connection,
                     .server_timeout_ns = req.server_timeout ? req.server_timeout->count() : 0});
    Step s;
    if (handler) {
      s = handler(ep, req);
    } else {
      REQUIRE(calls.size() <= script.size());
      s = script[calls.size() - 1];
    }
    switch (s.kind) {
      case Step::Refused: error = ep.text + ": connection refused"; return Exchange::ConnectFailed;
      case Step::ConnectTimeout:
        clock.t = std::max(clock.t, ns_of(req.connect_deadline));
        error = ep.text + ": connection timed out";
        return Exchange::ConnectFailed;
      case Step::Silent:
        clock.t = std::max(clock.t, ns_of(req.deadline));
        error = ep.text + ": no answer before the deadline";
        return Exchange::TimedOut;
      case Step::TlsError:
        error = ep.text + ": TLS: certificate verify failed";
        out.cause = Cause::TlsRejected;
        return Exchange::TlsFailed;
      case Step::Signal:  // a signal of req.interrupt_on became pending
        REQUIRE(req.interrupt_on != nullptr);
        clock.t += 100 * kMs;
        error = ep.text + ": interrupted by a signal";
        return Exchange::Interrupted;
      case Step::Answer:
      case Step::Delay: break;
    }
    if (clock.t + s.took_ns > ns_of(req.deadline)) {  // it would have answered too late
      clock.t = ns_of(req.deadline);
      error = ep.text + ": no answer before the deadline";
      return Exchange::TimedOut;
    }
    clock.t += s.took_ns;
    out.status = s.status;
    out.body = s.body;
    return Exchange::Ok;
  }
  size_t count(std::string_view path) const {
    return static_cast<size_t>(
        std::count_if(calls.begin(), calls.end(), [&](const Call& c) { return c.path == path; }));
  }
};

std::vector<Endpoint> endpoints(int n) {
  std::vector<Endpoint> out;
  for (int i = 1; i <= n; ++i) {
    Endpoint e;
    e.host = "10.0.0." + std::to_string(i);
    e.port = 2379;
    e.text = "http://" + e.host + ":2379";
    out.push_back(e);
  }
  return out;
}

const std::string kEmpty = R"({"header":{"revision":"1"}})";

}  // namespace

namespace {

// Enough of etcd for the cluster lock's requests: leases (with expiry on the
// fake clock), keys with create revisions, the queue's transactions, ranges,
// watches for a deletion, revoke. `fault` decides, per request, whether the
// member answers; `at` schedules what other hosts do.
struct MiniEtcd {
  struct Kv {
    std::string value;
    long long create = 0;
    long long lease = 0;
    long long mod = 0;  // 0: as create
  };
  struct Lease {
    long long ttl_ns = 0;
    long long expiry = 0;
  };
  FakeClock& clock;
  FakeTransport transport;
  long long revision = 1;
  long long compacted = 0;  // watches from below it are canceled at once, as etcd's
  long long next_lease = 100;
  std::map<std::string, Kv> kvs;
  std::map<long long, Lease> leases;
  std::vector<std::pair<std::string, long long>> deletes;  // key, revision
  std::multimap<long long, std::function<void()>> scheduled;
  std::function<std::optional<Step>(const Endpoint&, const Request&)> fault;
  long long answer_ns = kMs;

  explicit MiniEtcd(FakeClock& c) : clock(c), transport(c) {
    transport.handler = [this](const Endpoint& ep, const Request& req) { return handle(ep, req); };
  }

  void run_due() {
    while (!scheduled.empty() && scheduled.begin()->first <= clock.t) {
      auto fn = scheduled.begin()->second;
      scheduled.erase(scheduled.begin());
      fn();
    }
    for (auto it = leases.begin(); it != leases.end();) {
      if (it->second.expiry <= clock.t) {
        drop_lease((it++)->first);
      } else {
        ++it;
      }
    }
  }
  void at(long long t, std::function<void()> fn) { scheduled.emplace(t, std::move(fn)); }
  void drop_lease(long long id) {
    leases.erase(id);
    bool any = false;
    for (auto it = kvs.begin(); it != kvs.end();) {
      if (it->second.lease == id) {
        if (!any) ++revision;
        any = true;
        deletes.emplace_back(it->first, revision);
        it = kvs.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Another host's contender key (and lease), as its looplock would make it.
  long long contender(const std::string& name, const std::string& value, long long ttl_ns = 3600 * kSec) {
    return contender_at(lock_prefix(name), value, ttl_ns);
  }
  // A contender under `prefix`: an earlier looplock's (or etcdctl lock's) on
  // legacy_lock_prefix(), say.
  long long contender_at(const std::string& prefix, const std::string& value, long long ttl_ns = 3600 * kSec) {
    const long long id = next_lease++;
    leases[id] = {ttl_ns, clock.t + ttl_ns};
    kvs[prefix + lease_hex(id)] = {value, ++revision, id};
    return id;
  }
  std::vector<std::string> keys_of(long long lease) const {
    std::vector<std::string> out;
    for (const auto& [k, v] : kvs)
      if (v.lease == lease) out.push_back(k);
    return out;
  }

  static std::string b64(const std::string& s) { return base64_encode(s); }
  static std::string unb64(const Json& j) { return base64_decode(j.get<std::string>()).value_or(""); }
  Json kv_json(const std::string& key, const Kv& kv) const {
    return Json{{"key", b64(key)},
                {"value", b64(kv.value)},
                {"create_revision", std::to_string(kv.create)},
                {"mod_revision", std::to_string(kv.mod != 0 ? kv.mod : kv.create)},
                {"lease", std::to_string(kv.lease)}};
  }
  Json range(const Json& q) const {
    const std::string key = unb64(q["key"]);
    const std::string end = q.contains("range_end") ? unb64(q["range_end"]) : "";
    std::vector<std::pair<std::string, Kv>> found;
    for (const auto& [k, v] : kvs) {
      const bool in = end.empty() ? k == key : (k >= key && k < end);
      const long long max_rev =
          q.contains("max_create_revision") ? std::stoll(q["max_create_revision"].get<std::string>()) : 0;
      if (in && (max_rev == 0 || v.create <= max_rev)) found.emplace_back(k, v);
    }
    if (q.value("sort_target", "") == "CREATE") {
      const bool asc = q.value("sort_order", "") == "ASCEND";
      std::sort(found.begin(), found.end(), [&](const auto& a, const auto& b) {
        return asc ? a.second.create < b.second.create : a.second.create > b.second.create;
      });
    }
    Json out{{"header", {{"revision", std::to_string(revision)}}}, {"count", std::to_string(found.size())}};
    const size_t limit = q.contains("limit") ? std::stoul(q["limit"].get<std::string>()) : 0;
    Json arr = Json::array();
    for (size_t i = 0; i < found.size() && (limit == 0 || i < limit); ++i)
      arr.push_back(kv_json(found[i].first, found[i].second));
    if (!arr.empty()) out["kvs"] = arr;
    return out;
  }
  bool compare(const Json& c) const {
    const std::string key = unb64(c["key"]);
    if (c.value("target", "") == "MOD") {  // a guarded write: the key unchanged since (0: absent)
      const long long want = std::stoll(c["mod_revision"].get<std::string>());
      auto it = kvs.find(key);
      return (it == kvs.end() ? 0 : it->second.mod != 0 ? it->second.mod : it->second.create) == want;
    }
    const long long want = std::stoll(c["create_revision"].get<std::string>());
    if (c.contains("range_end")) {
      const std::string end = unb64(c["range_end"]);
      for (const auto& [k, v] : kvs) {
        if (k >= key && k < end && v.create != want) return false;
      }
      return true;
    }
    auto it = kvs.find(key);
    return (it == kvs.end() ? 0 : it->second.create) == want;
  }
  Step txn(const Json& t) {
    bool ok = true;
    for (const auto& c : t["compare"]) ok = ok && compare(c);
    const Json ops = ok ? t.value("success", Json::array()) : t.value("failure", Json::array());
    for (const auto& op : ops) {
      if (op.contains("request_put")) {
        const long long lease = std::stoll(op["request_put"].value("lease", std::string("0")));
        if (lease != 0 && !leases.contains(lease))
          return http(404, R"({"error":"etcdserver: requested lease not found","code":5})");
      }
    }
    bool wrote = false;
    Json responses = Json::array();
    for (const auto& op : ops) {
      if (op.contains("request_put")) {
        const Json& p = op["request_put"];
        if (!wrote) ++revision;
        wrote = true;
        const std::string key = unb64(p["key"]);
        auto it = kvs.find(key);
        const long long create = it == kvs.end() ? revision : it->second.create;
        kvs[key] = {unb64(p["value"]), create, std::stoll(p.value("lease", std::string("0"))), revision};
        responses.push_back(Json{{"response_put", Json::object()}});
      } else {
        responses.push_back(Json{{"response_range", range(op["request_range"])}});
      }
    }
    Json out{{"header", {{"revision", std::to_string(revision)}}}, {"responses", responses}};
    if (ok) out["succeeded"] = true;
    return answer(dump_json(out), answer_ns);
  }
  Step handle(const Endpoint& ep, const Request& req) {
    run_due();
    if (fault) {
      if (auto s = fault(ep, req)) {
        if (s->kind != Step::Delay) return *s;
        if (clock.t + s->took_ns > ns_of(req.deadline)) return silent();
        clock.t += s->took_ns;
        run_due();
      }
    }
    const Json body = Json::parse(req.body);
    const std::string path(req.path);
    if (path == "/v3/lease/grant") {
      const long long id = next_lease++;
      leases[id] = {body["TTL"].get<long long>() * kSec, clock.t + body["TTL"].get<long long>() * kSec};
      ++revision;
      return answer(R"({"header":{},"ID":")" + std::to_string(id) + R"(","TTL":")" +
                        std::to_string(body["TTL"].get<long long>()) + "\"}",
                    answer_ns);
    }
    if (path == "/v3/lease/keepalive") {
      const long long id = std::stoll(body["ID"].get<std::string>());
      auto it = leases.find(id);
      if (it == leases.end()) return answer(R"({"result":{"ID":")" + std::to_string(id) + "\"}}\n", answer_ns);
      it->second.expiry = clock.t + it->second.ttl_ns;  // received now
      return answer(R"({"result":{"ID":")" + std::to_string(id) + R"(","TTL":")" +
                        std::to_string(it->second.ttl_ns / kSec) + "\"}}\n",
                    answer_ns);
    }
    if (path == "/v3/lease/revoke") {
      const long long id = std::stoll(body["ID"].get<std::string>());
      if (!leases.contains(id)) return http(404, R"({"error":"etcdserver: requested lease not found","code":5})");
      drop_lease(id);
      return answer(kEmpty, answer_ns);
    }
    if (path == "/v3/kv/txn") return txn(body);
    if (path == "/v3/kv/range") return answer(dump_json(range(body)), answer_ns);
    if (path == "/v3/watch") {
      const std::string key = unb64(body["create_request"]["key"]);
      const long long from = std::stoll(body["create_request"]["start_revision"].get<std::string>());
      const std::string created =
          "{\"result\":{\"header\":{\"revision\":\"" + std::to_string(revision) + "\"},\"created\":true}}\n";
      // The gateway's deadline (Grpc-Timeout), from the watch's start.
      const long long ends = req.server_timeout ? clock.t + req.server_timeout->count() : 0;
      for (;;) {
        if (from < compacted) {  // compacted meanwhile: etcd cancels the watch
          return answer(
              created + R"({"result":{"canceled":true,"compact_revision":")" + std::to_string(compacted) + "\"}}\n",
              answer_ns);
        }
        for (const auto& [k, rev] : deletes) {
          if (k == key && rev >= from) {
            return answer(created + "{\"result\":{\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"" + b64(key) +
                          "\"}}]}}\n");
          }
        }
        // Nothing yet: the next thing that happens, if it happens before the
        // deadline, or before the gateway ends the stream (Grpc-Timeout):
        // then with an error frame, and the answer is complete.
        long long next = ns_of(req.deadline);
        if (ends != 0) next = std::min(next, ends);
        if (!scheduled.empty()) next = std::min(next, scheduled.begin()->first);
        for (const auto& [id, l] : leases) next = std::min(next, l.expiry);
        if (ends != 0 && next == ends) {
          clock.t = ends;
          return answer(created + R"({"error":{"grpc_code":4,"http_code":504,"message":"context deadline exceeded",)"
                                  R"("http_status":"Gateway Timeout"}})",
                        0);
        }
        if (next >= ns_of(req.deadline)) return silent();
        clock.t = std::max(clock.t, next);
        run_due();
      }
    }
    FAIL("unexpected request " << path);
    return refused();
  }
};

[[maybe_unused]] WaitPlan bounded(long long ns) { return {WaitPlan::Kind::Bounded, looplock::Duration(ns)}; }
const WaitPlan kBlocking{WaitPlan::Kind::Unbounded, looplock::Duration::zero()};
const WaitPlan kNoWait{WaitPlan::Kind::NoWait, looplock::Duration::zero()};
[[maybe_unused]] ClusterHolder me() {
  ClusterHolder h;
  h.host = "h1";
  h.pid = 42;
  h.agent_id = "cron";
  h.operation = "tick.py";
  return h;
}

[[maybe_unused]] Logger quiet_log() { return Logger(Verbosity::Quiet, LogFormat::Text, -1); }

}  // namespace
