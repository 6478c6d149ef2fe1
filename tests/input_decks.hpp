#pragma once
// The decks of input/ for tests, parsed with overrides, writing no run files.
#include "fsdpp/config/deck.hpp"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fsdpp::test {

inline Deck input_deck(const std::string& name, const std::vector<std::string>& overrides) {
  std::ifstream in(std::string(FSDPP_SOURCE_DIR) + "/input/" + name);
  std::ostringstream text;
  text << in.rdbuf();
  Deck deck = parse_deck(text.str(), name, overrides);
  deck.run.output.clear();  // no files from tests
  return deck;
}

}  // namespace fsdpp::test
