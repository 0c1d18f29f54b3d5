// The command line of a Windows process: one string, which the started
// program splits into its arguments itself. Programs built with Microsoft's
// C runtime, CPython among them, and CommandLineToArgvW split it by the same
// rules (Microsoft's "Parsing C++ command-line arguments"), which
// command_line() quotes for: an argument with a space, a tab, a newline, a
// vertical tab or a double quote, or an empty one, goes between double
// quotes; inside them a double quote is escaped by a backslash, and the
// backslashes before it (or before the closing quote) are doubled. The
// program name (argv[0]) is read by a rule of its own: up to the next space,
// or between double quotes with no escapes, so it cannot hold a double
// quote. cmd.exe reads its line by none of these rules: -c's argv
// (shell_argv(): %ComSpec% /d /s /c TEXT) passes TEXT whole, between one
// pair of quotes that /s strips; any other argv of that shape is quoted as
// usual.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace looplock::sys::windows {

// `argv` (UTF-8) as one UTF-16 command line (`shell`: argv is
// shell_argv()'s, its text passed whole); nullopt when argv is empty or
// argv[0] holds a double quote.
std::optional<std::wstring> command_line(const std::vector<std::string>& argv, bool shell = false);

// One argument quoted as the C runtime reads it back.
std::wstring quoted_argument(const std::wstring& arg);

// Whether `argv` has the form shell_argv() makes for -c.
bool is_shell_form(const std::vector<std::string>& argv);

}  // namespace looplock::sys::windows
