// Files that are rewritten in place, and read without the writer's lock: a
// JSON object whose last field, "check", is the first 16 hex digits of the
// SHA-256 of the text before ',"check":"', so that a reader can tell a text
// it read while it was being rewritten (part old, part new) from a whole
// one; and the in-place write itself, padded so that the file never shrinks
// (ftruncate(2) or a rename costs ext4 a journal transaction on every run).
// The holder record (holder.hpp) and the run ledger (ledger.hpp) use them.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace looplock {

// The check of `body` (the object's text before ',"check":"').
std::string check_of(std::string_view body);

// `body` is an object's text without its closing brace ("{...");
// returns it sealed: body + ',"check":"' + check_of(body) + '"}' + "\n".
std::string seal(const std::string& body);

struct Unsealed {
  std::string_view object;  // the object's text, padding and newline removed
  bool checked = false;     // it had a check (which matched)
};
// A file's text: one object, then optional space padding, then a newline.
// nullopt when it is not that, or when its check does not match.
std::optional<Unsealed> unseal(std::string_view content);

// Files that keep two or three sealed copies, so that a write cut short (a
// full disk, a file-size limit, a quota, EIO, a crash) never touches the
// only valid one: the run ledger (ledger.hpp). Each copy is one line; a
// reader takes every line that unseals with its check, and the writer puts
// the next copy where it overlaps none of the copies it keeps.
// A copy's bytes in the file: [begin, end).
struct Span {
  size_t begin = 0;
  size_t end = 0;
};
struct SealedCopy {
  std::string_view object;  // as unseal() gives it
  size_t begin = 0;         // its line's first byte (before the NUL bytes or spaces a
                            // reader skips: a write there would tear the copy)
  size_t end = 0;           // one past its newline
};
// The checked copies of `content`, in file order: each line that unseals
// with a check, once the NUL bytes (space reserved and never written) and
// spaces before it are skipped. Lines that do not (a torn copy, an older
// one's tail) are no copies.
std::vector<SealedCopy> sealed_copies(std::string_view content);
// The same in two steps, for a reader that checks only the lines it needs:
// the lines of `content` (each with its newline; a tail without one is no
// line), in file order; and the copy a line holds, when it unseals with a
// check.
std::vector<Span> line_spans(std::string_view content);
std::optional<SealedCopy> sealed_copy_at(std::string_view content, Span line);
// Where a new copy `data` (ending with a newline) goes so that it overlaps
// none of `keep` (the copies the writer keeps: the newest valid one, and
// one it relies on as durable): the first place from the file's start where
// it fits and ends by `max_end`; nullopt when there is none. It is not
// padded: what is left of an older line after it is a line of its own that
// is no copy (sealed_copies skips it), and a copy's bytes are never more
// than its text, so that two kept copies leave room for a third.
struct Placement {
  long long offset = 0;
  std::string data;
};
std::optional<Placement> place_copy(std::string data, std::vector<Span> keep, size_t max_end);

// Writes `data` (ending with a newline) over fd's content from offset 0,
// padded with spaces before the newline to the file's size when that is
// larger; a file larger than `max_padded` is truncated first. False with
// errno set on failure.
bool write_over(int fd, std::string data, long long max_padded);

}  // namespace looplock
