// The etcd client without a network: endpoints, base64, request bodies,
// gateway answers, and Client over a scripted Transport (failover, timeouts,
// errors). libcurl's transport is tested in test_etcd_curl.cpp, and the whole
// against a real etcd by tests/integration/test_etcd.py.
#include <doctest/doctest.h>

#include "cluster.hpp"
#include "etcd.hpp"
#include "sys.hpp"

using namespace looplock;
using namespace looplock::etcd;

TEST_CASE("endpoints") {
  auto p = parse_endpoints("http://127.0.0.1:2379,http://etcd-b:2380/,http://[::1]:2381");
  REQUIRE(p.error.empty());
  REQUIRE(p.endpoints.size() == 3);
  CHECK(p.endpoints[0].host == "127.0.0.1");
  CHECK(p.endpoints[0].port == 2379);
  CHECK(p.endpoints[1].host == "etcd-b");
  CHECK(p.endpoints[1].text == "http://etcd-b:2380");
  CHECK(p.endpoints[2].host == "::1");
  CHECK(p.endpoints[2].port == 2381);
  for (const char* bad : {"", "127.0.0.1:2379", "https://h:1", "http://h", "http://h:0", "http://h:65536",
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
  CHECK(holder_key("nightly") == "looplock/nightly/holder");
  // The holder value lies outside the lock service's prefix.
  CHECK_FALSE(holder_key("n").starts_with(lock_service_name("n") + "/"));
  CHECK(prefix_range_end("a/") == "a0");
  CHECK(prefix_range_end(std::string("a\xff", 2)) == "b");
  CHECK(prefix_range_end("") == std::string(1, '\0'));
  CHECK(lease_hex(0x694d5765fc71500b) == "694d5765fc71500b");
}

TEST_CASE("request bodies") {
  CHECK(Json::parse(lease_grant_body(10)) == Json::parse(R"({"TTL":10})"));
  CHECK(Json::parse(lease_id_body(7587)) == Json::parse(R"({"ID":"7587"})"));
  CHECK(Json::parse(lock_body("foo", 12)) == Json::parse(R"({"name":"Zm9v","lease":"12"})"));
  CHECK(Json::parse(unlock_body("foo")) == Json::parse(R"({"key":"Zm9v"})"));
  CHECK(Json::parse(range_body("foo", false)) == Json::parse(R"({"key":"Zm9v"})"));
  CHECK(Json::parse(range_body("a/", true)) == Json::parse(R"({"key":"YS8=","range_end":"YTA="})"));
  CHECK(Json::parse(put_body("k", "v", 5)) == Json::parse(R"({"key":"aw==","value":"dg==","lease":"5"})"));
  CHECK(Json::parse(put_body("k", "v", 0)) == Json::parse(R"({"key":"aw==","value":"dg=="})"));
}

TEST_CASE("gateway answers") {
  auto grant = parse_answer(R"({"header":{"revision":"3"},"ID":"7587862071533449230","TTL":"10"})");
  REQUIRE(grant);
  CHECK(parse_lease_grant(*grant) == 7587862071533449230LL);
  CHECK_FALSE(parse_lease_grant(*parse_answer(R"({"header":{}})")));
  CHECK_FALSE(parse_lease_grant(*parse_answer(R"({"ID":"1","error":"too many"})")));

  // Keepalive is a stream: {"result":{...}} per line; TTL left out = 0 = gone.
  auto ka = parse_answer("{\"result\":{\"ID\":\"5\",\"TTL\":\"9\"}}\n{\"result\":{}}\n");
  REQUIRE(ka);
  CHECK(parse_keepalive_ttl(*ka) == 9);
  CHECK(parse_keepalive_ttl(*parse_answer("{\"result\":{\"ID\":\"5\"}}\n")) == 0);
  CHECK(parse_keepalive_ttl(*parse_answer(R"({"result":{"ID":"5","TTL":"-1"}})")) == 0);

  auto lock = parse_answer(R"({"header":{},"key":"Zm9vLzE="})");
  REQUIRE(lock);
  CHECK(parse_lock_key(*lock) == std::optional<std::string>("foo/1"));
  CHECK_FALSE(parse_lock_key(*parse_answer("{}")));

  auto range = parse_answer(
      R"({"kvs":[{"key":"aw==","create_revision":"12","mod_revision":"13","version":"2","value":"dg==","lease":"99"}],"count":"1"})");
  REQUIRE(range);
  auto kvs = parse_range(*range);
  REQUIRE(kvs);
  REQUIRE(kvs->size() == 1);
  CHECK((*kvs)[0].key == "k");
  CHECK((*kvs)[0].value == "v");
  CHECK((*kvs)[0].create_revision == 12);
  CHECK((*kvs)[0].mod_revision == 13);
  CHECK((*kvs)[0].lease == 99);
  CHECK(parse_range(*parse_answer(R"({"header":{}})"))->empty());
  CHECK_FALSE(parse_range(*parse_answer(R"({"kvs":[{"key":"!!"}]})")));
  CHECK_FALSE(parse_answer("not json"));
  CHECK_FALSE(parse_answer("[1]"));
  CHECK(int64_field(Json::parse(R"({"a":"x"})"), "a") == std::nullopt);
}

namespace {

// A scripted Transport: each call takes the next scripted exchange and
// records what was asked.
struct FakeTransport : Transport {
  struct Step {
    Exchange ex = Exchange::Ok;
    int status = 200;
    std::string body;
  };
  struct Call {
    std::string url;
    std::string body;
    long long connect_deadline_ns = 0;
    long long deadline_ns = 0;
    bool first_line_enough = false;
  };
  std::vector<Step> script;
  std::vector<Call> calls;

  Exchange post(const Endpoint& ep, std::string_view path, const std::string& body, long long connect_deadline_ns,
                long long deadline_ns, bool first_line_enough, HttpResponse& out, std::string& error) override {
    calls.push_back({ep.text + std::string(path), body, connect_deadline_ns, deadline_ns, first_line_enough});
    REQUIRE(calls.size() <= script.size());
    const Step& s = script[calls.size() - 1];
    if (s.ex != Exchange::Ok) {
      error = ep.text + ": scripted failure";
      return s.ex;
    }
    out.status = s.status;
    out.body = s.body;
    return Exchange::Ok;
  }
};

std::vector<Endpoint> two_endpoints() { return parse_endpoints("http://10.0.0.1:2379,http://10.0.0.2:2379").endpoints; }

constexpr long long kFar = 1LL << 62;

}  // namespace

TEST_CASE("client: the next endpoint when one refuses, and it is tried first afterwards") {
  FakeTransport t;
  t.script = {{Exchange::ConnectFailed, 0, ""}, {Exchange::Ok, 200, R"({"ID":"7","TTL":"10"})"},
              {Exchange::Ok, 200, R"({"header":{}})"}};
  Client c(t, two_endpoints());
  auto r = c.lease_grant(10, kFar);
  REQUIRE(r.ok());
  CHECK(r.value == 7);
  CHECK(c.current_endpoint() == "http://10.0.0.2:2379");
  CHECK(c.lease_revoke(7, kFar).ok());
  REQUIRE(t.calls.size() == 3);
  CHECK(t.calls[0].url == "http://10.0.0.1:2379/v3/lease/grant");
  CHECK(t.calls[1].url == "http://10.0.0.2:2379/v3/lease/grant");
  CHECK(t.calls[1].body == R"({"TTL":10})");
  CHECK(t.calls[2].url == "http://10.0.0.2:2379/v3/lease/revoke");
}

TEST_CASE("client: none reachable is Unavailable, naming each endpoint") {
  FakeTransport t;
  t.script = {{Exchange::ConnectFailed, 0, ""}, {Exchange::ConnectFailed, 0, ""}};
  Client c(t, two_endpoints());
  auto r = c.range("k", false, kFar);
  CHECK(r.status == Status::Unavailable);
  CHECK(r.error.find("10.0.0.1") != std::string::npos);
  CHECK(r.error.find("10.0.0.2") != std::string::npos);
}

TEST_CASE("client: a timeout is not retried elsewhere (the request may be queued there)") {
  FakeTransport t;
  t.script = {{Exchange::TimedOut, 0, ""}};
  Client c(t, two_endpoints());
  auto r = c.lock("looplock/x/lock", 7, kFar);
  CHECK(r.status == Status::Timeout);
  CHECK(t.calls.size() == 1);
}

TEST_CASE("client: server errors, broken answers and stream error frames are Failed") {
  FakeTransport t;
  t.script = {{Exchange::Ok, 404, R"({"message":"Not Found"})"},
              {Exchange::Broken, 0, ""},
              {Exchange::Ok, 200, R"({"error":{"grpc_code":5,"message":"requested lease not found"}})"},
              {Exchange::Ok, 200, "not json"}};
  Client c(t, two_endpoints());
  auto a = c.put("k", "v", 0, kFar);
  CHECK(a.status == Status::Failed);
  CHECK(a.error.find("HTTP 404: Not Found") != std::string::npos);
  CHECK(c.put("k", "v", 0, kFar).status == Status::Failed);
  auto b = c.lease_keepalive(7, kFar);
  CHECK(b.status == Status::Failed);
  CHECK(b.error.find("requested lease not found") != std::string::npos);
  CHECK(c.unlock("k", kFar).status == Status::Failed);
}

TEST_CASE("client: keepalive reads the first line of its stream; TTL 0 means the lease is gone") {
  FakeTransport t;
  t.script = {{Exchange::Ok, 200, "{\"result\":{\"ID\":\"7\",\"TTL\":\"10\"}}\n"},
              {Exchange::Ok, 200, "{\"result\":{\"ID\":\"7\"}}\n"}};
  Client c(t, two_endpoints());
  auto alive = c.lease_keepalive(7, kFar);
  REQUIRE(alive.ok());
  CHECK(alive.value == 10);
  auto gone = c.lease_keepalive(7, kFar);
  REQUIRE(gone.ok());
  CHECK(gone.value == 0);
  CHECK(t.calls[0].first_line_enough);
  CHECK(t.calls[0].body == R"({"ID":"7"})");
}

TEST_CASE("client: connecting is bounded by the connect timeout and the deadline") {
  FakeTransport t;
  t.script = {{Exchange::Ok, 200, R"({"header":{}})"}, {Exchange::Ok, 200, R"({"header":{}})"}};
  Client c(t, two_endpoints(), 1'000'000'000LL);
  const long long now = sys::monotonic_ns();
  REQUIRE(c.range("k", false, now + 60'000'000'000LL).ok());
  CHECK(t.calls[0].deadline_ns == now + 60'000'000'000LL);
  CHECK(t.calls[0].connect_deadline_ns <= sys::monotonic_ns() + 1'000'000'000LL);
  CHECK_FALSE(t.calls[0].first_line_enough);
  REQUIRE(c.range("k", false, now + 200'000'000LL).ok());
  CHECK(t.calls[1].connect_deadline_ns == now + 200'000'000LL);
}

TEST_CASE("client: a deadline already passed sends nothing") {
  FakeTransport t;
  Client c(t, two_endpoints());
  auto r = c.range("k", false, sys::monotonic_ns() - 1);
  CHECK(r.status == Status::Timeout);
  CHECK(t.calls.empty());
}

TEST_CASE("cluster holder value") {
  ClusterHolder h{"host\n1", 42, "cron", "tick.py", "2026-11-30T17:00:00.000Z", "abc", 7};
  auto j = parse_cluster_holder(encode_cluster_holder(h));
  REQUIRE(j);
  CHECK((*j)["pid"] == 42);
  CHECK((*j)["fencing_token"] == 7);
  CHECK((*j)["lease"] == "abc");
  std::string d = describe_cluster_holder(j);
  CHECK(d.find("pid 42") != std::string::npos);
  CHECK(d.find('\n') == std::string::npos);  // control characters escaped
  CHECK(describe_cluster_holder(std::nullopt).find("another host") != std::string::npos);
  CHECK_FALSE(parse_cluster_holder("[]"));
}
