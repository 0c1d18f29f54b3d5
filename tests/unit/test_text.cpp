#include "base/text.hpp"

#include <doctest/doctest.h>

TEST_CASE("printable: control characters are shown, never written") {
  CHECK(looplock::printable("a\nb\rc\td") == "a\\nb\\rc\\td");
  CHECK(looplock::printable(std::string("x\x1b[2Jy\x7f", 7)) == "x\\x1b[2Jy\\x7f");
  CHECK(looplock::printable("caf\xc3\xa9") == "caf\xc3\xa9");  // UTF-8 is kept
}

TEST_CASE("join: one list joiner") {
  CHECK(looplock::join({}) == "");
  CHECK(looplock::join({"a"}) == "a");
  CHECK(looplock::join({"a", "b", "c"}) == "a, b, c");
  CHECK(looplock::join({"a", "b"}, "; ") == "a; b");
}

TEST_CASE("quote: the one quoting rule for operands in messages") {
  CHECK(looplock::quote("--bogus") == "'--bogus'");
  CHECK(looplock::quote("") == "''");
  CHECK(looplock::quote("it's") == "'it'\\''s'");  // as a shell reads it back
  CHECK(looplock::quote("a\nb") == "$'a\\nb'");    // never a line of its own; a shell reads it back
  CHECK(looplock::quote(std::string("E\xff\x1bz", 4)) == "$'E\\xff\\x1bz'");
  CHECK(looplock::quote("it's\t\\") == "$'it\\'s\\t\\\\'");
  CHECK(looplock::shell_word("/srv/loops/nightly") == "/srv/loops/nightly");
  CHECK(looplock::shell_word("lo\nop") == "$'lo\\nop'");
  // Pasted into a shell (or cmd.exe), each reads back as one word.
  CHECK(looplock::shell_word("/tmp/l space") == "\"/tmp/l space\"");
  CHECK(looplock::shell_word("/tmp/it's") == "\"/tmp/it's\"");
  CHECK(looplock::shell_word("") == "\"\"");
  CHECK(looplock::shell_word("/srv/a-b_c.d/e+f@g:h,i=j%k") == "/srv/a-b_c.d/e+f@g:h,i=j%k");
#ifndef _WIN32
  CHECK(looplock::shell_word("/tmp/$HOME") == "'/tmp/$HOME'");
  CHECK(looplock::shell_word("/tmp/a\\b") == "'/tmp/a\\b'");
  CHECK(looplock::shell_word("/tmp/it's $x") == "'/tmp/it'\\''s $x'");
#else
  CHECK(looplock::shell_word("Z:\\tmp\\x") == "Z:\\tmp\\x");
  CHECK(looplock::shell_word("Z:\\tmp\\with space") == "\"Z:\\tmp\\with space\"");
#endif
}

TEST_CASE("valid_utf8: what JSON takes as it is") {
  using looplock::valid_utf8;
  CHECK(valid_utf8(""));
  CHECK(valid_utf8("tick"));
  CHECK(valid_utf8("t\xc3\xa9"));              // é
  CHECK(valid_utf8("\xe2\x82\xac"));           // €
  CHECK(valid_utf8("\xf0\x9f\x98\x80"));       // U+1F600
  CHECK(valid_utf8("\xf4\x8f\xbf\xbf"));       // U+10FFFF
  CHECK_FALSE(valid_utf8("tick\xff"));
  CHECK_FALSE(valid_utf8("\xc3"));             // cut short
  CHECK_FALSE(valid_utf8("\xe2\x82"));         // cut short
  CHECK_FALSE(valid_utf8("\x80"));             // a continuation first
  CHECK_FALSE(valid_utf8("\xc0\xaf"));         // overlong
  CHECK_FALSE(valid_utf8("\xe0\x80\xaf"));     // overlong
  CHECK_FALSE(valid_utf8("\xed\xa0\x80"));     // a surrogate
  CHECK_FALSE(valid_utf8("\xf4\x90\x80\x80")); // above U+10FFFF
  CHECK_FALSE(valid_utf8("\xc3\x28"));         // not a continuation
}

TEST_CASE("hex_encode and hex_decode round-trip any bytes") {
  const std::string all = [] {
    std::string s;
    for (int c = 0; c < 256; ++c) s += static_cast<char>(c);
    return s;
  }();
  CHECK(looplock::hex_encode("tick\xff") == "7469636bff");
  CHECK(looplock::hex_decode(looplock::hex_encode(all)) == all);
  CHECK(looplock::hex_decode("7469636BFF") == std::string("tick\xff"));
  CHECK_FALSE(looplock::hex_decode("7"));
  CHECK_FALSE(looplock::hex_decode("7g"));
  CHECK(looplock::hex_decode("") == std::string());
}

TEST_CASE("utf8_text: valid UTF-8 within a byte bound, never half a character") {
  using looplock::utf8_text;
  CHECK(utf8_text("tick", 256) == "tick");
  CHECK(utf8_text(std::string("tick\xff", 5), 256) == "tick\xef\xbf\xbd");
  CHECK(utf8_text("t\xc3\xa9", 2) == "t");  // é does not fit
  CHECK(utf8_text("t\xc3\xa9", 3) == "t\xc3\xa9");
  CHECK(utf8_text(std::string(300, 'a'), 256).size() == 256);
  CHECK(utf8_text("\xc3", 10) == "\xef\xbf\xbd");  // cut short
  CHECK(utf8_text("ab\xff", 4) == "ab");              // U+FFFD (3 bytes) does not fit
  CHECK(looplock::valid_utf8(utf8_text("\xed\xa0\x80\xf4\x90\x80\x80", 100)));
}

TEST_CASE("printable shows bytes that are not UTF-8 as \\xNN and keeps characters beyond ASCII") {
  CHECK(looplock::printable(std::string("tick\xff", 5)) == "tick\\xff");
  CHECK(looplock::printable("t\xc3\xa9") == "t\xc3\xa9");
  CHECK(looplock::printable("\xe2\x82\xac\x7f") == "\xe2\x82\xac\\x7f");
  CHECK(looplock::printable("\xc3") == "\\xc3");  // cut short
}

TEST_CASE("ascii_lower: ASCII letters only") {
  CHECK(looplock::ascii_lower("PY.EXE Status.Py") == "py.exe status.py");
  CHECK(looplock::ascii_lower("\xc3\x89T\xc3\xa9") == "\xc3\x89t\xc3\xa9");  // UTF-8 bytes stay
}

TEST_CASE("equal_ignoring_case: ASCII letters in either case, nothing else") {
  using looplock::equal_ignoring_case;
  CHECK(equal_ignoring_case("LoopLock", "looplock"));
  CHECK(equal_ignoring_case(".EXE", ".exe"));
  CHECK_FALSE(equal_ignoring_case("looplock", "looplocks"));
  CHECK_FALSE(equal_ignoring_case("a-b", "a_b"));
}
