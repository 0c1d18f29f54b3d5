#include "text.hpp"

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
  CHECK(looplock::quote("a\nb") == "'a\\nb'");     // never a line of its own
}
