#pragma once
// Internal to the deck layer (deck_schema.cpp, deck_values.cpp, deck_parse.cpp): the one key table that drives
// parsing, overrides, unknown-key suggestions, the resolved-deck echo and --help-deck. yaml-cpp stays out of
// this header (only a forward declaration) because the install copies every header and the public deck.hpp
// includes none of yaml-cpp's.
#include "fsdpp/config/deck.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace YAML {
class Node;
}

namespace fsdpp::deck_detail {

struct Section {
  std::string name;
  std::string doc;
};

struct Field {
  std::string section, key;
  std::string type;         // as --help-deck shows it: "integer >= 1", "adamw|sgd"
  std::string doc;
  std::string default_doc;  // shown instead of the default value when the default is derived at parse time
  bool required = false;
  // Stores `value` in the deck or throws UsageError("<where>: expected ..., got ...").
  std::function<void(Deck&, const YAML::Node& value, const std::string& where)> set;
  // The value as YAML text for the echo; empty to leave the key out (an absent mesh dimension).
  std::function<std::string(const Deck&)> get;
  // The architectures that read the key (the Llama family's model.* keys), named together as `family` ("Llama");
  // empty: every architecture. parse_deck refuses the key in a deck of another architecture, and the echo
  // leaves it out there.
  std::vector<ModelArch> archs;
  std::string family;

  std::string path() const { return section + "." + key; }
  bool reads(ModelArch arch) const {
    return archs.empty() || std::find(archs.begin(), archs.end(), arch) != archs.end();
  }
};

const std::vector<Section>& deck_sections();
const std::vector<Field>& deck_fields();

// Names other frameworks use for our keys and sections, so that "did you mean" can point from them to ours:
// {"model", "block_size", {"context_length"}}; an empty section means a top-level section name. A name that
// means different things in different frameworks (train.batch_size: per process in nanoGPT and llm.c, per
// job here) is ambiguous: it is refused with `ambiguity` and `use` instead of being mapped to one key, and a
// near miss of it is pointed at every key it may mean.
struct Alias {
  std::string_view section, alias;
  std::vector<std::string_view> targets;  // ours: one name, or each key an ambiguous alias may mean
  std::string_view ambiguity = {};        // why the name cannot be mapped: "per process in nanoGPT and llm.c"
  std::string_view use = {};              // what to write instead, each key with its meaning
  bool ambiguous() const { return !ambiguity.empty(); }
};
const std::vector<Alias>& deck_aliases();

// model.from_hf (deck_model_source.cpp): every key of `source` into `deck`, except those the deck set itself
// (`set_by_deck`: key path -> where), which must agree with it (UsageError at that place naming both values).
void apply_model_source(Deck& deck, const ModelSource& source, const std::map<std::string, std::string>& set_by_deck);

// ---- value vocabulary and helpers (deck_values.cpp) ----

template <class E> struct EnumName {
  std::string_view name;
  E value;
};
template <class E> using EnumNames = std::vector<EnumName<E>>;

extern const EnumNames<ModelArch> kArchs;
extern const EnumNames<MoeBalance> kMoeBalances;
extern const EnumNames<AttentionKind> kAttentions;
extern const EnumNames<PipelineScheduleKind> kPipelineSchedules;
extern const EnumNames<OptimizerKind> kOptimizers;
extern const EnumNames<ScheduleKind> kSchedules;
extern const EnumNames<DataFormat> kFormats;
extern const EnumNames<DataOrder> kOrders;
extern const EnumNames<ShardStrategy> kStrategies;
extern const EnumNames<OffloadPolicy> kOffloads;
extern const EnumNames<CommBackendChoice> kBackends;
extern const EnumNames<GradAccumulation> kAccumulations;
extern const EnumNames<ReplicaAllReduce> kReplicaAllReduces;
extern const EnumNames<ResumeMode> kResumes;
extern const EnumNames<CheckpointOnError> kOnErrors;
extern const EnumNames<NonFinitePolicy> kNonFinite;
extern const EnumNames<MatmulPrecisionChoice> kMatmulPrecisions;
extern const EnumNames<DType> kFloatTypes;  // f32|bf16: the types mixed precision chooses between

template <class E> std::string_view name_of(const EnumNames<E>& names, E value) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "?";
}

// What a node holds, for "got ..." in messages: "'twelve'", "''", "nothing", "a map", "a sequence".
std::string describe_node(const YAML::Node& node);
// True for an empty value ("steps:", "steps: ~"). An override's text is never null: "run.name=null" is a name.
bool is_null_value(const YAML::Node& node);

struct IntText {
  bool is_integer = false;  // decimal digits with an optional sign
  bool overflow = false;    // an integer, but beyond int64
  std::int64_t value = 0;
};
IntText parse_integer(std::string_view text);
bool parse_real(std::string_view text, double& out);  // finite decimal or scientific notation
bool parse_bool(std::string_view text, bool& out);    // true/false, yes/no, on/off in any case

// A string as a YAML scalar: plain when it reads back as the same string, double-quoted otherwise.
std::string yaml_scalar(const std::string& text);
// Shortest text that parses back to the same double.
std::string format_real(double value);

// The candidate closest to `word` by edit distance, or "" when none is close enough to be a likely typo.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace fsdpp::deck_detail
