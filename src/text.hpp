// How looplock writes words: control characters made visible, lists joined,
// and the one quoting rule for operands in messages.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace looplock {

// `text` with control characters shown as \n, \r, \t or \xNN, so that an
// agent id or operation from a holder record can never start a line of its
// own or drive the terminal.
std::string printable(std::string_view text);

// The items, ", "-separated: "a, b, c".
std::string join(const std::vector<std::string>& items, std::string_view separator = ", ");

// An operand the user typed (an option's value, an argument), as messages
// show it: 'value', printable, an apostrophe in it written '\''. Paths and
// names looplock derives itself are not quoted.
std::string quote(std::string_view operand);

}  // namespace looplock
