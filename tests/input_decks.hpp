#pragma once
// The decks of input/ for tests, parsed with overrides, writing no run files.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fsdpp::test {

// The checkout the tests were built from (tests/source_dir.cpp.in, generated: a path on the compile line of every
// test file would keep another clone's build from reusing their compiled objects through ccache).
const char* built_source_dir();

// The checkout the tests were built from, unless FSDPP_SOURCE_DIR names another folder holding input/ (a
// relocated bundle: tests/gpu/run sets it).
inline std::string source_dir() {
  const char* moved = std::getenv("FSDPP_SOURCE_DIR");
  return moved && *moved ? moved : built_source_dir();
}

inline Deck input_deck(const std::string& name, const std::vector<std::string>& overrides) {
  std::ifstream in(source_dir() + "/input/" + name);
  std::ostringstream text;
  text << in.rdbuf();
  Deck deck = parse_deck(text.str(), name, overrides);
  deck.run.output.clear();  // no files from tests
  return deck;
}

// The UsageError text parse_deck throws for `text` (named deck.yaml) and `overrides`, or "(no error)": what a
// user would see, for tests that assert it exactly.
inline std::string deck_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_deck(text, "deck.yaml", overrides);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace fsdpp::test
