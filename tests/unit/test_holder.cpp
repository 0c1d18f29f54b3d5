#include "records/holder.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "os/digest.hpp"
#include "os/posix/procfs.hpp"
#include "os/unique_fd.hpp"
#include "testutil.hpp"

using looplock::HolderRead;
using looplock::HolderRecord;
using looplock::Json;
using looplock::UniqueFd;
using testutil::TempDir;

namespace {

const std::string kFffd = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

HolderRecord sample(std::optional<std::string> released = std::nullopt) {
  return testutil::sample_record(std::move(released));
}

void check_same(const HolderRecord& a, const HolderRecord& b) {
  CHECK(a.lock_id == b.lock_id);
  CHECK(a.pid == b.pid);
  CHECK(a.pid_start == b.pid_start);
  CHECK(a.agent_id == b.agent_id);
  CHECK(a.operation == b.operation);
  CHECK(a.policy == b.policy);
  CHECK(a.acquired_at == b.acquired_at);
  CHECK(a.released_at == b.released_at);
  CHECK(a.no_fork == b.no_fork);
}

size_t count_char(const std::string& s, char c) {
  size_t n = 0;
  for (char x : s) n += x == c;
  return n;
}

// The encoded record with one field changed (or removed when `value` is
// discarded), re-serialised in the same form.
std::string with_field(const std::string& key, const Json& value, bool remove = false) {
  Json j = looplock::holder_to_json(sample());
  if (remove) {
    j.erase(key);
  } else {
    j[key] = value;
  }
  return looplock::dump_json(j) + "\n";
}

UniqueFd open_rw(const std::string& path) { return UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)); }

}  // namespace

TEST_CASE("encode and parse round trip") {
  for (const auto& r : {sample(), sample("2026-11-30T17:00:05.000Z")}) {
    std::string text = looplock::encode_holder(r);
    CAPTURE(text);
    CHECK(text.back() == '\n');
    CHECK(count_char(text, '\n') == 1);
    auto back = looplock::parse_holder(text);
    REQUIRE(back);
    check_same(*back, r);
  }
  const std::string body =
      R"({"schema":"file_lock_holder_v0","lock_id":"0123456789abcdef","pid":1234,"pid_start":"987654",)"
      R"("agent_id":"cron","operation":"status.py","policy":"mutation",)"
      R"("acquired_at":"2026-11-30T17:00:00.123Z","released_at":null)";
  CHECK(looplock::encode_holder(sample()) ==
        body + R"(,"check":")" + looplock::sys::sha256_hex(body).substr(0, 16) + "\"}\n");
}

TEST_CASE("an -F run's record says no_fork; older records and readers do without it") {
  HolderRecord r = sample();
  r.no_fork = true;
  const std::string text = looplock::encode_holder(r);
  CHECK(text.find(R"("released_at":null,"no_fork":true,"check":")") != std::string::npos);
  auto back = looplock::parse_holder(text);
  REQUIRE(back);
  CHECK(back->no_fork);
  CHECK(looplock::dump_json(looplock::holder_to_json(r)).find(R"("no_fork":true)") != std::string::npos);
  // Without it (every earlier record): no_fork is false, and the field is not written.
  CHECK(looplock::encode_holder(sample()).find("no_fork") == std::string::npos);
  CHECK_FALSE(looplock::parse_holder(looplock::encode_holder(sample()))->no_fork);
  // The same text as the JSON encoder, field by field.
  const std::string body = text.substr(0, text.find(R"(,"check":")"));
  CHECK(body + "}" == looplock::dump_json(looplock::holder_to_json(r)));
  // A no_fork that is not a boolean is not a record.
  CHECK_FALSE(looplock::holder_from_json(looplock::Json::parse(
      R"({"schema":"file_lock_holder_v0","lock_id":"x","pid":1,"pid_start":"","agent_id":"a","operation":"o",)"
      R"("policy":"mutation","acquired_at":"2026-11-30T17:00:00.123Z","released_at":null,"no_fork":1})")));
}

TEST_CASE("a record read while it was being rewritten fails its check") {
  // A reader racing a pwrite(2) can see the new record's start over the old
  // record's end. When the changed fields have equal lengths, that mix is
  // valid JSON with every field: only the check tells it apart.
  HolderRecord a = sample();
  a.agent_id = "run-000001";
  a.operation = "op-000001";
  HolderRecord b = sample();
  b.agent_id = "run-000002";
  b.operation = "op-000002";
  const std::string old_text = looplock::encode_holder(a);
  const std::string new_text = looplock::encode_holder(b);
  REQUIRE(old_text.size() == new_text.size());
  for (size_t k = 1; k < new_text.size(); ++k) {
    std::string torn = new_text.substr(0, k) + old_text.substr(k);
    if (torn == old_text || torn == new_text) continue;
    CAPTURE(torn);
    CHECK_FALSE(looplock::parse_holder(torn));
  }
  // Without the check the same mix would have passed as a record.
  std::string torn = new_text.substr(0, new_text.find("op-")) + old_text.substr(new_text.find("op-"));
  std::string unchecked = torn.substr(0, torn.find(R"(,"check")")) + "}\n";
  CHECK(looplock::parse_holder(unchecked));
}

TEST_CASE("space padding before the newline is allowed") {
  std::string text = looplock::encode_holder(sample());
  CHECK(looplock::parse_holder(text.substr(0, text.size() - 1) + "      \n"));
}

TEST_CASE("every truncation of a record is rejected") {
  for (const auto& r : {sample(), sample("2026-11-30T17:00:05.000Z")}) {
    std::string text = looplock::encode_holder(r);
    for (size_t n = 0; n < text.size(); ++n) {
      CAPTURE(n);
      CHECK_FALSE(looplock::parse_holder(std::string_view(text).substr(0, n)));
    }
    CHECK(looplock::parse_holder(text));
  }
}

TEST_CASE("anything after the record is rejected") {
  const std::string text = looplock::encode_holder(sample());
  const std::string body = text.substr(0, text.size() - 1);
  for (const std::string& bad : {text + "x", text + "\n", text + "{}\n", text + text, body + "\t\n", body + "}\n",
                                 body + "\n\n", text + std::string(1, '\0'), body + "x\n"}) {
    CAPTURE(bad);
    CHECK_FALSE(looplock::parse_holder(bad));
  }
  // What a writer that forgot to truncate would leave: a shorter record over
  // the tail of a longer one.
  HolderRecord longer = sample();
  longer.agent_id = std::string(100, 'a');
  std::string old = looplock::encode_holder(longer);
  std::string mixed = old;
  mixed.replace(0, text.size(), text);
  REQUIRE(mixed.size() > text.size());
  CHECK_FALSE(looplock::parse_holder(mixed));
}

TEST_CASE("missing fields, wrong types and wrong schema are rejected") {
  const std::vector<std::string> keys = {"schema",    "lock_id", "pid",         "pid_start",  "agent_id",
                                         "operation", "policy",  "acquired_at", "released_at"};
  for (const auto& k : keys) {
    CAPTURE(k);
    CHECK_FALSE(looplock::parse_holder(with_field(k, nullptr, /*remove=*/true)));
    CHECK_FALSE(looplock::parse_holder(with_field(k, Json::array())));
    CHECK_FALSE(looplock::parse_holder(with_field(k, Json::object())));
    CHECK_FALSE(looplock::parse_holder(with_field(k, true)));
    if (k != "pid") CHECK_FALSE(looplock::parse_holder(with_field(k, 123)));
    if (k != "released_at") CHECK_FALSE(looplock::parse_holder(with_field(k, nullptr)));
  }
  CHECK_FALSE(looplock::parse_holder(with_field("pid", "1234")));
  CHECK_FALSE(looplock::parse_holder(with_field("pid", 1234.5)));
  CHECK_FALSE(looplock::parse_holder(with_field("pid", 0)));
  CHECK_FALSE(looplock::parse_holder(with_field("pid", -1)));
  CHECK_FALSE(looplock::parse_holder(with_field("pid", 2147483648LL)));
  CHECK(looplock::parse_holder(with_field("pid", 2147483647LL)));
  CHECK(looplock::parse_holder(with_field("pid", 1)));
  CHECK_FALSE(looplock::parse_holder(with_field("schema", "file_lock_holder_v1")));
  CHECK_FALSE(looplock::parse_holder(with_field("schema", "")));
  CHECK(looplock::parse_holder(with_field("released_at", "2026-11-30T17:00:05.000Z")));

  for (const char* bad : {"", "\n", "{}\n", "[]\n", "null\n", "\"x\"\n", "{\n", "garbage\n"}) {
    std::string shown = bad;
    CAPTURE(shown);
    CHECK_FALSE(looplock::parse_holder(bad));
  }
}

TEST_CASE("hostile agent and operation names stay one valid JSON line") {
  const std::vector<std::string> hostile = {
      "a\"b",
      "line1\nline2",
      "back\\slash",
      std::string("nul\0byte", 8),
      "\r\t\x01\x1f\x7f",
      "\"}\n{\"schema\":\"file_lock_holder_v0\"",
      "h\xC3\xA9llo \xE2\x9C\x93",  // valid UTF-8
  };
  for (const auto& s : hostile) {
    CAPTURE(s);
    HolderRecord r = sample();
    r.agent_id = s;
    r.operation = s;
    std::string text = looplock::encode_holder(r);
    CHECK(count_char(text, '\n') == 1);
    CHECK(text.find('\0') == std::string::npos);
    auto back = looplock::parse_holder(text);
    REQUIRE(back);
    CHECK(back->agent_id == s);
    CHECK(back->operation == s);
  }
}

TEST_CASE("invalid UTF-8 becomes U+FFFD and the record stays parseable") {
  HolderRecord r = sample();
  r.agent_id = "\xff\xfe abc";
  r.operation = "op\xC3";  // a sequence cut in half
  std::string text = looplock::encode_holder(r);
  CHECK(text.find(kFffd) != std::string::npos);
  CHECK(text.find('\xff') == std::string::npos);
  auto back = looplock::parse_holder(text);
  REQUIRE(back);
  CHECK(back->agent_id.find(kFffd) == 0);
  CHECK(back->agent_id.find(" abc") != std::string::npos);
  CHECK(back->agent_id.find('\xff') == std::string::npos);
  CHECK(back->operation == "op" + kFffd);
}

TEST_CASE("clip_bytes and the one-page bound") {
  CHECK(looplock::clip_bytes(std::string(300, 'a')) == std::string(256, 'a'));
  CHECK(looplock::clip_bytes(std::string(256, 'a')) == std::string(256, 'a'));
  CHECK(looplock::clip_bytes("short") == "short");
  CHECK(looplock::clip_bytes("abcdef", 3) == "abc");
  CHECK(looplock::kMaxIdentityBytes == 256);

  // Never cut inside a multi-byte character: it goes whole (at most 256 bytes).
  HolderRecord r = sample();
  r.agent_id = std::string(255, 'a') + "\xC3\xA9";
  auto back = looplock::parse_holder(looplock::encode_holder(r));
  REQUIRE(back);
  CHECK(back->agent_id == std::string(255, 'a'));
  CHECK(looplock::clip_bytes(std::string(254, 'a') + "\xE2\x82\xAC" + "z") == std::string(254, 'a'));
  CHECK(looplock::clip_bytes(std::string(253, 'a') + "\xE2\x82\xAC" + "z") == std::string(253, 'a') + "\xE2\x82\xAC");
  // Bytes that are not UTF-8 are cut where the bound says (the encoder replaces them).
  CHECK(looplock::clip_bytes(std::string(250, 'a') + std::string(10, '\x80')).size() == 256);

  // The worst case: every byte of both names escaped as \u00XX.
  r = sample();
  r.pid = 2147483647;
  r.pid_start = "18446744073709551615";
  r.policy = "single_flight";
  r.released_at = "2026-11-30T17:00:05.000Z";
  r.agent_id = std::string(1000, '\x01');
  r.operation = std::string(1000, '\x1f');
  std::string text = looplock::encode_holder(r);
  CHECK(text.size() < 4096);
  back = looplock::parse_holder(text);
  REQUIRE(back);
  CHECK(back->agent_id == std::string(256, '\x01'));
  CHECK(back->operation == std::string(256, '\x1f'));

  // Invalid bytes (3-byte U+FFFD each) stay within the page too.
  r.agent_id = std::string(1000, '\xff');
  r.operation = std::string(1000, '\xfe');
  text = looplock::encode_holder(r);
  CHECK(text.size() < 4096);
  CHECK(looplock::parse_holder(text));
}

TEST_CASE("write_holder then read_holder on a file") {
  TempDir dir;
  UniqueFd fd = open_rw(dir / ".state.lock");
  REQUIRE(fd);

  HolderRead empty = looplock::read_holder(fd.get());
  CHECK(empty.state == HolderRead::State::Empty);
  CHECK(empty.size == 0);
  CHECK_FALSE(empty.record);

  HolderRecord longer = sample();
  longer.agent_id = std::string(200, 'x');
  longer.operation = "a-rather-long-operation-name.py";
  REQUIRE(looplock::write_holder(fd.get(), longer));
  HolderRead got = looplock::read_holder(fd.get());
  REQUIRE(got.state == HolderRead::State::Valid);
  REQUIRE(got.record);
  check_same(*got.record, longer);
  CHECK(got.size == looplock::encode_holder(longer).size());

  // A shorter record over a longer one: padded with spaces to the old length
  // (the file never shrinks, so no ftruncate(2) is needed).
  HolderRecord shorter = sample("2026-11-30T17:00:05.000Z");
  const std::string longer_text = looplock::encode_holder(longer);
  REQUIRE(looplock::write_holder(fd.get(), shorter));
  struct stat st {};
  REQUIRE(fstat(fd.get(), &st) == 0);
  CHECK(static_cast<size_t>(st.st_size) == longer_text.size());
  got = looplock::read_holder(fd.get());
  REQUIRE(got.state == HolderRead::State::Valid);
  check_same(*got.record, shorter);
  std::string shorter_text = looplock::encode_holder(shorter);
  CHECK(testutil::slurp(dir / ".state.lock") == shorter_text.substr(0, shorter_text.size() - 1) +
                                                    std::string(longer_text.size() - shorter_text.size(), ' ') + "\n");

  // Garbage larger than any record is cut off rather than padded over.
  {
    UniqueFd big(::open((dir / "big").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    REQUIRE(big);
    std::string junk(100000, 'j');
    REQUIRE(::write(big.get(), junk.data(), junk.size()) == static_cast<ssize_t>(junk.size()));
    REQUIRE(looplock::write_holder(big.get(), shorter));
    CHECK(testutil::slurp(dir / "big") == shorter_text);
  }

  // The file position does not matter: records are written and read at offset 0.
  REQUIRE(lseek(fd.get(), 0, SEEK_END) > 0);
  REQUIRE(looplock::write_holder(fd.get(), longer));
  CHECK(testutil::slurp(dir / ".state.lock") == looplock::encode_holder(longer));
}

TEST_CASE("read_holder on garbage, partial and unreadable content") {
  TempDir dir;
  const std::string path = dir / ".state.lock";

  testutil::write_file(path, "hello");
  UniqueFd fd = open_rw(path);
  HolderRead got = looplock::read_holder(fd.get());
  CHECK(got.state == HolderRead::State::Unreadable);
  CHECK(got.size == 5);
  CHECK_FALSE(got.record);

  std::string text = looplock::encode_holder(sample());
  testutil::write_file(path, text.substr(0, text.size() / 2));
  got = looplock::read_holder(fd.get());
  CHECK(got.state == HolderRead::State::Unreadable);
  CHECK_FALSE(got.record);

  testutil::write_file(path, std::string(100 * 1024, '{'));  // larger than the read limit
  got = looplock::read_holder(fd.get());
  CHECK(got.state == HolderRead::State::Unreadable);
  CHECK_FALSE(got.record);

  // A write-only descriptor cannot be read: an error, not a crash.
  UniqueFd wfd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  REQUIRE(wfd);
  CHECK(looplock::read_holder(wfd.get()).state == HolderRead::State::Error);
  // And a read-only one cannot be written.
  UniqueFd rfd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(rfd);
  errno = 0;
  CHECK_FALSE(looplock::write_holder(rfd.get(), sample()));
  CHECK((errno == EBADF || errno == EINVAL));  // ftruncate(2) says EINVAL, write(2) EBADF
}

TEST_CASE("encode_holder writes exactly what nlohmann-json makes of holder_to_json") {
  std::vector<HolderRecord> records = {sample(), sample("2026-11-30T17:00:05.000Z")};
  HolderRecord hostile = sample();
  hostile.agent_id = std::string("a\"b\\c\n\x01\xff\xfe", 9) + std::string(300, 'x');
  hostile.operation = std::string("\xc3\x28 op \x7f", 7);
  records.push_back(hostile);
  for (const auto& r : records) {
    std::string body = looplock::dump_json(looplock::holder_to_json(r));
    body.pop_back();
    CHECK(looplock::encode_holder(r) == body + R"(,"check":")" + looplock::holder_check(body) + "\"}\n");
  }
}

TEST_CASE("the record's strings are escaped as the JSON encoder escapes them, plain ones without it") {
  const std::vector<std::string> values = {"cron",         "",
                                           "a\"b",         "back\\slash",
                                           "tab\there",    "new\nline",
                                           "\x7f",         "caf\xc3\xa9",
                                           "bad\xff utf8", std::string("nul\0x", 5),
                                           "/slash/",      "~!@#$%^&*()_+{}|:<>?",
                                           "\x1f"};
  for (const auto& v : values) {
    CAPTURE(v);
    HolderRecord r = sample();
    r.agent_id = v;
    r.operation = v + "-op";
    const std::string text = looplock::encode_holder(r);
    CHECK(text.substr(0, text.find(R"(,"check":")")) + "}" == looplock::dump_json(looplock::holder_to_json(r)));
    auto back = looplock::parse_holder(text);
    REQUIRE(back);
    CHECK(back->agent_id == looplock::Json::parse(looplock::dump_json(looplock::Json(v))).get<std::string>());
  }
}
