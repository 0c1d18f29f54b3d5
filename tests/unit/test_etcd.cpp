// The etcd protocol without a network: endpoints, base64, keys, request
// bodies, gateway answers; and Client over a scripted Transport (failover,
// rounds, timeouts, errors, authentication). The cluster lock is tested in
// test_cluster.cpp, libcurl's transport in test_etcd_curl.cpp, and the whole
// against a real etcd by tests/integration/test_etcd.py.
#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <functional>
#include <map>

#include "base/error.hpp"
#include "cluster/cluster.hpp"
#include "cluster/etcd.hpp"
#include "os/posix/interrupts.hpp"
#include "os/sys.hpp"
#include "records/verdict.hpp"

using namespace looplock;
using namespace looplock::etcd;

#include "fake_etcd.hpp"

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
  auto kv = [](std::string key, long long rev) {
    return KeyValue{.key = std::move(key), .value = "", .create_revision = rev, .mod_revision = rev, .lease = 1};
  };
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
  // -p coalesce: a note put (no lease), and the run's keys deleted, only while
  // the guards are unchanged and nothing is noted under the run itself.
  auto a = Json::parse(absorb_txn_body({{"h", 3}, {"w", 9}}, {"a/"}, "n", "v", {"k"}));
  CHECK(a["compare"].size() == 3);
  CHECK(a["compare"][1] == Json::parse(R"({"key":"dw==","target":"CREATE","result":"EQUAL","create_revision":"9"})"));
  CHECK(a["compare"][2] ==
        Json::parse(R"({"key":"YS8=","target":"CREATE","result":"EQUAL","create_revision":"0","range_end":"YTA="})"));
  CHECK(a["success"][0] == Json::parse(R"({"request_put":{"key":"bg==","value":"dg=="}})"));
  CHECK(a["success"][1] == Json::parse(R"({"request_delete_range":{"key":"aw=="}})"));
  CHECK(a["failure"][0] == Json::parse(R"({"request_range":{"key":"YS8=","range_end":"YTA="}})"));
  auto d = Json::parse(delete_prefixes_txn_body({"a/"}));
  CHECK(d["compare"].empty());
  CHECK(d["success"][0] == Json::parse(R"({"request_delete_range":{"key":"YS8=","range_end":"YTA="}})"));
  auto t = Json::parse(take_prefixes_txn_body({"a/", "b/"}, {"k"}));
  CHECK(t["compare"].empty());
  CHECK(t["success"].size() == 5);
  CHECK(t["success"][0] == Json::parse(R"({"request_range":{"key":"YS8=","range_end":"YTA="}})"));
  CHECK(t["success"][1] == Json::parse(R"({"request_delete_range":{"key":"YS8=","range_end":"YTA="}})"));
  CHECK(t["success"][2]["request_range"]["key"] == "Yi8=");
  CHECK(t["success"][4] == Json::parse(R"({"request_delete_range":{"key":"aw=="}})"));
  auto r = Json::parse(reads_txn_body({"a/", "b/"}));
  CHECK(r["success"].size() == 2);
  CHECK(r["success"][1]["request_range"]["sort_target"] == "CREATE");
}

TEST_CASE("absorbed notes: under the waiter's lease, each named by the absorbed run's") {
  const std::string root = absorbed_root("n");
  CHECK(absorbed_prefix("n", 0x1f) == root + "1f/");
  CHECK(absorbed_waiter_lease(root, root + "1f/2a") == 0x1f);
  CHECK_FALSE(absorbed_waiter_lease(root, root + "1f"));         // no run's part
  CHECK_FALSE(absorbed_waiter_lease(root, root + "1f/"));        // an empty one
  CHECK_FALSE(absorbed_waiter_lease(root, root + "1f/2a/x"));    // deeper
  CHECK_FALSE(absorbed_waiter_lease(root, root + "zz/2a"));      // not a lease id
  CHECK_FALSE(absorbed_waiter_lease(root, "other/1f/2a"));
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

TEST_CASE("client: a signal of interrupt_on ends the call at once, no other endpoint tried, no retry") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {signal_pending()};
  Client c(t, endpoints(3), clock);
  looplock::sys::Interrupts usr1;
  sigemptyset(&usr1.signals);
  sigaddset(&usr1.signals, SIGUSR1);
  const long long start = clock.t;
  auto r = c.lease_keepalive(7, by(start + 10 * kSec, kSec, false, &usr1));
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
  auto r = c.lease_grant(10, by(clock.t + kSec));
  REQUIRE(r.ok());
  CHECK(r.value == 7);
  CHECK(c.current_endpoint() == "http://10.0.0.2:2379");
  CHECK(c.lease_revoke(7, by(clock.t + kSec)).ok());
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
  REQUIRE(c.range({"k"}, by(t0 + 5 * kSec)).ok());
  CHECK(t.calls[0].connect_deadline_ns - t.calls[0].at == Client::kConnect.count());
  CHECK(clock.t - t0 == Client::kConnect.count() + kMs);  // 40 ms lost, not a second
  // The second endpoint answered: it comes first. When it times out too, the
  // first gets twice its connect timeout, and after a pause so does the second.
  REQUIRE(c.range({"k"}, by(clock.t + 5 * kSec)).ok());
  CHECK(t.calls[2].url.starts_with("http://10.0.0.2"));
  CHECK(t.calls[3].connect_deadline_ns - t.calls[3].at == 2 * Client::kConnect.count());
  CHECK(t.calls[4].connect_deadline_ns - t.calls[4].at == 2 * Client::kConnect.count());
  CHECK(clock.sleeps == std::vector<long long>{25 * kMs});
}

TEST_CASE("client: nothing reachable is retried in rounds, pausing longer each time, until the deadline") {
  FakeClock clock;
  FakeTransport t(clock);
  t.handler = [](const Endpoint&, const Request&) { return refused(); };
  Client c(t, endpoints(2), clock);
  const long long t0 = clock.t;
  auto r = c.range({"k"}, by(t0 + 1 * kSec));
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
  auto r = c.lease_keepalive(7, by(t0 + 2 * kSec, 300 * kMs));
  REQUIRE(r.ok());
  CHECK(r.value == 3);
  CHECK(t.calls[0].deadline_ns == t0 + 300 * kMs);  // the attempt's bound, not the call's
  CHECK(t.calls[1].url.starts_with("http://10.0.0.2"));
  CHECK(ns_of(r.sent) == t0 + 300 * kMs);  // when the attempt that succeeded began
  CHECK_FALSE(t.calls[1].fresh);
  // The endpoint that went silent is no longer the first; when it is used
  // again, its kept connection is not.
  REQUIRE(c.lease_keepalive(7, by(clock.t + kSec, 300 * kMs)).ok());
  CHECK(t.calls[2].url.starts_with("http://10.0.0.2"));
}

TEST_CASE("client: attempt timeouts double each round (a slow but healthy cluster is reached)") {
  FakeClock clock;
  FakeTransport t(clock);
  t.handler = [&](const Endpoint&, const Request&) { return answer(kEmpty, 500 * kMs); };  // each answer takes 500 ms
  Client c(t, endpoints(1), clock);
  const long long t0 = clock.t;
  auto r = c.range({"k"}, by(t0 + 5 * kSec, 200 * kMs));
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
  REQUIRE(c.range({"k"}, by(clock.t + kSec)).ok());
  CHECK(t.calls[1].url.starts_with("http://10.0.0.2"));
  auto a = c.txn("{}", by(clock.t + kSec));
  CHECK(a.status == Status::Failed);
  CHECK(a.code == grpc_code::kNotFound);
  CHECK(a.error.find("HTTP 404: etcdserver: requested lease not found") != std::string::npos);
  auto b = c.lease_keepalive(7, by(clock.t + kSec));  // a stream's error frame
  CHECK(b.status == Status::Failed);
  CHECK(b.error.find("requested lease not found") != std::string::npos);
  CHECK(c.range({"k"}, by(clock.t + kSec)).ok());  // unreadable: another member
  CHECK(t.calls.size() == 6);
}

TEST_CASE("client: revoking a lease that is gone already is fine") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {http(404, R"({"error":"etcdserver: requested lease not found","code":5})")};
  Client c(t, endpoints(1), clock);
  CHECK(c.lease_revoke(7, by(clock.t + kSec)).ok());
}

TEST_CASE("client: a deadline already passed sends nothing") {
  FakeClock clock;
  FakeTransport t(clock);
  Client c(t, endpoints(2), clock);
  auto r = c.range({"k"}, by(clock.t - 1));
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
  auto w = c.watch_delete("k", 6, by(t0 + 300 * kMs));
  CHECK(w.status == Status::Timeout);
  CHECK(clock.t == t0 + 300 * kMs);
  CHECK(t.calls.size() == 1);
  CHECK(t.calls[0].stream);
  CHECK(Json::parse(t.calls[0].body)["create_request"]["start_revision"] == "6");
  auto d = c.watch_delete("k", 6, by(clock.t + kSec));
  REQUIRE(d.ok());
  CHECK(d.value);
}

TEST_CASE("client: a watch etcd ends at its deadline is no news; a canceled one, or one ended otherwise, is") {
  FakeClock clock;
  FakeTransport t(clock);
  const std::string created = "{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n";
  // etcd's gateway ends the stream with an error frame, no newline after it.
  const std::string deadline = R"({"error":{"grpc_code":4,"http_code":504,"message":"context deadline exceeded"}})";
  // Now and then etcd 3.4's gateway says the same with code 2 (Unknown).
  const std::string unknown = R"({"error":{"grpc_code":2,"http_code":500,"message":"context deadline exceeded"}})";
  t.script = {answer(created + deadline),
              answer(created + deadline + "\n"),
              answer(created + unknown),
              answer(created + R"({"result":{"canceled":true,"compact_revision":"9"}})" + "\n"),
              answer(created + R"({"error":{"grpc_code":14,"message":"etcdserver: no leader"}})"),
              answer(created)};
  Client c(t, endpoints(1), clock);
  for (const bool read_again : {false, false, false, true, true, false}) {
    CAPTURE(t.calls.size());
    auto w = c.watch_delete("k", 6, by(clock.t + kSec));
    REQUIRE(w.ok());
    CHECK(w.value == read_again);
  }
  // The server is asked to end it before the client's deadline, with room.
  CHECK(t.calls[0].server_timeout_ns > 0);
  CHECK(t.calls[0].server_timeout_ns <= kSec - 100 * kMs);
}

TEST_CASE("client: etcd authentication: a token first, on every request, renewed when etcd rejects it") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {answer(R"({"header":{},"token":"tok1"})"), answer(kEmpty),
              http(401, R"({"error":"etcdserver: invalid auth token","code":16})"),
              answer(R"({"header":{},"token":"tok2"})"), answer(kEmpty)};
  Client c(t, endpoints(1), clock);
  c.set_credentials("loop", "s3cret");
  REQUIRE(c.range({"k"}, by(clock.t + kSec)).ok());
  CHECK(t.calls[0].path == "/v3/auth/authenticate");
  CHECK(Json::parse(t.calls[0].body) == Json::parse(R"({"name":"loop","password":"s3cret"})"));
  CHECK(t.calls[0].token.empty());
  CHECK(t.calls[1].token == "tok1");
  REQUIRE(c.range({"k"}, by(clock.t + kSec)).ok());
  CHECK(t.calls[3].path == "/v3/auth/authenticate");
  CHECK(t.calls[4].token == "tok2");
}

TEST_CASE("client: a wrong password fails with a hint and never shows the password") {
  FakeClock clock;
  FakeTransport t(clock);
  t.script = {http(400, R"({"error":"etcdserver: authentication failed, invalid user ID or password","code":3})")};
  Client c(t, endpoints(1), clock);
  c.set_credentials("loop", "s3cret");
  auto r = c.range({"k"}, by(clock.t + kSec));
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
  REQUIRE(c.range({"k"}, by(clock.t + kSec)).ok());
  REQUIRE(c.range({"k"}, by(clock.t + kSec)).ok());
  CHECK(t.calls.size() == 3);
  CHECK(t.calls[2].token.empty());
}

TEST_CASE("client: a TLS failure tries the next endpoint and keeps the reason and the hint") {
  FakeClock clock;
  FakeTransport t(clock);
  t.handler = [](const Endpoint&, const Request&) { return failing(Step::TlsError); };
  Client c(t, endpoints(2), clock);
  auto r = c.range({"k"}, by(clock.t + 100 * kMs));
  CHECK(r.status == Status::Unavailable);
  CHECK(r.error.find("TLS: certificate verify failed") != std::string::npos);
  CHECK(r.cause == Cause::TlsRejected);
  CHECK(r.cause_endpoint.starts_with("http://"));
}

// -- the cluster lock against a small etcd in memory ------------------------

// (Here, not in test_cluster.cpp, which the Windows build runs: it asks the
// system for the signal mask.)
TEST_CASE("cluster lock: a coalescing waiter that meets an error lets the ending signals through again") {
  // It holds them back while it waits (its seat); etcd refusing the lease
  // ends the wait with an error, after which a signal must end looplock.
  FakeClock clock;
  MiniEtcd etcd(clock);
  etcd.fault = [](const Endpoint&, const Request& r) -> std::optional<Step> {
    if (r.path != "/v3/kv/txn") return std::nullopt;  // the lease is granted; queuing is refused
    return http(400, R"({"error":"etcdserver: permission denied","code":7})");
  };
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  ClusterHolder who = me();
  who.policy = "coalesce";
  CHECK_THROWS_AS(lock.acquire(bounded(500 * kMs), instant_ns(clock.t), who), Fatal);
  sigset_t now;
  REQUIRE(sigprocmask(SIG_BLOCK, nullptr, &now) == 0);
  CHECK(sigismember(&now, SIGTERM) == 0);
}

