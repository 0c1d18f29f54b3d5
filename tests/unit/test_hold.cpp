#include "records/hold.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "os/digest.hpp"
#include "records/holder.hpp"
#include "testutil.hpp"

using looplock::HoldValue;

namespace {

HoldValue sample_value() {
  return {.pid = 4242,
          .start = "987654",
          .secret = "0123456789abcdef0123456789abcdef",
          .lock_id = "7c20a7052ee427df",
          .dir = "/srv/loops/nightly",
          .etcd_key = ""};
}

}  // namespace

TEST_CASE("a hold's value: one printable line, read back whole") {
  const HoldValue v = sample_value();
  const std::string text = looplock::format_hold_value(v);
  CHECK(text == "4242:987654:0123456789abcdef0123456789abcdef:7c20a7052ee427df:/srv/loops/nightly");
  auto back = looplock::parse_hold_value(text);
  REQUIRE(back);
  CHECK((back->pid == v.pid && back->start == v.start && back->secret == v.secret && back->lock_id == v.lock_id &&
         back->dir == v.dir && back->etcd_key.empty()));
}

TEST_CASE("DIR and the etcd key are percent-encoded: colons, spaces, newlines and non-UTF-8 survive") {
  HoldValue v = sample_value();
  v.dir = "/srv/a b:c\n\xff";
  v.etcd_key = "looplock/x:y/lock/2040a243b55ee005";
  const std::string text = looplock::format_hold_value(v);
  CHECK(text.find('\n') == std::string::npos);
  CHECK(text.find(' ') == std::string::npos);
  CHECK(text.ends_with(":/srv/a%20b%3ac%0a%ff:looplock/x%3ay/lock/2040a243b55ee005"));
  auto back = looplock::parse_hold_value(text);
  REQUIRE(back);
  CHECK(back->dir == v.dir);
  CHECK(back->etcd_key == v.etcd_key);
}

TEST_CASE("anything else is not a hold's value") {
  const std::string good = looplock::format_hold_value(sample_value());
  for (const std::string& bad : std::vector<std::string>{
           std::string(), std::string("garbage"), "0:" + good.substr(good.find(':') + 1), "-1" + good.substr(4),
           "4242:98x654" + good.substr(11), good + ":", good + ":k:extra",
           good.substr(0, good.rfind(':')) + ":relative", good.substr(0, good.rfind(':')) + ":/bad%zz",
           good.substr(0, good.rfind(':')) + ":/cut%4",
           std::string("4242:987654:0123456789abcdef:7c20a7052ee427df:/srv")}) {
    CAPTURE(bad);
    CHECK_FALSE(looplock::parse_hold_value(bad));
  }
}

TEST_CASE("a new secret is 32 hex digits, a new one each time") {
  auto a = looplock::new_hold_secret();
  auto b = looplock::new_hold_secret();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->size() == 32);
  CHECK(a->find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(*a != *b);
}

TEST_CASE("a hold's record keeps its tie, end and the secret's hash, the same field by field as in JSON") {
  looplock::HolderRecord r = testutil::sample_record(std::nullopt);
  r.hold = looplock::HoldFacts{.tied_to = 77,
                               .tied_start = "123",
                               .ends_at = "2026-12-05T01:00:00.000Z",
                               .secret_sha256 = looplock::sys::sha256_hex("s"),
                               .max_time_ms = 60000};
  const std::string text = looplock::encode_holder(r);
  CHECK(text.find(R"("hold":{"tied_to":77,"tied_to_start":"123","ends_at":"2026-12-05T01:00:00.000Z",)") !=
        std::string::npos);
  CHECK(text.substr(0, text.find(R"(,"check":")")) + "}" == looplock::dump_json(looplock::holder_to_json(r)));
  auto back = looplock::parse_holder(text);
  REQUIRE(back);
  REQUIRE(back->hold);
  CHECK((back->hold->tied_to == 77 && back->hold->tied_start == "123" && back->hold->ends_at == r.hold->ends_at &&
         back->hold->secret_sha256 == r.hold->secret_sha256));
  // Untied: null.
  r.hold->tied_to = 0;
  back = looplock::parse_holder(looplock::encode_holder(r));
  REQUIRE(back);
  CHECK(back->hold->tied_to == 0);
  CHECK(looplock::encode_holder(r).find(R"("tied_to":null)") != std::string::npos);
  // A malformed hold object makes no record.
  looplock::Json j = looplock::holder_to_json(r);
  j["hold"]["tied_to"] = "x";
  CHECK_FALSE(looplock::holder_from_json(j));
  j["hold"] = 1;
  CHECK_FALSE(looplock::holder_from_json(j));
}
