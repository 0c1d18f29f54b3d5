// The pure parts of the etcd client: endpoints, base64, request bodies,
// gateway answers and HTTP responses. The network exchange itself is covered
// against a real etcd by tests/integration/test_etcd.py.
#include <doctest/doctest.h>

#include "cluster.hpp"
#include "etcd.hpp"

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

TEST_CASE("HTTP responses: length, chunked, first line of a stream") {
  bool bad = false;
  std::string head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n";
  CHECK_FALSE(parse_http_response(head + "{\"a\":", false, false, bad));
  CHECK_FALSE(bad);
  auto r = parse_http_response(head + "{\"a\":1}", false, false, bad);
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "{\"a\":1}");

  std::string chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::string part = chunked + "4\r\n{\"a\"\r\n4\r\n:1}\n\r\n";
  CHECK_FALSE(parse_http_response(part, false, false, bad));
  r = parse_http_response(part, false, true, bad);  // a stream's first line is enough
  REQUIRE(r);
  CHECK(r->body == "{\"a\":1}\n");
  r = parse_http_response(part + "0\r\n\r\n", false, false, bad);
  REQUIRE(r);
  CHECK(r->body == "{\"a\":1}\n");

  r = parse_http_response("HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\nnope", true, false, bad);
  REQUIRE(r);
  CHECK(r->status == 404);
  CHECK(r->body == "nope");

  CHECK_FALSE(parse_http_response("garbage\r\n\r\n", true, false, bad));
  CHECK(bad);
  CHECK_FALSE(parse_http_response(chunked + "zz\r\n", false, false, bad));
  CHECK(bad);
  CHECK_FALSE(parse_http_response(head + "{", true, false, bad));  // cut short
  CHECK(bad);
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
