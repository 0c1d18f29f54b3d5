// The Windows job's own parts (src/os/windows/), run under wine by the
// windows stage: the command line that CreateProcessW is given, read back by
// the system's own CommandLineToArgvW, which parses as the C runtime does.
#include <doctest/doctest.h>

// clang-format off
#include <windows.h>
#include <shellapi.h>
// clang-format on

#include <string>
#include <vector>

#include "os/job_control.hpp"
#include "os/windows/command_line.hpp"
#include "os/windows/support.hpp"

using namespace looplock::sys;

namespace {

// `line` split by CommandLineToArgvW, as UTF-8.
std::vector<std::string> parsed(const std::wstring& line) {
  int n = 0;
  LPWSTR* args = CommandLineToArgvW(line.c_str(), &n);
  REQUIRE(args != nullptr);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(windows::utf8(args[i]));
  LocalFree(args);
  return out;
}

}  // namespace

TEST_CASE("every argument comes back as it was given") {
  const std::vector<std::vector<std::string>> cases = {
      {"prog", "plain"},
      {"prog", "with space", "tab\there"},
      {"prog", ""},
      {"prog", "", "x", ""},
      {"prog", "say \"hi\""},
      {"prog", "\""},
      {"prog", "back\\slash", "trailing\\", "trailing space\\", "two\\\\"},
      {"prog", "\\\"", "a\\\\\"b", "c:\\dir with space\\"},
      {"prog", "new\nline", "v\vtab"},
      {"prog", "caf\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x94\x92 lock"},
      {"C:\\Program Files\\Python\\python.exe", "-c", "print('x')"},
      {"C:\\dir\\", "x"},
  };
  for (const auto& argv : cases) {
    const auto line = windows::command_line(argv);
    REQUIRE(line);
    CHECK(parsed(*line) == argv);
  }
}

TEST_CASE("a program name with a double quote cannot be passed") {
  CHECK_FALSE(windows::command_line({"pro\"g", "x"}));
  CHECK_FALSE(windows::command_line({}));
}

TEST_CASE("a plain argument is not quoted, an empty one is") {
  CHECK(windows::quoted_argument(L"abc") == L"abc");
  CHECK(windows::quoted_argument(L"") == L"\"\"");
  CHECK(windows::quoted_argument(L"a b\\") == L"\"a b\\\\\"");
  CHECK(windows::quoted_argument(L"a\\\"b") == L"\"a\\\\\\\"b\"");
  CHECK(windows::quoted_argument(L"a\\b") == L"a\\b");  // backslashes alone are literal
}

TEST_CASE("-c runs its text whole through %ComSpec% /d /s /c") {
  const auto argv = shell_argv("echo \"a b\" & exit 3");
  REQUIRE(argv.size() == 5);
  CHECK(windows::is_shell_form(argv));
  CHECK(argv[0].ends_with("cmd.exe"));
  const auto line = windows::command_line(argv, /*shell=*/true);
  REQUIRE(line);
  // /s: cmd.exe strips the first and the last quote and runs the rest.
  CHECK(line->ends_with(L" /d /s /c \"echo \"a b\" & exit 3\""));
  CHECK_FALSE(windows::is_shell_form({"cmd.exe", "/c", "x"}));
  // The same shape given after --: quoted as any argv, never passed raw.
  const std::vector<std::string> given = {"prog.exe", "/d", "/s", "/c", "a\"b\\"};
  CHECK(parsed(*windows::command_line(given)) == given);
}
