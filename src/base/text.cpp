#include "base/text.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "os/ids.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {

// The length of the valid UTF-8 character at the start of `text`, or 0 when
// it does not start with one (a continuation byte, an overlong form, a
// surrogate, a code point above U+10FFFF, or one cut short).
size_t utf8_char(std::string_view text) {
  const auto c = static_cast<unsigned char>(text[0]);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned cp = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 1;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 2;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 3;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (n >= text.size()) return 0;
  for (size_t k = 1; k <= n; ++k) {
    const auto cc = static_cast<unsigned char>(text[k]);
    if ((cc & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  const unsigned least[] = {0, 0x80, 0x800, 0x10000};
  if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n + 1;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = c >= 0x80 ? utf8_char(text.substr(i)) : 1;
    if (n > 1) {  // a character beyond ASCII: as it is
      out += text.substr(i, n);
      i += n;
      continue;
    }
    ++i;
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7f) {  // a control character, or a byte that is not UTF-8
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

namespace {

// `text` as the inside of a shell's $'...': backslashes and apostrophes
// escaped, then what printable() escapes.
std::string ansi_c_inside(std::string_view text) {
  std::string escaped;
  for (char c : text) {
    if (c == '\\' || c == '\'') escaped += '\\';
    escaped += c;
  }
  return printable(escaped);
}

bool needs_escapes(std::string_view text) { return printable(text) != text; }

}  // namespace

std::string quote(std::string_view operand) {
  // With bytes a terminal must not get (control characters, bytes that are
  // not UTF-8): $'...', which a shell reads back to the very bytes.
  if (needs_escapes(operand)) return "$'" + ansi_c_inside(operand) + "'";
  std::string out = "'";
  for (char c : operand) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string shell_word(std::string_view text) {
  if (needs_escapes(text)) return "$'" + ansi_c_inside(text) + "'";
  // Windows' separator is no shell's escape there (cmd.exe, PowerShell).
  const bool backslash_plain = sys::is_path_separator('\\');
  auto plain = [&](char c) {
    const auto u = static_cast<unsigned char>(c);
    return std::isalnum(u) || u >= 0x80 || std::string_view("_./:@%+=,-").find(c) != std::string_view::npos ||
           (backslash_plain && c == '\\');
  };
  if (!text.empty() && std::all_of(text.begin(), text.end(), plain)) return std::string(text);
  // Double quotes, which sh, cmd.exe and PowerShell all read (a space, an
  // apostrophe); what sh still expands inside them goes in single quotes,
  // as quote() writes them.
  const std::string_view expands = backslash_plain ? "\"" : "\"$`\\!";
  if (text.find_first_of(expands) == std::string_view::npos) return "\"" + std::string(text) + "\"";
  return quote(text);
}

std::string octal_mode(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777);
  return buf;
}

std::string pids_text(const std::vector<Pid>& pids) {
  std::string out = pids.size() > 1 ? "pids " : "pid ";
  for (size_t i = 0; i < pids.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(pids[i]);
  return out;
}

std::string pids_text(const std::vector<Pid>& pids, std::string_view one, std::string_view many) {
  return pids_text(pids) + " " + std::string(pids.size() > 1 ? many : one);
}

std::string ascii_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

bool valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_char(text.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_text(std::string_view text, size_t max_bytes) {
  static constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_char(text.substr(i));
    const std::string_view piece = n ? text.substr(i, n) : kReplacement;
    if (out.size() + piece.size() > max_bytes) break;
    out += piece;
    i += n ? n : 1;
  }
  return out;
}

std::string hex_encode(std::string_view bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::optional<std::string> hex_decode(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = value(hex[i]);
    const int lo = value(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace looplock
