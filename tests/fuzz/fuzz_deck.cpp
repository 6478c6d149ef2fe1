// Fuzz target: the YAML deck with command-line overrides, parse_deck(text, name, overrides).
//
// Input: deck text, optionally followed by a line "#overrides" (a YAML comment, so a plain deck is a valid
// input) after which every line is one "section.key=value" override, as `fsdpp train deck.yaml k=v ...` passes
// them. Contract: a Deck or an fsdpp::UsageError, nothing else. On an accepted deck, the documented round trip
// must hold: parse_deck(resolved_deck_yaml(deck)) is accepted and resolves to the same text.
#include "fuzz_common.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/config/deck_rules.hpp"

#include <string>
#include <vector>

namespace {

void split(const std::string& input, std::string& yaml, std::vector<std::string>& overrides) {
  static const std::string marker = "#overrides\n";
  std::size_t at = std::string::npos;
  if (input.compare(0, marker.size(), marker) == 0) at = 0;
  else if (const auto p = input.find("\n" + marker); p != std::string::npos) at = p + 1;
  if (at == std::string::npos) {
    yaml = input;
    return;
  }
  yaml = input.substr(0, at);
  std::size_t pos = at + marker.size();
  while (pos < input.size()) {
    const auto nl = input.find('\n', pos);
    const std::size_t end = nl == std::string::npos ? input.size() : nl;
    overrides.push_back(input.substr(pos, end - pos));
    pos = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 64 * 1024) return -1;  // decks are small; longer inputs only slow the search down
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string yaml;
  std::vector<std::string> overrides;
  split(input, yaml, overrides);

  fsdpp::Deck deck;
  try {
    deck = fsdpp::parse_deck(yaml, "fuzz/deck.yaml", overrides);
  } catch (const fsdpp::UsageError&) {
    return 0;  // rejected with a message: the contract
  }
  const std::string resolved = fsdpp::resolved_deck_yaml(deck);
  std::string again;
  try {
    again = fsdpp::resolved_deck_yaml(fsdpp::parse_deck(resolved, "fuzz/resolved.yaml"));
  } catch (const fsdpp::UsageError& e) {
    FSDPP_FUZZ_ASSERT(false, "the resolved deck of an accepted deck is rejected: {}\n---- resolved ----\n{}", e.what(),
                      resolved);
  }
  FSDPP_FUZZ_ASSERT(again == resolved, "the resolved deck does not round-trip\n---- first ----\n{}\n---- second ----\n{}",
                    resolved, again);
  for (const int dp : {1, 2, 3, 8}) {
    try {
      const int accum = fsdpp::grad_accum_steps(deck.train, dp);
      FSDPP_FUZZ_ASSERT(accum >= 1, "grad_accum_steps({}) = {}", dp, accum);
    } catch (const fsdpp::UsageError&) {
    }
  }
  return 0;
}
