#include "os/windows/command_line.hpp"

#include "os/windows/support.hpp"

namespace looplock::sys::windows {

std::wstring quoted_argument(const std::wstring& arg) {
  if (!arg.empty() && arg.find_first_of(L" \t\n\v\"") == std::wstring::npos) return arg;
  std::wstring out = L"\"";
  size_t backslashes = 0;
  for (const wchar_t c : arg) {
    if (c == L'\\') {
      ++backslashes;
      continue;
    }
    // Backslashes are literal unless a double quote follows them.
    out.append(c == L'"' ? 2 * backslashes + 1 : backslashes, L'\\');
    backslashes = 0;
    out += c;
  }
  out.append(2 * backslashes, L'\\');  // before the closing quote
  out += L'"';
  return out;
}

bool is_shell_form(const std::vector<std::string>& argv) {
  return argv.size() == 5 && argv[1] == "/d" && argv[2] == "/s" && argv[3] == "/c";
}

std::optional<std::wstring> command_line(const std::vector<std::string>& argv, bool shell) {
  if (argv.empty() || argv[0].find('"') != std::string::npos) return std::nullopt;
  const std::wstring program = widen(argv[0]);
  std::wstring line =
      program.empty() || program.find_first_of(L" \t") != std::wstring::npos ? L"\"" + program + L"\"" : program;
  if (shell && is_shell_form(argv)) return line + L" /d /s /c \"" + widen(argv[4]) + L"\"";
  for (size_t i = 1; i < argv.size(); ++i) line += L" " + quoted_argument(widen(argv[i]));
  return line;
}

}  // namespace looplock::sys::windows
