// Reading a deck: walk every map ourselves, because yaml-cpp 0.7 silently accepts unknown and duplicate keys
// (docs/stack-notes.md §6.1); then overrides, derived defaults and the checks that involve more than one key.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/config/deck_schema.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <utility>

namespace fsdpp {
namespace {

using deck_detail::deck_aliases;
using deck_detail::deck_fields;
using deck_detail::deck_sections;
using deck_detail::Field;

// Where a key's value came from. A cross-key error is reported at the origin with the highest rank (the last
// override, else the latest line) since that is most likely the edit that broke the deck.
struct Origin {
  std::int64_t rank = 0;
  std::string where;  // "deck.yaml:4:11" or "override 'model.n_head=7'"
};
constexpr std::int64_t kOverrideRank = std::int64_t{1} << 40;

struct ParseState {
  std::string file;
  Deck deck;
  std::map<std::string, Origin> origins;           // by key path; absent: the default
  std::map<std::string, std::string> section_at;   // section name -> "deck.yaml:L:C" of its key
};

template <class... Args> [[noreturn]] void reject(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

std::string at(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null()) return file;
  return fmt::format("{}:{}:{}", file, mark.line + 1, mark.column + 1);  // yaml-cpp counts from 0
}

bool is_section(const std::string& name) {
  for (const auto& s : deck_sections())
    if (s.name == name) return true;
  return false;
}

const Field* find_field(const std::string& section, const std::string& key) {
  for (const auto& f : deck_fields())
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

// " (did you mean 'x'?)" for the known name (of a section when `section` is empty) nearest to `word`; " (did you
// mean 'x' or 'y'?)" when that is an ambiguous alias.
std::string suggestion(const std::string& section, const std::string& word) {
  std::vector<std::string> names;
  std::vector<std::vector<std::string_view>> targets;
  if (section.empty()) {
    for (const auto& s : deck_sections()) names.push_back(s.name), targets.push_back({s.name});
  } else {
    for (const auto& f : deck_fields())
      if (f.section == section) names.push_back(f.key), targets.push_back({f.key});
  }
  for (const auto& a : deck_aliases())
    if (a.section == section) names.emplace_back(a.alias), targets.push_back(a.targets);
  const std::string best = deck_detail::closest(word, names);
  if (best.empty()) return "";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] != best) continue;
    std::string choices;
    for (std::size_t t = 0; t < targets[i].size(); ++t)
      choices += fmt::format("{}'{}'", t == 0 ? "" : t + 1 == targets[i].size() ? " or " : ", ", targets[i][t]);
    return fmt::format(" (did you mean {}?)", choices);
  }
  return "";
}

// An unknown key: an ambiguous alias is refused with what to write instead; anything else gets its nearest name.
std::string unknown_key(const std::string& section, const std::string& key) {
  for (const auto& a : deck_aliases())
    if (a.ambiguous() && a.section == section && a.alias == key)
      return fmt::format("{}.{} is ambiguous ({}): use {}", section, key, a.ambiguity, a.use);
  return fmt::format("unknown key '{}' in '{}'{}", key, section, suggestion(section, key));
}

std::string scalar_key(const YAML::Node& key, const std::string& file) {
  if (!key.IsScalar())
    reject("{}: expected a key name, got {}", at(file, key.Mark()), deck_detail::describe_node(key));
  return key.Scalar();
}

// Keys of a section that share a prefix ("moe.num_experts", "moe.top_k" in model) may be written as a map under it.
bool has_subsection(const std::string& section, const std::string& prefix) {
  for (const Field& f : deck_fields())
    if (f.section == section && f.key.rfind(prefix + ".", 0) == 0) return true;
  return false;
}

void read_section(ParseState& st, const std::string& section, const YAML::Node& body, const std::string& prefix = "") {
  if (body.IsNull()) return;  // "train:" with nothing under it: all defaults
  if (!body.IsMap())
    reject("{}: section '{}': expected a map of keys, got {}", at(st.file, body.Mark()), section,
           deck_detail::describe_node(body));
  std::map<std::string, int> first_line;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string key = prefix + scalar_key(it->first, st.file);
    const std::string key_at = at(st.file, it->first.Mark());
    if (it->second.IsMap() && !find_field(section, key) && has_subsection(section, key)) {
      read_section(st, section, it->second, key + ".");  // model: {moe: {num_experts: 8}} is model.moe.num_experts
      continue;
    }
    const Field* field = find_field(section, key);
    if (!field) reject("{}: {}", key_at, unknown_key(section, key));
    const auto [seen, fresh] = first_line.emplace(key, it->first.Mark().line + 1);
    if (!fresh)
      reject("{}: duplicate key '{}' in '{}' (first at line {})", key_at, key, section, seen->second);
    // An empty value has no position of its own (yaml-cpp gives the next token's); point at its key instead.
    const YAML::Mark& mark = it->second.IsNull() ? it->first.Mark() : it->second.Mark();
    const std::string value_at = at(st.file, mark);
    field->set(st.deck, it->second, value_at + ": " + field->path());
    st.origins[field->path()] = {(mark.line + 1) * std::int64_t{100000} + mark.column, value_at};
  }
}

// Where the documents of a YAML stream start, and where their root nodes are, from parser events.
class DocumentMarks : public YAML::EventHandler {
 public:
  struct Document {
    YAML::Mark start, root;
    bool has_root = false;
  };
  std::vector<Document> docs;

  void OnDocumentStart(const YAML::Mark& mark) override { docs.push_back({mark, mark, false}); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override { node(mark); }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& mark) {
    if (!docs.empty() && !docs.back().has_root) docs.back().root = mark, docs.back().has_root = true;
  }
};

// The deck's one document. Not YAML::LoadAll: in yaml-cpp 0.7 it never returns on a document that starts with a
// stray ',' (the parser yields an empty document there without consuming anything, again and again, until memory
// runs out; jbeder/yaml-cpp#1040, fixed upstream by #1319). Found by fuzzing (tests/fuzz/regressions/deck/). The
// parser is stepped through a few documents only, enough to see a second one (an error) or a document that
// starts where the previous one did (that stuck parser).
YAML::Node load_one_document(const ParseState& st, const std::string& text) {
  YAML::Node root;
  DocumentMarks marks;
  bool stuck = false;
  try {
    root = YAML::Load(text);
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (marks.docs.size() < 4 && parser.HandleNextDocument(marks)) {
      const auto n = marks.docs.size();
      if (n >= 2 && marks.docs[n - 1].start.pos == marks.docs[n - 2].start.pos) {
        stuck = true;
        break;
      }
    }
  } catch (const YAML::Exception& e) {
    reject("{}: YAML syntax error: {}", at(st.file, e.mark), e.msg);
  }
  if (stuck) {
    const YAML::Mark& mark = marks.docs.back().start;
    const auto pos = static_cast<std::size_t>(std::max(mark.pos, 0));
    reject("{}: YAML syntax error: unexpected '{}' where a document should start", at(st.file, mark),
           pos < text.size() ? text.substr(pos, 1) : std::string());
  }
  if (marks.docs.size() > 1)
    reject("{}: a deck is one YAML document, but a second one starts here", at(st.file, marks.docs[1].root));
  return root;
}

void read_document(ParseState& st, const std::string& text) {
  const YAML::Node root = load_one_document(st, text);
  if (!root.IsDefined() || root.IsNull()) return;
  if (!root.IsMap())
    reject("{}: expected a map of sections (run, model, data, ...), got {}", at(st.file, root.Mark()),
           deck_detail::describe_node(root));
  std::map<std::string, int> first_line;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string name = scalar_key(it->first, st.file);
    const std::string name_at = at(st.file, it->first.Mark());
    if (!is_section(name)) reject("{}: unknown section '{}'{}", name_at, name, suggestion("", name));
    const auto [seen, fresh] = first_line.emplace(name, it->first.Mark().line + 1);
    if (!fresh) reject("{}: duplicate section '{}' (first at line {})", name_at, name, seen->second);
    st.section_at[name] = name_at;
    read_section(st, name, it->second);
  }
}

// "section.key=value". The value is taken as literal scalar text, not parsed as YAML: the shell has already
// removed the user's quotes, so "run.name=null" or "data.source=a: b" mean exactly what they say.
void apply_override(ParseState& st, const std::string& text, std::size_t index) {
  const std::string where = fmt::format("override '{}'", text);
  const auto eq = text.find('=');
  if (eq == std::string::npos) reject("{}: expected key=value", where);
  const std::string path = text.substr(0, eq), value = text.substr(eq + 1);
  const auto dot = path.find('.');
  if (dot == std::string::npos) {
    // "steps=5": point at the section the key (or the nearest one) lives in.
    std::vector<std::string> keys;
    for (const auto& f : deck_fields()) keys.push_back(f.key);
    const std::string key = deck_detail::closest(path, keys);
    std::string hint;
    for (const auto& f : deck_fields())
      if (hint.empty() && !key.empty() && f.key == key) hint = f.path();
    reject("{}: expected section.key=value{}", where,
           hint.empty() ? ", e.g. train.steps=50" : fmt::format(" (did you mean '{}'?)", hint));
  }
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  if (!is_section(section))
    reject("{}: unknown section '{}'{}", where, section, suggestion("", section));
  const Field* field = find_field(section, key);
  if (!field) reject("{}: {}", where, unknown_key(section, key));
  field->set(st.deck, YAML::Node(value), where);
  st.origins[field->path()] = {kOverrideRank + static_cast<std::int64_t>(index), where};
  // An override names the data to use now (fsdpp eval's --tokens on a deck that trained on a mixture): it replaces
  // the deck's data.sources, which a deck file may not give beside data.source (check_data_sources).
  if (field->path() == "data.source" && !st.deck.data.sources.empty()) {
    st.deck.data.sources.clear();
    st.origins.erase("data.sources");
  }
}

// model.from_hf: the folder's keys fill the model section before the derived defaults (which then see them as
// given); the keys it gave are recorded as coming from it, so a rule they break points at its file.
void read_model_source(ParseState& st, const ModelSourceReader& from_hf) {
  if (st.deck.model.from_hf.empty()) return;
  const std::string& at_key = st.origins.at("model.from_hf").where;
  if (!from_hf) reject("{}: model.from_hf: this command reads no model folder; give the model.* keys instead", at_key);
  std::map<std::string, std::string> set_by_deck;
  for (const auto& [path, origin] : st.origins) set_by_deck[path] = origin.where;
  const ModelSource source = from_hf(st.deck.model.from_hf);
  deck_detail::apply_model_source(st.deck, source, set_by_deck);
  for (const auto& key : source.keys) st.origins.emplace(key.deck_key, Origin{0, source.where + " (" + key.field + ")"});
}

void check_required(const ParseState& st) {
  for (const auto& f : deck_fields()) {
    if (!f.required || st.origins.count(f.path())) continue;
    const auto section = st.section_at.find(f.section);
    if (section != st.section_at.end())
      reject("{}: missing required key '{}' in '{}'", section->second, f.key, f.section);
    reject("{}: missing required key '{}' in '{}' (the deck has no '{}' section)", st.file, f.key, f.section,
           f.section);
  }
}

// "runs/deck.yaml" -> "deck"
std::string file_stem(const std::string& file) {
  std::string name = file.substr(file.find_last_of('/') + 1);
  const auto dot = name.find_last_of('.');
  if (dot != std::string::npos) name.erase(dot);
  return name.empty() ? "run" : name;
}

// Defaults that depend on other keys, filled after the overrides so that an override of run.name moves the
// output folder with it.
}  // namespace

int llama_ffn_hidden(int n_embd, double multiplier, int multiple_of) {
  std::int64_t hidden = 2 * (4 * std::int64_t{n_embd}) / 3;
  hidden = static_cast<std::int64_t>(multiplier * static_cast<double>(hidden));
  hidden = multiple_of * ((hidden + multiple_of - 1) / multiple_of);
  return static_cast<int>(std::min<std::int64_t>(hidden, std::numeric_limits<int>::max()));
}

namespace {

void fill_derived(ParseState& st) {
  Deck& d = st.deck;
  if (!st.origins.count("run.name")) d.run.name = file_stem(st.file);
  if (!st.origins.count("run.output")) d.run.output = "runs/" + d.run.name;
  if (!st.origins.count("checkpoint.dir")) d.checkpoint.dir = d.run.output + "/checkpoints";
  if (!st.origins.count("train.micro_batch")) d.train.micro_batch = d.train.global_batch;
  if (!st.origins.count("data.source") && !d.data.sources.empty()) d.data.source.clear();  // the mixture replaces it
  if (is_llama_family(d.model.arch)) {
    if (!st.origins.count("model.tie_embeddings")) d.model.tie_embeddings = false;
    // Qwen's and Mistral's releases: RoPE base 1e6; Qwen's RMSNorm epsilon 1e-6.
    const bool qwen = d.model.arch == ModelArch::qwen2 || d.model.arch == ModelArch::qwen3 ||
                      d.model.arch == ModelArch::qwen3_moe;
    if ((qwen || d.model.arch == ModelArch::mixtral) && !st.origins.count("model.rope_theta")) d.model.rope_theta = 1e6;
    if (qwen && !st.origins.count("model.norm_eps")) d.model.norm_eps = 1e-6;
    if (!st.origins.count("model.n_kv_head")) d.model.n_kv_head = d.model.n_head;
    if (!st.origins.count("model.ffn_hidden"))
      d.model.ffn_hidden = llama_ffn_hidden(d.model.n_embd, d.model.ffn_multiplier, d.model.ffn_multiple_of);
  }
}

template <class Keys> [[noreturn]] void inconsistent(const ParseState& st, const Keys& paths, const std::string& message) {
  const Origin* last = nullptr;
  for (const auto& p : paths) {
    const auto found = st.origins.find(p);
    if (found != st.origins.end() && (!last || found->second.rank > last->rank)) last = &found->second;
  }
  reject("{}: {}", last ? last->where : st.file, message);
}

// A key the key table marks as read by some architectures only (the Llama family's), set in a deck of another:
// refused rather than silently ignored.
void check_architecture_keys(const ParseState& st) {
  const ModelArch arch = st.deck.model.arch;
  for (const auto& f : deck_fields()) {
    if (f.reads(arch) || !st.origins.count(f.path())) continue;
    std::string archs(to_string(f.archs.front())), others;  // "llama (or qwen2)"
    for (std::size_t i = 1; i < f.archs.size(); ++i)
      others += fmt::format("{}{}", i > 1 ? ", " : "", to_string(f.archs[i]));
    if (!others.empty()) archs += " (or " + others + ")";
    inconsistent(st, std::vector<std::string>{f.path(), "model.arch"},
                 fmt::format("{} applies to {} models only, but model.arch is {}: remove {} or set model.arch: {}",
                             f.path(), f.family, to_string(arch), f.path(), archs));
  }
}

// Every deck-wide rule (deck_rules.hpp), in the order a deck is read: the model, training, then parallelism.
// The launch-time ones (job size, data-parallel split) wait for a launch.
void check_rules(const ParseState& st) {
  const Deck& d = st.deck;
  check_architecture_keys(st);
  try {
    check_model_shape(d.model);
    check_batch(d.train);
    check_reproducible(d.train, d.fsdp);
    check_schedule(d.schedule, d.optim, d.train);
    check_evaluation(d.train, d.data);
    check_document_masks(d.data, d.model);
    check_data_sources(d.data);
    check_parallel_strategy(d.fsdp, d.mesh);
    check_tensor_parallel(d.model, d.mesh.tp, d.mesh.tp_sequence_parallel);
    check_expert_parallel(d.model, d.mesh, d.mesh.dp_shard);
    check_context_parallel(d.model, d.mesh, d.train, d.fsdp);
    check_reproducible_chunks(d.model, d.mesh, d.train);
    check_pipeline(d.model, d.mesh, d.pipeline);
    if (d.mesh.tp_sequence_parallel)
      check_sequence_parallel_tokens(d.train.micro_batch, d.model.context_length, d.mesh.tp);
    check_activation_checkpointing(d.train.activation_checkpointing, d.model.n_layer);
    check_trace(d.run, d.train, d.comm);
  } catch (const DeckRuleError& e) {
    inconsistent(st, e.keys(), e.what());
  }
}

}  // namespace

Deck parse_deck(const std::string& yaml_text, const std::string& file_name, const std::vector<std::string>& overrides,
                const ModelSourceReader& from_hf) {
  ParseState st;
  st.file = file_name;
  read_document(st, yaml_text);
  for (std::size_t i = 0; i < overrides.size(); ++i) apply_override(st, overrides[i], i);
  read_model_source(st, from_hf);
  check_required(st);
  fill_derived(st);
  check_rules(st);
  return st.deck;
}

}  // namespace fsdpp
