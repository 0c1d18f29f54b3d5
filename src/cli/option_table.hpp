// Every option of looplock's command line, in one table: its names, its
// value, its --help section and line, and where it applies (a run,
// --inspect, only with --etcd, not with -F). The table drives the option
// parser's declarations, the checks that an option applies, and --help.
// Adding an option is a row here and its reading in options.cpp.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace looplock {

enum class Section { Policy, LockAndCommand, Schedule, Hold, Output, Inspect, Cluster, Other };
std::string_view section_title(Section s);  // "Policy", "Lock and command", ...

// Where an option applies.
inline constexpr unsigned kInRun = 1;      // looplock DIR -- COMMAND
inline constexpr unsigned kInInspect = 2;  // looplock --inspect DIR...
inline constexpr unsigned kInRelease = 4;  // looplock --release [VALUE], --release --force DIR
// (--hold is a run: what applies to a run applies to it, but for the
// conflicts options.cpp lists.)

// What a shell completes for an option's value (cli/completions.hpp).
enum class Completes { Text, Words, Dir, File, Pid, ShellCommand };
// One value word, with what it means (empty: nothing shown).
struct ValueWord {
  std::string_view word{};
  std::string_view about{};
};

struct OptionSpec {
  std::string_view name{};  // the long name: "policy"
  char letter = 0;         // the short one, or 0
  std::string_view value{};  // its value's name in --help ("NAME"); empty for a flag
  Section section = Section::Other;
  unsigned applies = kInRun | kInInspect;
  bool needs_etcd = false;        // only with --etcd (or $LOOPLOCK_ETCD)
  bool not_with_no_fork = false;  // needs looplock to stay the command's parent
  // --help's text, its lines separated by '\n'; empty: not listed (an
  // option declared only to point its users elsewhere, such as -u).
  std::string_view help{};
  // The shells' completions: a one-line description ("how to wait for the
  // lock"; empty: not completed), what the value is and, for Text, what to
  // call it ("duration (ms, s, m, h, d)"); for Words, the words.
  std::string_view brief{};
  Completes completes = Completes::Text;
  std::string_view hint{};
  std::span<const ValueWord> words{};
};

std::span<const OptionSpec> option_table();
// The row of `name` (long name), or null.
const OptionSpec* find_option(std::string_view name);
// "-w/--timeout", or "--ttl".
std::string option_shown(const OptionSpec& o);

// Two options that cannot be given together, and why.
struct OptionConflict {
  std::string_view a{}, b{};  // long names
  std::string_view why{};     // after "X and Y cannot be combined"; may be empty
  std::string_view hint{};
};
std::span<const OptionConflict> option_conflicts();

// The options part of --help, section by section, from the table.
std::string options_help();

}  // namespace looplock
