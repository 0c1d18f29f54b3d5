#include "base/log.hpp"

#include <unistd.h>

#include <cerrno>

#include "cli/inspect.hpp"
#include "os/sys.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "os/unique_fd.hpp"
#include "testutil.hpp"

using looplock::Json;
using looplock::LogFormat;
using looplock::Logger;
using looplock::UniqueFd;
using looplock::Verbosity;
using testutil::TempDir;

namespace {
const std::string kFffd = "\xEF\xBF\xBD";

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = s.find('\n', start)) != std::string::npos; start = nl + 1)
    out.push_back(s.substr(start, nl - start));
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

// Everything a Logger with this verbosity writes for one message of each kind.
std::string emitted(Verbosity v, LogFormat f = LogFormat::Text) {
  TempDir dir;
  UniqueFd fd(::open((dir / "log").c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  REQUIRE(fd);
  Logger log(v, f, fd.get());
  log.error("e", "an error", "a hint");
  log.warn("w", "a warning");
  log.result("noop-locked", "a result");
  log.verbose("v", "progress");
  return testutil::slurp(dir / "log").value_or("");
}
}  // namespace

TEST_CASE("text lines") {
  Logger log(Verbosity::Normal, LogFormat::Text);
  CHECK(log.format_line("error", "ev", "cannot lock x", "", Json::object()) == "looplock: cannot lock x\n");
  CHECK(log.format_line("error", "ev", "cannot lock x", "Check y.", Json::object()) ==
        "looplock: cannot lock x\nlooplock: Check y.\n");
  // Fields are for JSON only.
  CHECK(log.format_line("warning", "ev", "m", "", Json{{"pid", 5}}) == "looplock: m\n");
}

TEST_CASE("text lines: every line starts with looplock:, whatever the message holds") {
  // An agent id from a holder record may contain a newline; it must not
  // start a line that looks like it came from elsewhere.
  Logger log(Verbosity::Normal, LogFormat::Text);
  std::string out = log.format_line("warning", "ev", "held by agent evil\nrm -rf: fake line", "hint\nsecond", {});
  for (const auto& line : lines_of(out)) {
    CAPTURE(line);
    CHECK(line.rfind("looplock: ", 0) == 0);
  }
  CHECK(out.back() == '\n');
}

TEST_CASE("JSON lines") {
  Logger log(Verbosity::Normal, LogFormat::Json);
  std::string line = log.format_line("error", "lock_acquire_timeout", "gave up", "retry later",
                                     Json{{"waited_ms", 5003}, {"holder_pids", {1, 2}}});
  CHECK(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);
  Json j = Json::parse(line);
  CHECK(j["level"] == "error");
  CHECK(j["event"] == "lock_acquire_timeout");
  CHECK(j["message"] == "gave up");
  CHECK(j["hint"] == "retry later");
  CHECK(j["waited_ms"] == 5003);
  CHECK(j["holder_pids"] == Json::array({1, 2}));
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  CHECK(keys == std::vector<std::string>{"ts", "pid", "level", "event", "message", "hint", "waited_ms", "holder_pids"});
  CHECK(j["pid"] == getpid());
  CHECK(looplock::sys::parse_utc_ms(j["ts"].get<std::string>()));  // UTC with milliseconds

  // No hint: no key. Non-object fields are ignored. The lock_id, once known.
  j = Json::parse(log.format_line("info", "acquired", "took 3 ms", "", Json()));
  CHECK_FALSE(j.contains("hint"));
  CHECK_FALSE(j.contains("lock_id"));
  CHECK(j.size() == 5);
  log.set_lock_id("0123456789abcdef");
  j = Json::parse(log.format_line("info", "acquired", "took 3 ms", "", Json()));
  CHECK(j["lock_id"] == "0123456789abcdef");
}

TEST_CASE("JSON lines escape newlines and replace invalid UTF-8") {
  Logger log(Verbosity::Normal, LogFormat::Json);
  std::string msg = "agent \"x\"\nline2\\ \xff\xfe end";
  std::string line = log.format_line("warning", "ev", msg, "", Json{{"agent_id", std::string("a\xc3", 2)}});
  CHECK(line.find('\n') == line.size() - 1);
  CHECK(line.find('\xff') == std::string::npos);
  Json j = Json::parse(line);  // valid JSON, valid UTF-8
  std::string m = j["message"];
  CHECK(m.find("agent \"x\"\nline2\\ ") == 0);
  CHECK(m.find(kFffd) != std::string::npos);
  CHECK(m.find(" end") != std::string::npos);
  CHECK(j["agent_id"] == "a" + kFffd);
}

TEST_CASE("dump_json never throws on invalid UTF-8") {
  Json j = {{"k", std::string("\xff\xff", 2)}, {"n", nullptr}};
  // nlohmann-json's own dump throws on it; dump_json replaces instead.
  CHECK_THROWS_AS((void)j.dump(), nlohmann::json::type_error);
  const std::string out = looplock::dump_json(j);
  CHECK(out == "{\"k\":\"" + kFffd + kFffd + "\",\"n\":null}");
  CHECK(looplock::dump_json(Json::array({1, "a"})) == "[1,\"a\"]");
}

TEST_CASE("what each verbosity prints") {
  std::string quiet = emitted(Verbosity::Quiet);
  CHECK(quiet == "looplock: an error\nlooplock: a hint\n");  // a healthy skip must not mail under cron

  std::string normal = emitted(Verbosity::Normal);
  CHECK(normal == "looplock: an error\nlooplock: a hint\nlooplock: a warning\nlooplock: a result\n");

  std::string verbose = emitted(Verbosity::Verbose);
  CHECK(verbose ==
        "looplock: an error\nlooplock: a hint\nlooplock: a warning\nlooplock: a result\nlooplock: progress\n");

  auto json_lines = lines_of(emitted(Verbosity::Verbose, LogFormat::Json));
  REQUIRE(json_lines.size() == 4);
  CHECK(Json::parse(json_lines[0])["level"] == "error");
  CHECK(Json::parse(json_lines[1])["level"] == "warning");
  CHECK(Json::parse(json_lines[2])["level"] == "notice");
  CHECK(Json::parse(json_lines[2])["event"] == "noop-locked");
  CHECK(Json::parse(json_lines[3])["level"] == "info");

  CHECK(Logger(Verbosity::Verbose, LogFormat::Text).is_verbose());
  CHECK_FALSE(Logger(Verbosity::Normal, LogFormat::Text).is_verbose());
  CHECK_FALSE(Logger(Verbosity::Quiet, LogFormat::Text).is_verbose());
}

TEST_CASE("a closed log descriptor is not fatal: the write fails, and the run goes on") {
  Logger log(Verbosity::Normal, LogFormat::Text, 1000000);
  errno = 0;
  log.error("e", "nowhere to go");
  CHECK(errno == EBADF);  // the line was written, and the failure ignored
  // The same logger keeps working for what follows (a warning, a result).
  log.warn("w", "still nowhere");
  CHECK(errno == EBADF);
}
