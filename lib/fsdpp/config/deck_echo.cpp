// Writing a deck back out: the resolved deck (logged, saved with the run and its checkpoints) and the key
// reference for --help-deck. Both come from the key table, so neither can miss a key.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/config/deck_schema.hpp"

#include <fmt/format.h>

#include <sstream>

namespace fsdpp {
namespace {

// Greedy word wrap; a word longer than the width gets a line of its own.
std::string wrap(const std::string& text, std::size_t indent, std::size_t width) {
  std::istringstream words(text);
  std::string out, line, word;
  const std::string pad(indent, ' ');
  while (words >> word) {
    if (!line.empty() && pad.size() + line.size() + 1 + word.size() > width) {
      out += pad + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += pad + line + "\n";
  return out;
}

}  // namespace

std::string resolved_deck_yaml(const Deck& deck) {
  std::string out = "# fsdpp resolved deck: every key, defaults filled in\n";
  for (const auto& section : deck_detail::deck_sections()) {
    std::string body;
    for (const auto& f : deck_detail::deck_fields()) {
      if (f.section != section.name) continue;
      const std::string value = f.get(deck);
      if (!value.empty()) body += fmt::format("  {}: {}\n", f.key, value);
    }
    out += body.empty() ? section.name + ": {}\n" : section.name + ":\n" + body;
  }
  return out;
}

std::string deck_help() {
  const Deck defaults;
  std::string out =
      "fsdpp input deck: a YAML map of sections, each a map of key: value. Every key has a default except those\n"
      "marked (required); unknown and repeated keys are errors. Override any key after the deck file:\n"
      "  fsdpp train deck.yaml train.steps=50 optim.lr=3e-4\n";
  for (const auto& section : deck_detail::deck_sections()) {
    out += fmt::format("\n{}: {}\n", section.name, section.doc);
    for (const auto& f : deck_detail::deck_fields()) {
      if (f.section != section.name) continue;
      const std::string value = f.default_doc.empty() ? f.get(defaults) : f.default_doc;
      out += fmt::format("  {:<27} {:<30} default: {}\n", f.path(), f.type, value);
      out += wrap(f.doc, 6, 110);
    }
  }
  return out;
}

std::vector<std::string> deck_keys() {
  std::vector<std::string> keys;
  for (const auto& f : deck_detail::deck_fields()) keys.push_back(f.path());
  return keys;
}

}  // namespace fsdpp
