// How looplock writes words: control characters made visible, lists joined,
// and the one quoting rule for operands in messages.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "os/ids.hpp"

namespace looplock {

// `text` with control characters shown as \n, \r, \t or \xNN, and bytes that
// are not UTF-8 as \xNN, so that an agent id or operation from a holder
// record can never start a line of its own or drive the terminal, and a name
// of any bytes can be told apart (and typed back, as $'...').
std::string printable(std::string_view text);

// The items, ", "-separated: "a, b, c".
std::string join(const std::vector<std::string>& items, std::string_view separator = ", ");

// An operand the user typed (an option's value, an argument), as messages
// show it: 'value', an apostrophe in it written '\''; one with control
// characters or bytes that are not UTF-8 as $'...' with \n, \xNN and the
// like, so that a shell reads either back as typed. Paths and names
// looplock derives itself are not quoted.
std::string quote(std::string_view operand);

// `text` as one word of a command line a message suggests, to paste into a
// shell: as it is when it is plain (letters, digits, _./:@%+=,- and, on
// Windows, backslashes); in double quotes when it holds a space, an
// apostrophe or the like; as quote() writes it when it holds what sh
// expands inside double quotes; as $'...' when it holds control characters
// or bytes that are not UTF-8.
std::string shell_word(std::string_view text);

// "pid 1" or "pids 1, 2"; with `verb` ("holds"/"hold", "is"/"are") the form
// that agrees: pids_text({1, 2}, "is", "are") is "pids 1, 2 are".
std::string pids_text(const std::vector<Pid>& pids);
std::string pids_text(const std::vector<Pid>& pids, std::string_view one, std::string_view many);

// A file mode's permission bits as chmod(1) takes them: "0640", "2770".
std::string octal_mode(unsigned mode);

// Whether `text` is valid UTF-8 (no overlong forms, surrogates or code
// points above U+10FFFF), as JSON needs it.
// ASCII letters lowercased; every other byte as it is.
std::string ascii_lower(std::string_view text);
// Whether `a` and `b` are the same but for the case of ASCII letters (as
// Windows compares program names).
bool equal_ignoring_case(std::string_view a, std::string_view b);

bool valid_utf8(std::string_view text);

// `text` as valid UTF-8 of at most `max_bytes` bytes: each byte that does
// not start a valid character becomes U+FFFD, and the text ends before the
// first character that would not fit (never inside one).
std::string utf8_text(std::string_view text, size_t max_bytes);

// Bytes as lower-case hex digits, and back (nullopt for an odd length or a
// non-hex digit): a name that is not valid UTF-8, stored losslessly in JSON.
std::string hex_encode(std::string_view bytes);
std::optional<std::string> hex_decode(std::string_view hex);

}  // namespace looplock
