// The shells' completion scripts for looplock, made from the option table
// (cli/option_table.hpp): `looplock --completions bash|zsh|fish` prints one,
// and completions/ holds them as printed (cross and package builds cannot
// run the binary; a test keeps them equal). Each completes the options, the
// values the table names (words, directories, files, pids, a command), DIR
// as a directory (several with --inspect), and after "--" the command.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace looplock {

// The shells there is a script for, as --completions takes them.
inline constexpr std::string_view kCompletionShells = "bash, zsh or fish";

// The script for `shell` ("bash", "zsh", "fish"); nullopt for another.
std::optional<std::string> completion_script(std::string_view shell);

}  // namespace looplock
