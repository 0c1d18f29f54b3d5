// The shells' completion scripts, made from the option table (cli/completions.hpp).
#include <doctest/doctest.h>

#include <string>

#include "cli/completions.hpp"
#include "cli/option_table.hpp"

using looplock::completion_script;

TEST_CASE("a script for bash, zsh and fish; none for another shell") {
  for (const char* shell : {"bash", "zsh", "fish"}) {
    CAPTURE(shell);
    const auto script = completion_script(shell);
    REQUIRE(script);
    for (const char* mark : {"@VALUE_OPTS@", "@VALUE_SHORTS@", "@VALUE_CASES@", "@OPTS@", "@SPECS@", "@WORD_ARRAYS@",
                             "@WORD_STATES@", "@NOT_WITH_C@", "@OPTIONS@"}) {
      CHECK(script->find(mark) == std::string::npos);  // every mark filled in
    }
    CHECK(script->find(std::string("looplock --completions ") + shell) != std::string::npos);
  }
  CHECK_FALSE(completion_script("ksh"));
  CHECK_FALSE(completion_script(""));
}

TEST_CASE("every option with a description is completed, by every spelling, in every script") {
  const std::string bash = *completion_script("bash");
  const std::string zsh = *completion_script("zsh");
  const std::string fish = *completion_script("fish");
  for (const auto& o : looplock::option_table()) {
    const std::string name(o.name);
    CAPTURE(name);
    if (o.brief.empty()) {  // -u: declared only to point its users elsewhere
      CHECK(bash.find(" --" + name + " ") == std::string::npos);
      continue;
    }
    CHECK(bash.find("--" + name) != std::string::npos);
    CHECK(zsh.find("--" + name + (o.value.empty() ? "" : "=")) != std::string::npos);
    CHECK(fish.find(" -l " + name + " ") != std::string::npos);
    if (o.letter) CHECK(fish.find(std::string(" -s ") + o.letter + " -l " + name) != std::string::npos);
    for (const auto& w : o.words) CHECK(bash.find(std::string(w.word)) != std::string::npos);
  }
}

TEST_CASE("descriptions are quoted for each shell") {
  // --warn-before's description has apostrophes ("--max-time's TERM").
  CHECK(completion_script("zsh")->find("--max-time'\"'\"'s TERM") != std::string::npos);
  CHECK(completion_script("fish")->find("--max-time\\'s TERM") != std::string::npos);
  // The value shorts (-p, -w, -E) decide where a group of short options ends.
  CHECK(completion_script("bash")->find("_looplock_value_shorts=pwE\n") != std::string::npos);
  CHECK(completion_script("fish")->find("'^-[^pwE]*[pwE]$'") != std::string::npos);
}
