#include "records/incident.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "os/unique_fd.hpp"
#include "testutil.hpp"

using looplock::Incident;
using looplock::Json;
using looplock::UniqueFd;
using testutil::TempDir;

namespace {

looplock::HolderRecord holder() { return testutil::sample_record(); }

Incident sample(bool with_holder = true, std::string at = "2026-11-30T17:00:05.126Z") {
  Incident i;
  i.at = std::move(at);
  i.lock_id = "0123456789abcdef";
  i.policy = "mutation";
  i.deadline_ms = 5000;
  i.waited_ms = 5003;
  if (with_holder) {
    i.holder = holder();
    i.holder_alive = true;
  }
  i.holder_pids = {1234, 1235};
  i.waiter_pid = 4321;
  i.waiter_agent = "ci";
  i.waiter_operation = "deploy.py";
  i.operator_action = "inspect the holder pid; never delete the lock file";
  return i;
}

UniqueFd open_dir(const std::string& path) { return UniqueFd(::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)); }

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = s.find('\n', start)) != std::string::npos; start = nl + 1)
    out.push_back(s.substr(start, nl - start));
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

std::string with_field(const std::string& key, const Json& value, bool remove = false) {
  Json j = looplock::incident_to_json(sample());
  if (remove) {
    j.erase(key);
  } else {
    j[key] = value;
  }
  return looplock::dump_json(j);
}

}  // namespace

TEST_CASE("encode and parse round trip") {
  std::string line = looplock::encode_incident(sample());
  CHECK(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);
  auto j = looplock::parse_incident_line(line);
  REQUIRE(j);
  CHECK((*j)["schema"] == "file_lock_incident_v0");
  CHECK((*j)["at"] == "2026-11-30T17:00:05.126Z");
  CHECK((*j)["error_code"] == "lock_acquire_timeout");
  CHECK((*j)["lock_id"] == "0123456789abcdef");
  CHECK((*j)["policy"] == "mutation");
  CHECK((*j)["deadline_ms"] == 5000);
  CHECK((*j)["waited_ms"] == 5003);
  CHECK((*j)["holder"]["pid"] == 1234);
  CHECK((*j)["holder"]["schema"] == "file_lock_holder_v0");
  CHECK((*j)["holder_alive"] == true);
  CHECK((*j)["holder_pids"] == Json::array({1234, 1235}));
  CHECK((*j)["waiter"] == Json({{"pid", 4321}, {"agent_id", "ci"}, {"operation", "deploy.py"}}));
  CHECK((*j)["operator_action"] == "inspect the holder pid; never delete the lock file");

  // The keys in the order looplock-files(5) documents.
  std::vector<std::string> keys;
  for (auto it = j->begin(); it != j->end(); ++it) keys.push_back(it.key());
  CHECK(keys == std::vector<std::string>{"schema", "at", "error_code", "lock_id", "policy", "deadline_ms", "waited_ms",
                                         "holder", "holder_alive", "holder_pids", "waiter", "operator_action"});

  // Without the newline too.
  CHECK(looplock::parse_incident_line(line.substr(0, line.size() - 1)));
}

TEST_CASE("no record: holder and holder_alive are null") {
  Incident i = sample(false);
  i.holder_pids.clear();
  std::string line = looplock::encode_incident(i);
  CHECK(line.find(R"("holder":null,"holder_alive":null,"holder_pids":[])") != std::string::npos);
  CHECK(looplock::parse_incident_line(line));
}

TEST_CASE("hostile waiter names are clipped and escaped") {
  Incident i = sample();
  i.waiter_agent = std::string(1000, '\n');
  i.waiter_operation = std::string(1000, '\xff');
  std::string line = looplock::encode_incident(i);
  CHECK(line.find('\n') == line.size() - 1);
  auto j = looplock::parse_incident_line(line);
  REQUIRE(j);
  CHECK((*j)["waiter"]["agent_id"] == std::string(256, '\n'));
  CHECK(line.size() < 8192);
}

TEST_CASE("every truncation of a line is rejected") {
  for (bool with_holder : {true, false}) {
    std::string line = looplock::encode_incident(sample(with_holder));
    line.pop_back();  // the newline: the line is valid without it
    for (size_t n = 0; n < line.size(); ++n) {
      CAPTURE(n);
      CHECK_FALSE(looplock::parse_incident_line(std::string_view(line).substr(0, n)));
    }
    CHECK(looplock::parse_incident_line(line));
  }
}

TEST_CASE("wrong schema, missing fields and wrong types are rejected") {
  for (const char* k : {"schema", "at", "error_code", "lock_id", "policy", "deadline_ms", "waited_ms", "holder",
                        "holder_alive", "holder_pids", "waiter", "operator_action"}) {
    CAPTURE(k);
    CHECK_FALSE(looplock::parse_incident_line(with_field(k, nullptr, /*remove=*/true)));
    const std::string key = k;
    const bool is_string = key == "schema" || key == "at" || key == "error_code" || key == "lock_id" ||
                           key == "policy" || key == "operator_action";
    CHECK_FALSE(looplock::parse_incident_line(with_field(k, is_string ? Json(5) : Json("x"))));
  }
  CHECK_FALSE(looplock::parse_incident_line(with_field("schema", "file_lock_holder_v0")));
  CHECK_FALSE(looplock::parse_incident_line(with_field("schema", "file_lock_incident_v1")));
  CHECK_FALSE(looplock::parse_incident_line(with_field("deadline_ms", 1.5)));
  CHECK_FALSE(looplock::parse_incident_line(with_field("waited_ms", "5003")));
  CHECK_FALSE(looplock::parse_incident_line(with_field("at", 5)));
  CHECK_FALSE(looplock::parse_incident_line(with_field("holder", Json({{"pid", 1}}))));  // not a record
  CHECK_FALSE(looplock::parse_incident_line(with_field("holder_alive", "yes")));
  CHECK_FALSE(looplock::parse_incident_line(with_field("holder_pids", Json::array({1, "2"}))));
  CHECK_FALSE(looplock::parse_incident_line(with_field("holder_pids", 1)));
  CHECK_FALSE(looplock::parse_incident_line(with_field("waiter", Json({{"pid", 1}, {"agent_id", "a"}}))));
  CHECK_FALSE(
      looplock::parse_incident_line(with_field("waiter", Json({{"pid", "1"}, {"agent_id", "a"}, {"operation", "o"}}))));
  CHECK_FALSE(looplock::parse_incident_line(with_field("waiter", nullptr)));
  CHECK(looplock::parse_incident_line(with_field("holder", nullptr)));
  CHECK(looplock::parse_incident_line(with_field("holder_alive", nullptr)));
  CHECK(looplock::parse_incident_line(with_field("holder_alive", false)));

  std::string line = looplock::encode_incident(sample());
  for (const std::string& bad : {std::string(), std::string("\n"), std::string("{}"), std::string("[]"),
                                 line.substr(0, line.size() - 1) + " ", "x" + line, line + line}) {
    CAPTURE(bad);
    CHECK_FALSE(looplock::parse_incident_line(bad));
  }
}

TEST_CASE("append_incident creates the file 0660 (as the lock file) and appends one line per call") {
  TempDir dir;
  UniqueFd dfd = open_dir(dir.path());
  REQUIRE(dfd);
  mode_t old = umask(0);
  int err = looplock::append_incident(dfd.get(), looplock::encode_incident(sample(true, "2026-11-30T17:00:01.000Z")));
  umask(old);
  REQUIRE(err == 0);
  const std::string path = dir / looplock::kIncidentsName;
  struct stat st {};
  REQUIRE(lstat(path.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK((st.st_mode & 07777) == 0660);

  REQUIRE(looplock::append_incident(dfd.get(), looplock::encode_incident(sample(false, "2026-11-30T17:00:02.000Z"))) ==
          0);
  REQUIRE(looplock::append_incident(dfd.get(), looplock::encode_incident(sample(true, "2026-11-30T17:00:03.000Z"))) ==
          0);
  auto content = testutil::slurp(path);
  REQUIRE(content);
  auto lines = lines_of(*content);
  REQUIRE(lines.size() == 3);
  CHECK(content->back() == '\n');
  for (size_t n = 0; n < 3; ++n) {
    auto j = looplock::parse_incident_line(lines[n]);
    REQUIRE(j);
    CHECK((*j)["at"] == "2026-11-30T17:00:0" + std::to_string(n + 1) + ".000Z");
  }
}

TEST_CASE("append_incident refuses a symlink and a non-regular file") {
  TempDir dir;
  UniqueFd dfd = open_dir(dir.path());
  REQUIRE(dfd);
  const std::string path = dir / looplock::kIncidentsName;
  const std::string line = looplock::encode_incident(sample());

  SUBCASE("symlink to a file") {
    testutil::write_file(dir / "target", "original\n");
    REQUIRE(symlink("target", path.c_str()) == 0);
    CHECK(looplock::append_incident(dfd.get(), line) == ELOOP);
    CHECK(testutil::slurp(dir / "target") == "original\n");
  }
  SUBCASE("dangling symlink") {
    REQUIRE(symlink("nowhere", path.c_str()) == 0);
    CHECK(looplock::append_incident(dfd.get(), line) == ELOOP);
    CHECK(access((dir / "nowhere").c_str(), F_OK) != 0);
  }
  SUBCASE("directory") {
    REQUIRE(mkdir(path.c_str(), 0755) == 0);
    CHECK(looplock::append_incident(dfd.get(), line) != 0);
  }
  SUBCASE("FIFO without a reader: an error, not a hang") {
    REQUIRE(mkfifo(path.c_str(), 0644) == 0);
    CHECK(looplock::append_incident(dfd.get(), line) != 0);
  }
  SUBCASE("FIFO with a reader: not a regular file") {
    REQUIRE(mkfifo(path.c_str(), 0644) == 0);
    UniqueFd reader(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    REQUIRE(reader);
    CHECK(looplock::append_incident(dfd.get(), line) == EINVAL);
    char buf[16];
    CHECK(read(reader.get(), buf, sizeof buf) <= 0);  // nothing was written into it
  }
  SUBCASE("directory fd that is not valid") { CHECK(looplock::append_incident(-1, line) != 0); }
}

TEST_CASE("summarize_incidents") {
  TempDir dir;
  UniqueFd dfd = open_dir(dir.path());
  REQUIRE(dfd);
  const std::string path = dir / looplock::kIncidentsName;

  auto s = looplock::summarize_incidents(dfd.get());
  CHECK_FALSE(s.exists);
  CHECK(s.count == 0);
  CHECK(s.malformed == 0);
  CHECK_FALSE(s.latest);

  SUBCASE("valid, malformed and a truncated last line") {
    std::string a = looplock::encode_incident(sample(true, "2026-11-30T17:00:01.000Z"));
    std::string b = looplock::encode_incident(sample(false, "2026-11-30T17:00:02.000Z"));
    std::string torn = looplock::encode_incident(sample(true, "2026-11-30T17:00:03.000Z"));
    torn.resize(torn.size() / 2);
    testutil::write_file(path, a + "garbage\n" + "\n" + b + torn);
    s = looplock::summarize_incidents(dfd.get());
    CHECK(s.exists);
    CHECK(s.count == 4);  // the empty line is not a row
    // Read back from the end: the torn row, then b.
    CHECK(s.examined == 2);
    CHECK(s.malformed == 1);
    REQUIRE(s.latest);
    CHECK((*s.latest)["at"] == "2026-11-30T17:00:02.000Z");
    // Asked for more rows than there are valid ones: all of them are read.
    s = looplock::summarize_incidents(dfd.get(), 5);
    CHECK(s.examined == 4);
    CHECK(s.malformed == 2);
    REQUIRE(s.recent.size() == 2);
    CHECK(s.recent[0]["at"] == "2026-11-30T17:00:01.000Z");
    CHECK(s.recent[1] == *s.latest);
  }
  SUBCASE("the newest N rows, oldest first") {
    std::string content;
    for (int n = 1; n <= 9; ++n) {
      content += looplock::encode_incident(sample(true, "2026-11-30T17:00:0" + std::to_string(n) + ".000Z"));
    }
    testutil::write_file(path, content);
    s = looplock::summarize_incidents(dfd.get(), 3);
    CHECK(s.count == 9);
    REQUIRE(s.recent.size() == 3);
    CHECK(s.recent[0]["at"] == "2026-11-30T17:00:07.000Z");
    CHECK(s.recent[2]["at"] == "2026-11-30T17:00:09.000Z");
    CHECK(s.examined == 3);
    CHECK(s.malformed == 0);
  }
  SUBCASE("rows across the read buffer's edges, and a runaway line") {
    const std::string one = looplock::encode_incident(sample(true, "2026-11-30T17:00:01.000Z"));
    std::string content;
    size_t rows = 0;
    while (content.size() < (5u << 20) / 2) {
      content += one;
      ++rows;
    }
    content += std::string((1u << 20) + 10, 'x') + "\n";  // longer than any row: malformed, never read
    content += one;
    testutil::write_file(path, content);
    s = looplock::summarize_incidents(dfd.get(), 2);
    CHECK(s.count == rows + 2);
    CHECK(s.examined == 3);
    CHECK(s.malformed == 1);
    CHECK(s.recent.size() == 2);
  }
  SUBCASE("the latest is the last valid line") {
    std::string content;
    for (int n = 1; n <= 9; ++n) {
      content += looplock::encode_incident(sample(n % 2 == 1, "2026-11-30T17:00:0" + std::to_string(n) + ".000Z"));
    }
    testutil::write_file(path, content);
    s = looplock::summarize_incidents(dfd.get());
    CHECK(s.count == 9);
    CHECK(s.malformed == 0);
    REQUIRE(s.latest);
    CHECK((*s.latest)["at"] == "2026-11-30T17:00:09.000Z");
  }
  SUBCASE("many lines across read buffers") {
    std::string content;
    for (int n = 0; n < 500; ++n)
      content += looplock::encode_incident(
          sample(true, "2026-11-30T17:00:00." + std::to_string(100 + n % 900).substr(0, 3) + "Z"));
    content += looplock::encode_incident(sample(true, "2027-01-01T00:00:00.000Z"));
    testutil::write_file(path, content);
    s = looplock::summarize_incidents(dfd.get());
    CHECK(s.count == 501);
    CHECK(s.malformed == 0);
    REQUIRE(s.latest);
    CHECK((*s.latest)["at"] == "2027-01-01T00:00:00.000Z");
  }
  SUBCASE("empty file") {
    testutil::write_file(path, "");
    s = looplock::summarize_incidents(dfd.get());
    CHECK(s.exists);
    CHECK(s.count == 0);
    CHECK_FALSE(s.latest);
  }
  SUBCASE("a symlink is not followed") {
    testutil::write_file(dir / "target", looplock::encode_incident(sample()));
    REQUIRE(symlink("target", path.c_str()) == 0);
    s = looplock::summarize_incidents(dfd.get());
    CHECK_FALSE(s.exists);
    CHECK(s.count == 0);
  }
  SUBCASE("a directory is not an incidents file") {
    REQUIRE(mkdir(path.c_str(), 0755) == 0);
    s = looplock::summarize_incidents(dfd.get());
    CHECK_FALSE(s.exists);
  }
}
