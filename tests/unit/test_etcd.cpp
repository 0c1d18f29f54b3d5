// The etcd client and the cluster lock without a network: endpoints, base64,
// request bodies, gateway answers; Client over a scripted Transport (failover,
// rounds, timeouts, errors, authentication); and ClusterLock against a small
// in-memory etcd on a fake clock (the queue, renewals, the lease's deadlines,
// riding out outages), so that the deadline arithmetic is checked exactly and
// without waiting. libcurl's transport is tested in test_etcd_curl.cpp, and the
// whole against a real etcd by tests/integration/test_etcd.py.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <map>

#include "cluster.hpp"
#include "error.hpp"
#include "etcd.hpp"
#include "sys.hpp"
#include "verdict.hpp"

using namespace looplock;
using namespace looplock::etcd;

namespace {
constexpr long long kMs = 1'000'000LL;
constexpr long long kSec = 1000 * kMs;
}  // namespace

TEST_CASE("endpoints") {
  auto p = parse_endpoints("http://127.0.0.1:2379,https://etcd-b:2380/,http://[::1]:2381");
  REQUIRE(p.error.empty());
  REQUIRE(p.endpoints.size() == 3);
  CHECK(p.endpoints[0].host == "127.0.0.1");
  CHECK(p.endpoints[0].port == 2379);
  CHECK_FALSE(p.endpoints[0].tls);
  CHECK(p.endpoints[1].host == "etcd-b");
  CHECK(p.endpoints[1].tls);
  CHECK(p.endpoints[1].text == "https://etcd-b:2380");
  CHECK(p.endpoints[2].host == "::1");
  CHECK(p.endpoints[2].port == 2381);
  for (const char* bad : {"", "127.0.0.1:2379", "ftp://h:1", "https://h", "http://h", "http://h:0", "http://h:65536",
                          "http://:1", "http://h:1,", "http://[::1:1", "http://h:x", "http://a b:1"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_endpoints(bad).error.empty());
    CHECK(parse_endpoints(bad).endpoints.empty());
  }
}

TEST_CASE("base64 round trip and RFC 4648 vectors") {
  CHECK(base64_encode("") == "");
  CHECK(base64_encode("f") == "Zg==");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(base64_encode("foo") == "Zm9v");
  CHECK(base64_encode("foobar") == "Zm9vYmFy");
  CHECK(base64_decode("Zm9vYmE=") == std::optional<std::string>("fooba"));
  CHECK(base64_decode("Zg") == std::optional<std::string>("f"));
  CHECK_FALSE(base64_decode("Z"));
  CHECK_FALSE(base64_decode("Zm9v!"));
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  CHECK(base64_decode(base64_encode(all)) == std::optional<std::string>(all));
}

TEST_CASE("keys and prefix ranges") {
  CHECK(lock_service_name("nightly") == "looplock/nightly/lock");
  CHECK(lock_prefix("nightly") == "looplock/nightly/lock/");
  CHECK(legacy_lock_prefix("nightly") == "looplock/nightly/lock/");
  CHECK(contender_prefixes("nightly") == std::vector<std::string>{"looplock/nightly/lock/"});
  CHECK(holder_key("nightly") == "looplock/nightly/holder");
  // The old holder value lies outside the contenders' prefix.
  CHECK_FALSE(holder_key("n").starts_with(lock_prefix("n")));
  CHECK(prefix_range_end("a/") == "a0");
  CHECK(prefix_range_end(std::string("a\xff", 2)) == "b");
  CHECK(prefix_range_end("") == std::string(1, '\0'));
  CHECK(lease_hex(0x694d5765fc71500b) == "694d5765fc71500b");
}

TEST_CASE("lock names: kept as they are without '/' and '%', else percent-encoded, injectively") {
  // Today's keys for ordinary names (earlier versions and etcdctl lock agree).
  for (const char* kept : {"x", "nightly", "a b", "x.lock.y", "\xc3\xa9t\xc3\xa9", "\xe2\x9c\x93", "-"}) {
    CAPTURE(kept);
    CHECK(lock_key_name(kept) == kept);
    CHECK_FALSE(lock_name_encoded(kept));
    CHECK(contender_prefixes(kept).size() == 1);
  }
  CHECK(lock_key_name("x/lock/y") == "x%2Flock%2Fy");
  CHECK(lock_key_name("%") == "%25");
  CHECK(lock_key_name("/") == "%2F");
  CHECK(lock_key_name("a//b") == "a%2F%2Fb");
  CHECK(lock_key_name("x%2Flock%2Fy") == "x%252Flock%252Fy");
  CHECK(lock_key_name("50%/\xc3\xa9") == "50%25%2F\xc3\xa9");
  CHECK(lock_prefix("x/lock/y") == "looplock/x%2Flock%2Fy/lock/");
  CHECK(legacy_lock_prefix("x/lock/y") == "looplock/x/lock/y/lock/");
  CHECK(contender_prefixes("x/lock/y") ==
        std::vector<std::string>{"looplock/x%2Flock%2Fy/lock/", "looplock/x/lock/y/lock/"});
  CHECK(lock_name_encoded("%"));
  CHECK(lock_name_encoded("/"));
  // A name that is another's encoding has no legacy prefix of its own: the
  // unencoded "looplock/x%2Flock%2Fy/lock/" is where "x/lock/y" keeps its keys now.
  CHECK(is_lock_key_name("x%2Flock%2Fy"));
  CHECK(is_lock_key_name("%25"));
  CHECK(is_lock_key_name("plain"));
  CHECK(contender_prefixes("x%2Flock%2Fy") == std::vector<std::string>{"looplock/x%252Flock%252Fy/lock/"});
  CHECK(legacy_lock_prefix("x%2Flock%2Fy") == lock_prefix("x/lock/y"));
  for (const char* odd : {"50%", "%2f", "%41", "%2", "a%2Fb/c"}) {
    CAPTURE(odd);
    CHECK_FALSE(is_lock_key_name(odd));
    CHECK(contender_prefixes(odd).size() == 2);
  }

  // Injective over tricky names, and no name's keys under another's prefix.
  const std::vector<std::string> names = {"x",
                                          "x/lock/y",
                                          "x%2Flock%2Fy",
                                          "x%2Flock%2Fy/lock/z",
                                          "%",
                                          "%25",
                                          "%2F",
                                          "/",
                                          "//",
                                          "a//b",
                                          "a/b",
                                          "a%2Fb",
                                          "a%252Fb",
                                          "x/lock",
                                          "x/lock/",
                                          "lock",
                                          "x/y/lock",
                                          "\xc3\xa9t\xc3\xa9/\xe2\x9c\x93",
                                          "\xc3\xa9t\xc3\xa9%2F\xe2\x9c\x93",
                                          "a b/c",
                                          " ",
                                          "y/lock/x",
                                          "50%",
                                          "%2f",
                                          "%2F%",
                                          "50%/x"};
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string key = lock_prefix(names[i]) + lease_hex(0x694d5765fc71500b);
    CHECK(is_contender_key(lock_prefix(names[i]), key));
    CHECK(lock_key_name(names[i]).find('/') == std::string::npos);
    for (size_t j = 0; j < names.size(); ++j) {
      if (i == j) continue;
      CAPTURE(names[i]);
      CAPTURE(names[j]);
      CHECK(lock_key_name(names[i]) != lock_key_name(names[j]));
      CHECK_FALSE(key.starts_with(lock_prefix(names[j])));
      // An encoded name's key under its legacy prefix too: another name's
      // keys may lie under either prefix, but never as contenders.
      for (const auto& mine : contender_prefixes(names[i])) {
        for (const auto& p : contender_prefixes(names[j])) {
          CHECK_FALSE(is_contender_key(p, mine + lease_hex(0x694d5765fc71500b)));
        }
      }
    }
  }
  // The legacy layout collides: "x/lock/y"'s key lies under "x"'s prefix. A
  // contender is the prefix and the lease id, nothing deeper.
  const std::string legacy_key = legacy_lock_prefix("x/lock/y") + "694d5765fc71500b";
  CHECK(legacy_key.starts_with(lock_prefix("x")));
  CHECK_FALSE(is_contender_key(lock_prefix("x"), legacy_key));
  CHECK(is_contender_key(legacy_lock_prefix("x/lock/y"), legacy_key));
  CHECK(is_contender_key("p/", "p/1"));
  CHECK_FALSE(is_contender_key("p/", "p/"));
  CHECK_FALSE(is_contender_key("p/", "q/1"));
  CHECK_FALSE(is_contender_key("p/", "p/1/"));
}

TEST_CASE("contenders: by create revision, each once, nothing deeper than a lease id") {
  const std::vector<std::string> prefixes = contender_prefixes("a/b");
  auto kv = [](std::string key, long long rev) { return KeyValue{std::move(key), "", rev, rev, 1}; };
  RangeResult encoded{10, {kv("looplock/a%2Fb/lock/7", 5), kv("looplock/a%2Fb/lock/9", 8)}, 2};
  RangeResult legacy{10,
                     {kv("looplock/a/b/lock/3", 3), kv("looplock/a/b/lock/7", 5), kv("looplock/a/b/lock/c/lock/4", 4),
                      kv("looplock/a/b/lock/9", 8)},
                     4};
  auto q = contenders(prefixes, {encoded, legacy});
  REQUIRE(q.size() == 3);
  CHECK(q[0].key == "looplock/a/b/lock/3");    // an earlier looplock's, or etcdctl lock's: first
  CHECK(q[1].key == "looplock/a%2Fb/lock/7");  // a new contender's two keys: once, the encoded one
  CHECK(q[2].key == "looplock/a%2Fb/lock/9");
  CHECK(contenders(prefixes, {}).empty());
}

TEST_CASE("cluster lock name: --lock-name, else DIR's base name, '/' for the root") {
  CHECK(cluster_lock_name("", "") == "/");  // DIR=/ (its canonical path without the trailing '/')
  CHECK(cluster_lock_name("", "/srv/loops/nightly") == "nightly");
  CHECK(cluster_lock_name("given", "/srv/loops/nightly") == "given");
  CHECK(cluster_lock_name("given", "") == "given");
  CHECK(cluster_lock_name("", "/srv/a b") == "a b");
  try {
    cluster_lock_name("", "/srv/bad\nname");
    FAIL("no throw");
  } catch (const Fatal& f) {
    CHECK(f.status() == 64);
    CHECK(std::string(f.hint()).find("--lock-name") != std::string::npos);
  }
}

TEST_CASE("request bodies") {
  CHECK(Json::parse(lease_grant_body(10)) == Json::parse(R"({"TTL":10})"));
  CHECK(Json::parse(lease_id_body(7587)) == Json::parse(R"({"ID":"7587"})"));
  CHECK(Json::parse(range_body({"foo"})) == Json::parse(R"({"key":"Zm9v"})"));
  CHECK(Json::parse(range_body({"a/", true})) == Json::parse(R"({"key":"YS8=","range_end":"YTA="})"));
  CHECK(Json::parse(range_body({"a/", true, 2, RangeQuery::Order::LastCreated, 41})) ==
        Json::parse(R"({"key":"YS8=","range_end":"YTA=","limit":"2","sort_order":"DESCEND","sort_target":"CREATE",
                        "max_create_revision":"41"})"));
  CHECK(Json::parse(put_body("k", "v", 5)) == Json::parse(R"({"key":"aw==","value":"dg==","lease":"5"})"));
  CHECK(Json::parse(put_body("k", "v", 0)) == Json::parse(R"({"key":"aw==","value":"dg=="})"));
  CHECK(Json::parse(authenticate_body("u", "p w")) == Json::parse(R"({"name":"u","password":"p w"})"));
  CHECK(Json::parse(watch_delete_body("k", 12)) ==
        Json::parse(R"({"create_request":{"key":"aw==","start_revision":"12","filters":["NOPUT"]}})"));

  // Join the queue: create our key if absent; read every contender in the
  // same transaction.
  auto q = Json::parse(queue_txn_body({"a/1"}, "v", 1, {"a/"}));
  CHECK(q["compare"] == Json::parse(R"([{"key":"YS8x","target":"CREATE","result":"EQUAL","create_revision":"0"}])"));
  CHECK(q["success"].size() == 2);
  CHECK(q["success"][0] == Json::parse(R"({"request_put":{"key":"YS8x","value":"dg==","lease":"1"}})"));
  CHECK(q["success"][1] == Json::parse(R"({"request_range":{"key":"YS8=","range_end":"YTA=","sort_order":"ASCEND",
                                                            "sort_target":"CREATE"}})"));
  CHECK(q["failure"][0] == Json::parse(R"({"request_range":{"key":"YS8x"}})"));
  CHECK(q["failure"][1] == q["success"][1]);
  // An encoded name: both keys in one transaction (one create revision), both prefixes read.
  auto q2 = Json::parse(queue_txn_body({"a/1", "b/1"}, "v", 1, {"a/", "b/"}));
  CHECK(q2["compare"].size() == 1);
  CHECK(q2["success"].size() == 4);
  CHECK(q2["success"][1]["request_put"]["key"] == "Yi8x");
  CHECK(q2["success"][3]["request_range"]["key"] == "Yi8=");
  CHECK(q2["failure"].size() == 3);
  // single_flight: only when nothing is under any prefix (a compare on each range).
  auto f = Json::parse(create_if_free_txn_body({"a/1", "b/1"}, "v", 1, {"a/", "b/"}));
  CHECK(f["compare"].size() == 2);
  CHECK(f["compare"][0]["range_end"] == "YTA=");
  CHECK(f["compare"][0]["create_revision"] == "0");
  CHECK(f["compare"][1]["range_end"] == "YjA=");
  CHECK(f["success"].size() == 2);
  CHECK(f["failure"].size() == 2);
  CHECK(f["failure"][0]["request_range"]["sort_target"] == "CREATE");
  auto u = Json::parse(update_txn_body({"a/1", "b/1"}, "v", 1, 17));
  CHECK(u["compare"].size() == 1);
  CHECK(u["compare"][0]["create_revision"] == "17");
  CHECK(u["success"].size() == 2);
  CHECK_FALSE(u.contains("failure"));
}

TEST_CASE("gateway answers") {
  auto grant = parse_answer(R"({"header":{"revision":"3"},"ID":"7587862071533449230","TTL":"10"})");
  REQUIRE(grant);
  CHECK(parse_lease_grant(*grant) == 7587862071533449230LL);
  CHECK_FALSE(parse_lease_grant(*parse_answer(R"({"header":{}})")));
  CHECK_FALSE(parse_lease_grant(*parse_answer(R"({"ID":"1","error":"too many"})")));

  // Keepalive: {"result":{...}}; TTL left out = 0 = gone.
  auto ka = parse_answer("{\"result\":{\"ID\":\"5\",\"TTL\":\"9\"}}\n");
  REQUIRE(ka);
  CHECK(parse_keepalive_ttl(*ka) == 9);
  CHECK(parse_keepalive_ttl(*parse_answer("{\"result\":{\"ID\":\"5\"}}\n")) == 0);
  CHECK(parse_keepalive_ttl(*parse_answer(R"({"result":{"ID":"5","TTL":"-1"}})")) == 0);

  auto range = parse_answer(
      R"({"header":{"revision":"14"},"kvs":[{"key":"aw==","create_revision":"12","mod_revision":"13","version":"2","value":"dg==","lease":"99"}],"count":"3"})");
  REQUIRE(range);
  auto r = parse_range(*range);
  REQUIRE(r);
  CHECK(r->revision == 14);
  CHECK(r->count == 3);
  REQUIRE(r->kvs.size() == 1);
  CHECK(r->kvs[0].key == "k");
  CHECK(r->kvs[0].value == "v");
  CHECK(r->kvs[0].create_revision == 12);
  CHECK(r->kvs[0].mod_revision == 13);
  CHECK(r->kvs[0].lease == 99);
  CHECK(parse_range(*parse_answer(R"({"header":{}})"))->kvs.empty());
  CHECK_FALSE(parse_range(*parse_answer(R"({"kvs":[{"key":"!!"}]})")));
  CHECK_FALSE(parse_answer("not json"));
  CHECK_FALSE(parse_answer("[1]"));
  CHECK(int64_field(Json::parse(R"({"a":"x"})"), "a") == std::nullopt);

  // A txn as etcd 3.4's gateway answers it (succeeded left out when false).
  auto txn = parse_txn(*parse_answer(
      R"({"header":{"revision":"2"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"2"}}},)"
      R"({"response_range":{"header":{"revision":"2"},"kvs":[{"key":"YS8x","create_revision":"2","mod_revision":"2",)"
      R"("version":"1","value":"aGk=","lease":"4111120368451121161"}],"count":"1"}}]})"));
  REQUIRE(txn);
  CHECK(txn->succeeded);
  CHECK(txn->revision == 2);
  REQUIRE(txn->ranges.size() == 1);
  CHECK(txn->ranges[0].kvs.at(0).key == "a/1");
  CHECK_FALSE(parse_txn(*parse_answer(R"({"header":{"revision":"2"},"responses":[]})"))->succeeded);
  CHECK(parse_token(*parse_answer(R"({"header":{},"token":"abc.123"})")) == std::optional<std::string>("abc.123"));
  CHECK_FALSE(parse_token(*parse_answer(R"({"header":{}})")));
}

TEST_CASE("watch streams") {
  const std::string created = "{\"result\":{\"header\":{\"revision\":\"2\"},\"created\":true}}\n";
  CHECK(parse_watch(created).created);
  CHECK_FALSE(parse_watch(created).deleted);
  auto w = parse_watch(created + "{\"result\":{\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"aw==\"}}]}}\n");
  CHECK(w.deleted);
  CHECK_FALSE(w.canceled);
  CHECK_FALSE(parse_watch(created + "{\"result\":{\"events\":[{\"type\":\"DELE").deleted);  // not a whole line yet
  auto c = parse_watch(created + "{\"result\":{\"canceled\":true,\"compact_revision\":\"9\"}}\n");
  CHECK(c.canceled);
  CHECK(c.reason == "compacted");
  CHECK(parse_watch("{\"error\":{\"grpc_code\":14,\"message\":\"no leader\"}}\n").canceled);
  CHECK(parse_watch("nonsense\n").malformed);
}

namespace {

// Time that only moves when told: a transport's step takes its time, a
// pause takes its time.
struct FakeClock : Clock {
  long long t = 1'000 * kSec;
  std::vector<long long> sleeps;
  long long now_ns() override { return t; }
  void sleep_until(long long until) override {
    sleeps.push_back(until - t);
    t = std::max(t, until);
  }
};

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
Step answer(std::string body, long long took = kMs) { return {Step::Answer, 200, std::move(body), took}; }
Step http(int status, std::string body) { return {Step::Answer, status, std::move(body), kMs}; }
Step refused() { return {Step::Refused, 0, "", 0}; }
Step connect_timeout() { return {Step::ConnectTimeout, 0, "", 0}; }
Step silent() { return {Step::Silent, 0, "", 0}; }
Step signal_pending() { return {Step::Signal, 0, "", 0}; }

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
    calls.push_back({ep.text + std::string(req.path), std::string(req.path), std::string(req.body),
                     std::string(req.token), clock.t, req.connect_deadline_ns, req.deadline_ns, bool(req.enough),
                     req.fresh_connection});
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
        clock.t = std::max(clock.t, req.connect_deadline_ns);
        error = ep.text + ": connection timed out";
        return Exchange::ConnectFailed;
      case Step::Silent:
        clock.t = std::max(clock.t, req.deadline_ns);
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
    if (clock.t + s.took_ns > req.deadline_ns) {  // it would have answered too late
      clock.t = req.deadline_ns;
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

TEST_CASE("client: a signal of interrupt_on ends the call at once, no other endpoint tried, no retry") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {signal_pending()};
  Client c(t, endpoints(3), clock);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  const long long start = clock.t;
  auto r = c.lease_keepalive(7, {start + 10 * kSec, kSec, false, &usr1});
  CHECK(r.status == Status::Interrupted);
  CHECK(status_name(r.status) == "interrupted");
  REQUIRE(t.calls.size() == 1);
  CHECK(clock.t - start < kSec);
}

TEST_CASE("client: the next endpoint when one refuses, and it is tried first afterwards") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {refused(), answer(R"({"ID":"7","TTL":"10"})"), answer(kEmpty)};
  Client c(t, endpoints(2), clock);
  auto r = c.lease_grant(10, {clock.t + kSec, 0});
  REQUIRE(r.ok());
  CHECK(r.value == 7);
  CHECK(c.current_endpoint() == "http://10.0.0.2:2379");
  CHECK(c.lease_revoke(7, {clock.t + kSec, 0}).ok());
  REQUIRE(t.calls.size() == 3);
  CHECK(t.calls[0].url == "http://10.0.0.1:2379/v3/lease/grant");
  CHECK(t.calls[1].url == "http://10.0.0.2:2379/v3/lease/grant");
  CHECK(t.calls[1].body == R"({"TTL":10})");
  CHECK(t.calls[2].url == "http://10.0.0.2:2379/v3/lease/revoke");
  CHECK(clock.sleeps.empty());  // no pause within a round
}

TEST_CASE("client: a blackholed endpoint costs one short connect timeout, growing only for that endpoint") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {connect_timeout(), answer(kEmpty), connect_timeout(), connect_timeout(), answer(kEmpty)};
  Client c(t, endpoints(2), clock);
  const long long t0 = clock.t;
  REQUIRE(c.range({"k"}, {t0 + 5 * kSec, 0}).ok());
  CHECK(t.calls[0].connect_deadline_ns - t.calls[0].at == Client::kConnectNs);
  CHECK(clock.t - t0 == Client::kConnectNs + kMs);  // 40 ms lost, not a second
  // The second endpoint answered: it comes first. When it times out too, the
  // first gets twice its connect timeout, and after a pause so does the second.
  REQUIRE(c.range({"k"}, {clock.t + 5 * kSec, 0}).ok());
  CHECK(t.calls[2].url.starts_with("http://10.0.0.2"));
  CHECK(t.calls[3].connect_deadline_ns - t.calls[3].at == 2 * Client::kConnectNs);
  CHECK(t.calls[4].connect_deadline_ns - t.calls[4].at == 2 * Client::kConnectNs);
  CHECK(clock.sleeps == std::vector<long long>{25 * kMs});
}

TEST_CASE("client: nothing reachable is retried in rounds, pausing longer each time, until the deadline") {
  FakeClock clock;
  FakeTransport t(clock);
  t.handler = [](const Endpoint&, const Request&) { return refused(); };
  Client c(t, endpoints(2), clock);
  const long long t0 = clock.t;
  auto r = c.range({"k"}, {t0 + 1 * kSec, 0});
  CHECK(r.status == Status::Unavailable);
  CHECK(r.error.find("10.0.0.1") != std::string::npos);
  CHECK(r.error.find("10.0.0.2") != std::string::npos);
  CHECK(clock.t == t0 + kSec);  // returns at the deadline, not after it
  REQUIRE(clock.sleeps.size() >= 5);
  CHECK(clock.sleeps[0] == 25 * kMs);
  CHECK(clock.sleeps[1] == 50 * kMs);
  CHECK(clock.sleeps[4] == 400 * kMs);
}

TEST_CASE("client: a timed-out attempt goes to the next endpoint, on a fresh connection next time") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {silent(), answer(R"({"result":{"ID":"7","TTL":"3"}})"), answer(R"({"result":{"ID":"7","TTL":"3"}})"),
              answer(R"({"result":{"ID":"7","TTL":"3"}})")};
  Client c(t, endpoints(2), clock);
  const long long t0 = clock.t;
  auto r = c.lease_keepalive(7, {t0 + 2 * kSec, 300 * kMs});
  REQUIRE(r.ok());
  CHECK(r.value == 3);
  CHECK(t.calls[0].deadline_ns == t0 + 300 * kMs);  // the attempt's bound, not the call's
  CHECK(t.calls[1].url.starts_with("http://10.0.0.2"));
  CHECK(r.sent_ns == t0 + 300 * kMs);  // when the attempt that succeeded began
  CHECK_FALSE(t.calls[1].fresh);
  // The endpoint that went silent is no longer the first; when it is used
  // again, its kept connection is not.
  REQUIRE(c.lease_keepalive(7, {clock.t + kSec, 300 * kMs}).ok());
  CHECK(t.calls[2].url.starts_with("http://10.0.0.2"));
}

TEST_CASE("client: attempt timeouts double each round (a slow but healthy cluster is reached)") {
  FakeClock clock;
  FakeTransport t(clock);
  t.handler = [&](const Endpoint&, const Request&) { return answer(kEmpty, 500 * kMs); };  // each answer takes 500 ms
  Client c(t, endpoints(1), clock);
  const long long t0 = clock.t;
  auto r = c.range({"k"}, {t0 + 5 * kSec, 200 * kMs});
  REQUIRE(r.ok());
  REQUIRE(t.calls.size() == 3);  // 200 ms, 400 ms, then 800 ms is enough
  CHECK(t.calls[1].fresh);
  CHECK(t.calls[2].deadline_ns - t.calls[2].at == 800 * kMs);
}

TEST_CASE("client: transient errors go to the next member; definitive ones end the call") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {http(503, R"({"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14})"),
              answer(kEmpty),
              http(404, R"({"error":"etcdserver: requested lease not found","code":5})"),
              answer(R"({"error":{"grpc_code":5,"message":"requested lease not found"}})"),
              {Step::Answer, 200, "not json", kMs},
              answer(kEmpty)};
  Client c(t, endpoints(2), clock);
  REQUIRE(c.range({"k"}, {clock.t + kSec, 0}).ok());
  CHECK(t.calls[1].url.starts_with("http://10.0.0.2"));
  auto a = c.txn("{}", {clock.t + kSec, 0});
  CHECK(a.status == Status::Failed);
  CHECK(a.code == 5);
  CHECK(a.error.find("HTTP 404: etcdserver: requested lease not found") != std::string::npos);
  auto b = c.lease_keepalive(7, {clock.t + kSec, 0});  // a stream's error frame
  CHECK(b.status == Status::Failed);
  CHECK(b.error.find("requested lease not found") != std::string::npos);
  CHECK(c.range({"k"}, {clock.t + kSec, 0}).ok());  // unreadable: another member
  CHECK(t.calls.size() == 6);
}

TEST_CASE("client: revoking a lease that is gone already is fine") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {http(404, R"({"error":"etcdserver: requested lease not found","code":5})")};
  Client c(t, endpoints(1), clock);
  CHECK(c.lease_revoke(7, {clock.t + kSec, 0}).ok());
}

TEST_CASE("client: a deadline already passed sends nothing") {
  FakeClock clock;
  FakeTransport t(clock);
  Client c(t, endpoints(2), clock);
  auto r = c.range({"k"}, {clock.t - 1, 0});
  CHECK(r.status == Status::Unavailable);
  CHECK(t.calls.empty());
}

TEST_CASE("client: a watch waits until its deadline without retrying, and reports the deletion") {
  FakeClock clock;
  FakeTransport t(clock);
  const std::string created = "{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n";
  t.script = {silent(), answer(created + "{\"result\":{\"events\":[{\"type\":\"DELETE\",\"kv\":{}}]}}\n")};
  Client c(t, endpoints(2), clock);
  const long long t0 = clock.t;
  auto w = c.watch_delete("k", 6, {t0 + 300 * kMs, 0});
  CHECK(w.status == Status::Timeout);
  CHECK(clock.t == t0 + 300 * kMs);
  CHECK(t.calls.size() == 1);
  CHECK(t.calls[0].stream);
  CHECK(Json::parse(t.calls[0].body)["create_request"]["start_revision"] == "6");
  auto d = c.watch_delete("k", 6, {clock.t + kSec, 0});
  REQUIRE(d.ok());
  CHECK(d.value);
}

TEST_CASE("client: etcd authentication: a token first, on every request, renewed when etcd rejects it") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {answer(R"({"header":{},"token":"tok1"})"), answer(kEmpty),
              http(401, R"({"error":"etcdserver: invalid auth token","code":16})"),
              answer(R"({"header":{},"token":"tok2"})"), answer(kEmpty)};
  Client c(t, endpoints(1), clock);
  c.set_credentials("loop", "s3cret");
  REQUIRE(c.range({"k"}, {clock.t + kSec, 0}).ok());
  CHECK(t.calls[0].path == "/v3/auth/authenticate");
  CHECK(Json::parse(t.calls[0].body) == Json::parse(R"({"name":"loop","password":"s3cret"})"));
  CHECK(t.calls[0].token.empty());
  CHECK(t.calls[1].token == "tok1");
  REQUIRE(c.range({"k"}, {clock.t + kSec, 0}).ok());
  CHECK(t.calls[3].path == "/v3/auth/authenticate");
  CHECK(t.calls[4].token == "tok2");
}

TEST_CASE("client: a wrong password fails with a hint and never shows the password") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {http(400, R"({"error":"etcdserver: authentication failed, invalid user ID or password","code":3})")};
  Client c(t, endpoints(1), clock);
  c.set_credentials("loop", "s3cret");
  auto r = c.range({"k"}, {clock.t + kSec, 0});
  CHECK(r.status == Status::Failed);
  CHECK(r.error.find("cannot log in as etcd user loop") != std::string::npos);
  CHECK(r.error.find("s3cret") == std::string::npos);
  CHECK(r.cause == Cause::BadCredentials);
  CHECK(t.calls.size() == 1);
}

TEST_CASE("client: with authentication disabled on etcd, requests go without a token") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {http(400, R"({"error":"etcdserver: authentication is not enabled","code":9})"), answer(kEmpty),
              answer(kEmpty)};
  Client c(t, endpoints(1), clock);
  c.set_credentials("loop", "s3cret");
  REQUIRE(c.range({"k"}, {clock.t + kSec, 0}).ok());
  REQUIRE(c.range({"k"}, {clock.t + kSec, 0}).ok());
  CHECK(t.calls.size() == 3);
  CHECK(t.calls[2].token.empty());
}

TEST_CASE("client: a TLS failure tries the next endpoint and keeps the reason and the hint") {
  FakeClock clock;
  FakeTransport t(clock);
  t.handler = [](const Endpoint&, const Request&) { return Step{Step::TlsError, 0, "", 0}; };
  Client c(t, endpoints(2), clock);
  auto r = c.range({"k"}, {clock.t + 100 * kMs, 0});
  CHECK(r.status == Status::Unavailable);
  CHECK(r.error.find("TLS: certificate verify failed") != std::string::npos);
  CHECK(r.cause == Cause::TlsRejected);
  CHECK(r.cause_endpoint.starts_with("http://"));
}

// -- the cluster lock against a small etcd in memory ------------------------

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
  };
  struct Lease {
    long long ttl_ns = 0;
    long long expiry = 0;
  };
  FakeClock& clock;
  FakeTransport transport;
  long long revision = 1;
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
                {"mod_revision", std::to_string(kv.create)},
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
        kvs[key] = {unb64(p["value"]), create, std::stoll(p.value("lease", std::string("0")))};
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
        if (clock.t + s->took_ns > req.deadline_ns) return silent();
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
      for (;;) {
        for (const auto& [k, rev] : deletes) {
          if (k == key && rev >= from) {
            return answer(created + "{\"result\":{\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"" + b64(key) +
                          "\"}}]}}\n");
          }
        }
        // Nothing yet: the next thing that happens, if it happens before the deadline.
        long long next = req.deadline_ns;
        if (!scheduled.empty()) next = std::min(next, scheduled.begin()->first);
        for (const auto& [id, l] : leases) next = std::min(next, l.expiry);
        if (next >= req.deadline_ns) return silent();
        clock.t = std::max(clock.t, next);
        run_due();
      }
    }
    FAIL("unexpected request " << path);
    return refused();
  }
};

WaitPlan bounded(long long ns) { return {WaitPlan::Kind::Bounded, ns}; }
const WaitPlan kBlocking{WaitPlan::Kind::Unbounded, 0};
ClusterHolder me() { return {"h1", 42, "cron", "tick.py", {}, {}, 0}; }

Logger quiet_log() { return Logger(Verbosity::Quiet, LogFormat::Text, -1); }

}  // namespace

TEST_CASE("lease timing: the numbers of the man page") {
  using namespace lease_timing;
  CHECK(margin_ns(3) == 230 * kMs);
  CHECK(margin_ns(10) == 300 * kMs);
  CHECK(renewal_interval_ns(3) == 250 * kMs);
  CHECK(renewal_interval_ns(10) == 833'333'333LL);
  CHECK(attempt_ns(2) == 250 * kMs);
  CHECK(attempt_ns(3) == 300 * kMs);
  CHECK(attempt_ns(60) == 2 * kSec);
  CHECK(default_kill_after_ns(3) == 500 * kMs);
  CHECK(default_kill_after_ns(10) == 1'666'666'666LL);
  CHECK(default_kill_after_ns(60) == 5 * kSec);
  // At --ttl 3 with the defaults, an outage that begins just before a
  // renewal is due may last this long without TERM: more than a 3-member
  // cluster's leader election (1 to 2 s with etcd's default timeouts).
  CHECK(ttl_ns(3) - default_kill_after_ns(3) - margin_ns(3) - renewal_interval_ns(3) == 2020 * kMs);
  CHECK(max_kill_after_ns(3) == 1770 * kMs);
  for (int ttl : {2, 3, 5, 10, 30, 86400}) {
    CAPTURE(ttl);
    CHECK(default_kill_after_ns(ttl) <= max_kill_after_ns(ttl));
    CHECK(max_kill_after_ns(ttl) > 0);
  }
}

TEST_CASE("cluster lock: uncontended, two requests; the deadlines count from the grant's sending") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  etcd.answer_ns = 20 * kMs;  // every answer takes 20 ms
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(3), "nightly", 3, 600 * kMs, log, {}, clock);
  const long long t0 = clock.t;
  REQUIRE(lock.acquire(bounded(5 * kSec), t0, me()) == Acquisition::Acquired);
  CHECK(etcd.transport.calls.size() == 2);  // grant, then the queue's txn
  CHECK(etcd.transport.calls[1].path == "/v3/kv/txn");
  CHECK(lock.key() == "looplock/nightly/lock/" + lease_hex(lock.lease()));
  CHECK(lock.fencing_token() == etcd.kvs.at(lock.key()).create);
  // The holder value is the key's own value, written by the same transaction.
  auto value = parse_cluster_holder(etcd.kvs.at(lock.key()).value);
  REQUIRE(value);
  CHECK((*value)["pid"] == 42);
  CHECK((*value)["lease"] == lease_hex(lock.lease()));
  // Expiry: when the grant was sent (t0), not when it came back (t0 + 20 ms).
  CHECK(lock.expiry_ns() == t0 + 3 * kSec);
  CHECK(lock.kill_by_ns() == t0 + 3 * kSec - 230 * kMs);
  CHECK(lock.term_by_ns() == t0 + 3 * kSec - 230 * kMs - 600 * kMs);
  CHECK(lock.next_renewal_ns() == t0 + 250 * kMs);
  lock.release();
  CHECK(etcd.transport.calls.back().path == "/v3/lease/revoke");
  CHECK(etcd.kvs.empty());  // revoking the lease deleted the key: one write for the release
  CHECK(etcd.transport.calls.size() == 3);
}

TEST_CASE("cluster lock: a slow keepalive moves the expiry to when it was sent") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, 600 * kMs, log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), clock.t, me()) == Acquisition::Acquired);
  clock.t = lock.next_renewal_ns();
  const long long sent = clock.t;
  etcd.answer_ns = 250 * kMs;  // answered, slowly (within the 300 ms attempt)
  REQUIRE(lock.renew(lock.term_by_ns()));
  CHECK(clock.t == sent + 250 * kMs);
  CHECK(lock.expiry_ns() == sent + 3 * kSec);
  CHECK(lock.term_by_ns() == sent + 3 * kSec - 830 * kMs);
  CHECK(lock.next_renewal_ns() == sent + 250 * kMs);
}

TEST_CASE("cluster lock: renew fails over within its bound and returns by it") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(3), "n", 3, 600 * kMs, log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), clock.t, me()) == Acquisition::Acquired);
  const std::string first = etcd.transport.calls.back().url.substr(0, 20);
  // The member that answered so far goes silent (blackholed, connection kept).
  etcd.fault = [&](const Endpoint& ep, const Request&) -> std::optional<Step> {
    if (ep.text == "http://10.0.0.1:2379") return silent();
    return std::nullopt;
  };
  clock.t = lock.next_renewal_ns();
  const long long t1 = clock.t;
  REQUIRE(lock.renew(lock.term_by_ns()));
  CHECK(lock.expiry_ns() == t1 + 300 * kMs + 3 * kSec);  // the second attempt began 300 ms later
  CHECK(lock.endpoint() == "http://10.0.0.2:2379");
  // Every member silent: renew gives up at its bound, the deadlines unmoved.
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> { return silent(); };
  const long long term_by = lock.term_by_ns();
  clock.t = lock.next_renewal_ns();
  REQUIRE(lock.renew(clock.t + 700 * kMs));
  CHECK(clock.t <= clock.t);
  CHECK(lock.term_by_ns() == term_by);
  CHECK(lock.next_renewal_ns() <= clock.t + 25 * kMs);
}

TEST_CASE("cluster lock: a leader election shorter than the outage tolerance does not lose the lease") {
  // TTL 3, default kill-after: the leader dies just before the next renewal
  // is due, and a new one takes `election` to come up. Meanwhile the dead
  // leader's port refuses, and the followers either say "no leader" at once
  // or hold the keepalive until the new leader answers it (etcd 3.4 forwards
  // a follower's keepalives to the leader), or one of them is blackholed.
  enum Mode { NoLeader, Held, Blackholed };
  for (Mode mode : {NoLeader, Held, Blackholed}) {
    for (long long election : {1000 * kMs, 1600 * kMs, 1900 * kMs}) {
      CAPTURE(mode);
      CAPTURE(election);
      FakeClock clock;
      MiniEtcd etcd(clock);
      Logger log = quiet_log();
      ClusterLock lock(etcd.transport, endpoints(3), "n", 3, lease_timing::default_kill_after_ns(3), log, {}, clock);
      REQUIRE(lock.acquire(bounded(5 * kSec), clock.t, me()) == Acquisition::Acquired);
      const long long start = lock.next_renewal_ns() - kMs;
      const long long election_end = start + election;
      const std::string alive = "{\"result\":{\"ID\":\"" + std::to_string(lock.lease()) + "\",\"TTL\":\"3\"}}\n";
      etcd.fault = [&](const Endpoint& ep, const Request&) -> std::optional<Step> {
        if (clock.t >= election_end) return std::nullopt;
        if (ep.text == "http://10.0.0.1:2379") return refused();  // the dead leader
        if (mode == Blackholed && ep.text == "http://10.0.0.2:2379") return silent();
        if (mode == NoLeader) return http(503, R"({"error":"etcdserver: no leader","code":14})");
        return answer(alive, election_end - clock.t + kMs);  // held until the new leader answers
      };
      // The job loop: renew when due, never past the TERM deadline.
      bool terminated = false;
      while (clock.t < start + 6 * kSec) {
        if (clock.t >= lock.term_by_ns()) {
          terminated = true;
          break;
        }
        if (clock.t >= lock.next_renewal_ns()) {
          REQUIRE(lock.renew(lock.term_by_ns()));
          continue;
        }
        clock.t = std::min(lock.next_renewal_ns(), lock.term_by_ns());
      }
      CHECK_FALSE(terminated);
      CHECK(lock.expiry_ns() > election_end);
    }
  }
}

TEST_CASE("cluster lock: an outage longer than the tolerance ends in TERM before etcd's expiry") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(3), "n", 3, lease_timing::default_kill_after_ns(3), log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), clock.t, me()) == Acquisition::Acquired);
  const long long last_sent = lock.expiry_ns() - 3 * kSec;
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> { return silent(); };
  while (clock.t < lock.term_by_ns()) {
    if (clock.t >= lock.next_renewal_ns()) {
      REQUIRE(lock.renew(lock.term_by_ns()));
      CHECK(clock.t <= lock.term_by_ns());  // renew returns by its bound
      continue;
    }
    clock.t = std::min(lock.next_renewal_ns(), lock.term_by_ns());
  }
  CHECK(lock.term_by_ns() == last_sent + 3 * kSec - 230 * kMs - 500 * kMs);
  CHECK(lock.kill_by_ns() < last_sent + 3 * kSec);  // and etcd expires it no earlier than it received the grant
}

TEST_CASE("cluster lock: etcd says the lease is gone: renew is false, with the reason") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, 600 * kMs, log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), clock.t, me()) == Acquisition::Acquired);
  etcd.drop_lease(lock.lease());  // revoked by an operator
  clock.t = lock.next_renewal_ns();
  CHECK(lock.lost_at_ns() == 0);
  CHECK_FALSE(lock.renew(lock.term_by_ns()));
  CHECK(lock.lost());
  CHECK(lock.lost_at_ns() == clock.t);
  CHECK(lock.lost_why().find("gone") != std::string::npos);
}

TEST_CASE("cluster lock: unanswered renewals leave term_by where it was; then the loss is declared") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(2), "n", 3, 600 * kMs, log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), clock.t, me()) == Acquisition::Acquired);
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> { return refused(); };
  const long long term_by = lock.term_by_ns();
  // As the job loop does: renew when due, never past term_by.
  while (clock.t < lock.term_by_ns()) {
    if (clock.t >= lock.next_renewal_ns()) CHECK(lock.renew(lock.term_by_ns()));
    clock.t += 50 * kMs;
  }
  CHECK(lock.term_by_ns() == term_by);  // nothing answered: the deadline did not move
  CHECK_FALSE(lock.lost());
  lock.declare_lost(lock.overdue_why());
  CHECK(lock.lost());
  CHECK(lock.lost_at_ns() == clock.t);
  CHECK(lock.lost_why().find("safety window") != std::string::npos);
  // Durations in the one grammar looplock prints (it said "0.60 s").
  CHECK(lock.lost_why().find("(TTL 3.0s, kill-after 600ms, margin 230ms; last answered one sent ") !=
        std::string::npos);
  CHECK(lock.lost_why().find(" s,") == std::string::npos);
  CHECK(lock.kill_by_ns() - lock.term_by_ns() == 600 * kMs);
  lock.set_kill_after_ns(kSec);
  CHECK(lock.kill_by_ns() - lock.term_by_ns() == kSec);
}

TEST_CASE("cluster lock: a waiter queues once and takes the lock in its turn, renewing meanwhile") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  const long long a = etcd.contender("n", encode_cluster_holder({"hA", 1, "x", "y", "T", "1", 0}));
  const long long b = etcd.contender("n", encode_cluster_holder({"hB", 2, "x", "y", "T", "2", 0}));
  etcd.at(t0 + 2 * kSec, [&] { etcd.drop_lease(a); });
  etcd.at(t0 + 4 * kSec, [&] { etcd.drop_lease(b); });
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, 600 * kMs, log, {}, clock);
  REQUIRE(lock.acquire(kBlocking, t0, me()) == Acquisition::Acquired);
  CHECK(clock.t >= t0 + 4 * kSec);
  CHECK(clock.t < t0 + 4 * kSec + 10 * kMs);                 // woken by the deletion, not by a poll
  CHECK(etcd.transport.count("/v3/kv/txn") == 1);            // queued once
  CHECK(etcd.transport.count("/v3/lease/keepalive") >= 14);  // renewed every 250 ms while waiting
  CHECK(lock.fencing_token() > etcd.kvs.size());
  // Its place was kept: its key is the one created at the start.
  CHECK(etcd.kvs.at(lock.key()).create == lock.fencing_token());
  CHECK(lock.expiry_ns() > clock.t + 2 * kSec);
  // The value's acquired_at is rewritten at the first renewal (off the hand-off's path).
  clock.t = lock.next_renewal_ns();
  REQUIRE(lock.renew(lock.term_by_ns()));
  CHECK(parse_cluster_holder(etcd.kvs.at(lock.key()).value).value()["fencing_token"] == lock.fencing_token());
}

TEST_CASE("cluster lock: a bounded wait times out, naming the holder, and leaves the queue") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  etcd.contender("n", encode_cluster_holder({"hA", 77, "x", "y", "T", "1", 0}));
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, 600 * kMs, log, {}, clock);
  const long long t0 = clock.t;
  REQUIRE(lock.acquire(bounded(1500 * kMs), t0, me()) == Acquisition::TimedOut);
  CHECK(clock.t >= t0 + 1500 * kMs);
  CHECK(clock.t < t0 + 1600 * kMs);
  REQUIRE(lock.blocker());
  CHECK((*lock.blocker())["pid"] == 77);
  CHECK(etcd.kvs.size() == 1);  // our key went with our lease
}

TEST_CASE("cluster lock: single_flight skips without queuing when any contender exists") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  etcd.contender("n", "");  // etcdctl lock: no value
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, 600 * kMs, log, {}, clock);
  REQUIRE(lock.acquire({WaitPlan::Kind::NoWait, 0}, clock.t, me()) == Acquisition::Busy);
  CHECK(etcd.kvs.size() == 1);
  CHECK_FALSE(lock.blocker());
  CHECK(describe_cluster_holder(lock.blocker()).find("etcdctl") != std::string::npos);
  ClusterLock free_lock(etcd.transport, endpoints(1), "m", 3, 600 * kMs, log, {}, clock);
  CHECK(free_lock.acquire({WaitPlan::Kind::NoWait, 0}, clock.t, me()) == Acquisition::Acquired);
}

TEST_CASE("cluster lock: a blocking waiter rides out etcd being unavailable and keeps its place") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  const long long a = etcd.contender("n", encode_cluster_holder({"hA", 1, "x", "y", "T", "1", 0}));
  // etcd freezes at t0 + 1 s for 2.5 s (SIGSTOP: what was sent meanwhile is
  // answered when it goes on); the holder releases at t0 + 5 s.
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> {
    if (clock.t >= t0 + kSec && clock.t < t0 + 3500 * kMs) return Step{Step::Delay, 0, "", t0 + 3500 * kMs - clock.t};
    return std::nullopt;
  };
  etcd.at(t0 + 5 * kSec, [&] { etcd.drop_lease(a); });
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, 600 * kMs, log, {}, clock);
  REQUIRE(lock.acquire(kBlocking, t0, me()) == Acquisition::Acquired);
  CHECK(clock.t >= t0 + 5 * kSec);
  CHECK(etcd.transport.count("/v3/kv/txn") == 1);  // 2.5 s < TTL: the lease and the place survived
}

TEST_CASE("cluster lock: a waiter whose lease expired in a long outage queues again") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  const long long a = etcd.contender("n", encode_cluster_holder({"hA", 1, "x", "y", "T", "1", 0}));
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> {
    if (clock.t >= t0 + kSec && clock.t < t0 + 5 * kSec) return silent();  // longer than the TTL
    return std::nullopt;
  };
  etcd.at(t0 + 6 * kSec, [&] { etcd.drop_lease(a); });
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, 600 * kMs, log, {}, clock);
  REQUIRE(lock.acquire(kBlocking, t0, me()) == Acquisition::Acquired);
  CHECK(etcd.transport.count("/v3/lease/grant") == 2);
  CHECK(etcd.transport.count("/v3/kv/txn") == 2);
}

TEST_CASE("cluster lock: etcd unreachable from the start is 69 within the deadline") {
  FakeClock clock;
  FakeTransport t(clock);
  t.handler = [](const Endpoint&, const Request&) { return refused(); };
  Logger log = quiet_log();
  ClusterLock lock(t, endpoints(2), "n", 3, 600 * kMs, log, {}, clock);
  const long long t0 = clock.t;
  try {
    lock.acquire(bounded(500 * kMs), t0, me());
    FAIL("no throw");
  } catch (const Fatal& f) {
    CHECK(f.status() == 69);
    CHECK(std::string(f.what()).find("etcd unavailable") != std::string::npos);
  }
  CHECK(clock.t == t0 + 500 * kMs);
}

TEST_CASE("cluster lock: x and x/lock/y have keys of their own and do not exclude each other") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock nested(etcd.transport, endpoints(1), "x/lock/y", 3, 600 * kMs, log, {}, clock);
  REQUIRE(nested.acquire(bounded(kSec), clock.t, me()) == Acquisition::Acquired);
  CHECK(nested.key() == "looplock/x%2Flock%2Fy/lock/" + lease_hex(nested.lease()));
  // The same key under the unencoded prefix too, in the same transaction, for
  // earlier versions and etcdctl lock.
  const auto keys = etcd.keys_of(nested.lease());
  REQUIRE(keys.size() == 2);
  const std::string legacy = "looplock/x/lock/y/lock/" + lease_hex(nested.lease());
  REQUIRE(etcd.kvs.contains(legacy));
  CHECK(etcd.kvs.at(legacy).create == nested.fencing_token());
  CHECK(etcd.kvs.at(legacy).value == etcd.kvs.at(nested.key()).value);
  // That legacy key lies under "x"'s prefix, but it is not x's contender.
  for (auto plan : {WaitPlan{WaitPlan::Kind::NoWait, 0}, bounded(kSec), kBlocking}) {
    ClusterLock x(etcd.transport, endpoints(1), "x", 3, 600 * kMs, log, {}, clock);
    const long long t0 = clock.t;
    CHECK(x.acquire(plan, t0, me()) == Acquisition::Acquired);
    CHECK(clock.t < t0 + 100 * kMs);
    CHECK(x.key() == "looplock/x/lock/" + lease_hex(x.lease()));
    // ... and x's key is not x/lock/y's.
    ClusterLock other(etcd.transport, endpoints(1), "x/lock/y", 3, 600 * kMs, log, {}, clock);
    CHECK(other.acquire({WaitPlan::Kind::NoWait, 0}, clock.t, me()) == Acquisition::Busy);
    REQUIRE(other.blocker());
    CHECK((*other.blocker())["lease"] == lease_hex(nested.lease()));
    x.release();
  }
  nested.release();
  CHECK(etcd.kvs.empty());  // the revoke deleted both keys
}

TEST_CASE("cluster lock: an encoded name's legacy contender (an earlier looplock, etcdctl lock) holds it") {
  for (const char* value :
       {"", R"({"host":"old","pid":7,"agent_id":"cron","operation":"o","acquired_at":"T","lease":"1"})"}) {
    CAPTURE(value);
    FakeClock clock;
    MiniEtcd etcd(clock);
    Logger log = quiet_log();
    const long long old = etcd.contender_at(legacy_lock_prefix("a/b"), value);
    // single_flight skips, naming it.
    ClusterLock sf(etcd.transport, endpoints(1), "a/b", 3, 600 * kMs, log, {}, clock);
    REQUIRE(sf.acquire({WaitPlan::Kind::NoWait, 0}, clock.t, me()) == Acquisition::Busy);
    CHECK(etcd.kvs.size() == 1);
    if (*value) {
      REQUIRE(sf.blocker());
      CHECK((*sf.blocker())["pid"] == 7);
    } else {
      CHECK_FALSE(sf.blocker());
    }
    // The deadline times out, naming it.
    ClusterLock w(etcd.transport, endpoints(1), "a/b", 3, 600 * kMs, log, {}, clock);
    long long t0 = clock.t;
    REQUIRE(w.acquire(bounded(kSec), t0, me()) == Acquisition::TimedOut);
    CHECK(clock.t >= t0 + kSec);
    CHECK(etcd.kvs.size() == 1);
    if (*value) CHECK((*w.blocker())["pid"] == 7);
    // A waiter waits for it, and takes the lock when it is gone.
    t0 = clock.t;
    etcd.at(t0 + 2 * kSec, [&] { etcd.drop_lease(old); });
    ClusterLock b(etcd.transport, endpoints(1), "a/b", 3, 600 * kMs, log, {}, clock);
    REQUIRE(b.acquire(kBlocking, t0, me()) == Acquisition::Acquired);
    CHECK(clock.t >= t0 + 2 * kSec);
    CHECK(clock.t < t0 + 2 * kSec + 10 * kMs);
  }
}

TEST_CASE("cluster lock: new and legacy contenders of an encoded name queue in one order") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  // A new holder (both keys), then an earlier looplock queued behind it (legacy key only).
  ClusterLock first(etcd.transport, endpoints(1), "a/b", 3, 600 * kMs, log, {}, clock);
  REQUIRE(first.acquire(bounded(kSec), t0, me()) == Acquisition::Acquired);
  const long long old = etcd.contender_at(legacy_lock_prefix("a/b"), "");
  const long long first_lease = first.lease();
  etcd.at(t0 + kSec, [&] { etcd.drop_lease(first_lease); });  // its release (the revoke deletes both keys)
  etcd.at(t0 + 2 * kSec, [&] { etcd.drop_lease(old); });
  ClusterLock third(etcd.transport, endpoints(1), "a/b", 3, 600 * kMs, log, {}, clock);
  REQUIRE(third.acquire(kBlocking, t0, me()) == Acquisition::Acquired);
  // Not at the first release: the legacy contender came before it.
  CHECK(clock.t >= t0 + 2 * kSec);
  CHECK(third.fencing_token() > etcd.kvs.size());
}

TEST_CASE("cluster lock: another name's keys deeper under the prefix do not hold it") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  // An earlier looplock holding "x/lock/y" (its key under x's prefix).
  etcd.contender_at(legacy_lock_prefix("x/lock/y"), encode_cluster_holder({"old", 9, "a", "o", "T", "1", 0}));
  ClusterLock sf(etcd.transport, endpoints(1), "x", 3, 600 * kMs, log, {}, clock);
  REQUIRE(sf.acquire({WaitPlan::Kind::NoWait, 0}, clock.t, me()) == Acquisition::Acquired);
  // The compare on the prefix failed: queued, found first, holds.
  CHECK(etcd.transport.count("/v3/kv/txn") == 2);
  ClusterLock sf2(etcd.transport, endpoints(1), "x", 3, 600 * kMs, log, {}, clock);
  REQUIRE(sf2.acquire({WaitPlan::Kind::NoWait, 0}, clock.t, me()) == Acquisition::Busy);
  REQUIRE(sf2.blocker());
  CHECK((*sf2.blocker())["lease"] == lease_hex(sf.lease()));
  CHECK(etcd.kvs.size() == 2);  // sf2's key went with its lease
}

TEST_CASE("cluster holder value") {
  ClusterHolder h{"host\n1", 42, "cron", "tick.py", "2026-11-30T17:00:00.000Z", "abc", 7};
  auto j = parse_cluster_holder(encode_cluster_holder(h));
  REQUIRE(j);
  CHECK((*j)["pid"] == 42);
  CHECK((*j)["fencing_token"] == 7);
  CHECK((*j)["lease"] == "abc");
  h.fencing_token = 0;
  CHECK_FALSE(parse_cluster_holder(encode_cluster_holder(h))->contains("fencing_token"));
  CHECK_FALSE(parse_cluster_holder("[]"));
}

TEST_CASE("the cluster lock words each cause's fix in looplock's options") {
  CHECK(cause_hint(Cause::None, "http://h:1").empty());
  CHECK(cause_hint(Cause::SpeaksTls, "http://h:1") == "The endpoint speaks TLS: use https://h:1 (and --etcd-cacert).");
  CHECK(cause_hint(Cause::SpeaksPlainHttp, "https://h:1").starts_with("Use http://h:1 for this endpoint"));
  CHECK(cause_hint(Cause::TlsRejected, "https://h:1").starts_with("Check --etcd-cacert"));
  CHECK(cause_hint(Cause::NotTls, "https://h:1").find("does not answer in TLS") != std::string::npos);
  CHECK(cause_hint(Cause::BadCredentials, "").find("--etcd-user") != std::string::npos);
  CHECK(cause_hint(Cause::PermissionDenied, "").find("looplock/") != std::string::npos);
  CHECK(cause_hint(Cause::CommonNameRefused, "").find("CommonName") != std::string::npos);
}
