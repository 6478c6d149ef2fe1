// model.from_hf: a model described outside the deck (a Hugging Face folder's config.json, as a ModelSource) fills
// the model section; a key the deck sets itself must agree. The comparison is written once, here, for parsing a
// deck and for checking a folder a run starts from (model_conflicts).
#include "fsdpp/config/deck.hpp"
#include "fsdpp/config/deck_schema.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <optional>

namespace fsdpp {
namespace {

using deck_detail::Field;

const Field& field_of(const std::string& path) {
  for (const Field& f : deck_detail::deck_fields())
    if (f.path() == path) return f;
  throw Error(fmt::format("model source: '{}' is not a deck key", path));
}

// The deck's value and the source's, as the echo writes them, when they contradict; nullopt when they agree.
std::optional<std::pair<std::string, std::string>> contradiction(const ModelConfig& ours, const ModelConfig& theirs,
                                                                 const ModelSource::Key& key) {
  const Field& f = field_of(key.deck_key);
  Deck a, b;
  a.model = ours, b.model = theirs;
  a.model.arch = theirs.arch;  // the Llama family's keys read as such on both sides (arch is compared as a key)
  if (key.deck_key == "model.arch") a.model.arch = ours.arch;
  const std::string mine = f.get(a), source = f.get(b);
  if (mine == source) return std::nullopt;
  if (key.deck_may_be_less && std::stoll(mine) <= std::stoll(source)) return std::nullopt;
  return std::make_pair(mine, source);
}

}  // namespace

namespace deck_detail {

void apply_model_source(Deck& deck, const ModelSource& source, const std::map<std::string, std::string>& set_by_deck) {
  const ModelConfig as_read = deck.model;
  for (const ModelSource::Key& key : source.keys) {
    const auto set = set_by_deck.find(key.deck_key);
    if (set != set_by_deck.end()) {
      if (const auto c = contradiction(as_read, source.model, key))
        throw UsageError(fmt::format(
            "{}: {} is {}, but {} says {} {}{} (model.from_hf): remove {} to take the folder's value, or name the "
            "folder of the model you mean", set->second, key.deck_key, c->first, source.where, key.field, c->second,
            key.deck_may_be_less ? ", the most it may be" : "", key.deck_key));
      continue;
    }
    Deck theirs;
    theirs.model = source.model;
    const Field& f = field_of(key.deck_key);
    f.set(deck, YAML::Node(f.get(theirs)), source.where + " (" + key.field + ")");
  }
}

}  // namespace deck_detail

std::vector<std::string> model_conflicts(const ModelConfig& model, const ModelSource& source) {
  std::vector<std::string> out;
  for (const ModelSource::Key& key : source.keys)
    if (const auto c = contradiction(model, source.model, key))
      out.push_back(fmt::format("{} is {}, but {} is {} in {}{}", key.deck_key, c->first, key.field, c->second,
                                source.where, key.deck_may_be_less ? " (the most it may be)" : ""));
  return out;
}

std::string deck_keys_yaml(const Deck& deck, const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& section : deck_detail::deck_sections()) {
    std::string body;
    for (const Field& f : deck_detail::deck_fields())
      if (f.section == section.name && std::find(keys.begin(), keys.end(), f.path()) != keys.end())
        if (const std::string value = f.get(deck); !value.empty()) body += fmt::format("  {}: {}\n", f.key, value);
    if (!body.empty()) out += section.name + ":\n" + body;
  }
  return out;
}

}  // namespace fsdpp
