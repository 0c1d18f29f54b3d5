#include "records/sealed.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "os/digest.hpp"
#include "testutil.hpp"

using looplock::seal;
using looplock::unseal;

TEST_CASE("seal: the check is the SHA-256 of the text before it, and goes last") {
  const std::string body = R"({"a":1)";
  const std::string sealed = seal(body);
  CHECK(sealed == body + R"(,"check":")" + looplock::sys::sha256_hex(body).substr(0, 16) + "\"}\n");
  CHECK(looplock::check_of(body) == looplock::sys::sha256_hex(body).substr(0, 16));
}

TEST_CASE("unseal: a whole text, padded or not; a torn one is refused") {
  const std::string sealed = seal(R"({"a":1)");
  auto u = unseal(sealed);
  REQUIRE(u);
  CHECK(u->checked);
  CHECK(u->object == sealed.substr(0, sealed.size() - 1));
  std::string padded = sealed;
  padded.insert(padded.size() - 1, 30, ' ');
  REQUIRE(unseal(padded));
  CHECK(unseal(padded)->object == u->object);
  // Part new, part old: the check no longer matches.
  std::string mixed = sealed;
  mixed[2] = 'b';
  CHECK_FALSE(unseal(mixed));
  // No newline, not an object, a check of the wrong length.
  CHECK_FALSE(unseal(sealed.substr(0, sealed.size() - 1)));
  CHECK_FALSE(unseal("[1]\n"));
  CHECK_FALSE(unseal(R"({"a":1,"check":"abc"})" "\n"));
  CHECK_FALSE(unseal(""));
  // Without a check (another tool's object): taken, and said to be unchecked.
  auto plain = unseal("{\"a\":1}\n");
  REQUIRE(plain);
  CHECK_FALSE(plain->checked);
}

TEST_CASE("write_over: pads to the old size, never shrinks, cuts off a file beyond the bound") {
  testutil::TempDir dir;
  const std::string path = dir / "f";
  testutil::write_file(path, std::string(100, 'x') + "\n");
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const std::string data = seal(R"({"a":1)");
  REQUIRE(looplock::write_over(fd, data, 4096));
  auto text = testutil::slurp(path);
  REQUIRE(text);
  CHECK(text->size() == 101);
  CHECK(text->back() == '\n');
  REQUIRE(unseal(*text));
  CHECK(unseal(*text)->object == data.substr(0, data.size() - 1));
  // Larger than the bound: truncated first, so the text is exactly the data.
  REQUIRE(looplock::write_over(fd, data, 50));
  CHECK(testutil::slurp(path) == data);
  ::close(fd);
}

TEST_CASE("sealed_copies: each line that unseals with its check, NUL bytes and spaces before it skipped (but in its span)") {
  const std::string a = seal(R"({"g":1)");
  const std::string b = seal(R"({"g":2)");
  std::string padded_a = a;
  padded_a.insert(padded_a.size() - 1, 5, ' ');
  const std::string text = padded_a + std::string(3, '\0') + b + "{\"torn";
  const auto copies = looplock::sealed_copies(text);
  REQUIRE(copies.size() == 2);
  CHECK(copies[0].object == a.substr(0, a.size() - 1));
  CHECK(copies[0].begin == 0);
  CHECK(copies[0].end == padded_a.size());
  CHECK(copies[1].object == b.substr(0, b.size() - 1));
  CHECK(copies[1].begin == padded_a.size());  // its line's start, before the NUL bytes
  CHECK(copies[1].end == padded_a.size() + 3 + b.size());
  // A torn copy (the half of a line) and a line without a check are none.
  CHECK(looplock::sealed_copies(a.substr(0, a.size() / 2) + "\n" + "{\"a\":1}\n").empty());
}

TEST_CASE("place_copy: the first place from the file's start that overlaps no kept copy, within the bound") {
  const std::string data = "{\"n\":1}\n";  // 8 bytes
  using looplock::Span;
  // Fits before the kept copy at [20, 40): at 0, not padded.
  auto p = looplock::place_copy(data, {{20, 40}}, 100);
  REQUIRE(p);
  CHECK(p->offset == 0);
  CHECK(p->data == data);
  // Does not fit before it: right after it.
  p = looplock::place_copy(data, {{4, 30}}, 100);
  REQUIRE(p);
  CHECK(p->offset == 30);
  // Two kept copies, in any order: the gap between them when it fits...
  p = looplock::place_copy(data, {{30, 50}, {0, 20}}, 100);
  REQUIRE(p);
  CHECK(p->offset == 20);
  // ...else after the later one.
  p = looplock::place_copy(data, {{25, 50}, {0, 20}}, 100);
  REQUIRE(p);
  CHECK(p->offset == 50);
  // Touching copies leave no gap; exactly the bound still fits.
  p = looplock::place_copy(data, {{0, 20}, {20, 42}}, 50);
  REQUIRE(p);
  CHECK(p->offset == 42);
  // Past the bound: nowhere.
  CHECK_FALSE(looplock::place_copy(data, {{0, 20}, {20, 43}}, 50));
}
