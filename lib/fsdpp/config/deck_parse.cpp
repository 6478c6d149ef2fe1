// Reading a deck: walk every map ourselves, because yaml-cpp 0.7 silently accepts unknown and duplicate keys
// (docs/stack-notes.md §6.1); then overrides, derived defaults and the checks that involve more than one key.
#include "fsdpp/config/deck.hpp"
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

// " (did you mean 'x'?)" for the known name (of a section when `section` is empty) nearest to `word`.
std::string suggestion(const std::string& section, const std::string& word) {
  std::vector<std::string> names, targets;
  if (section.empty()) {
    for (const auto& s : deck_sections()) names.push_back(s.name), targets.push_back(s.name);
  } else {
    for (const auto& f : deck_fields())
      if (f.section == section) names.push_back(f.key), targets.push_back(f.key);
  }
  for (const auto& a : deck_aliases())
    if (a.section == section) names.emplace_back(a.alias), targets.emplace_back(a.target);
  const std::string best = deck_detail::closest(word, names);
  if (best.empty()) return "";
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == best) return fmt::format(" (did you mean '{}'?)", targets[i]);
  return "";
}

std::string unknown_key(const std::string& section, const std::string& key) {
  return fmt::format("unknown key '{}' in '{}'{}", key, section, suggestion(section, key));
}

std::string scalar_key(const YAML::Node& key, const std::string& file) {
  if (!key.IsScalar())
    reject("{}: expected a key name, got {}", at(file, key.Mark()), deck_detail::describe_node(key));
  return key.Scalar();
}

void read_section(ParseState& st, const std::string& section, const YAML::Node& body) {
  if (body.IsNull()) return;  // "train:" with nothing under it: all defaults
  if (!body.IsMap())
    reject("{}: section '{}': expected a map of keys, got {}", at(st.file, body.Mark()), section,
           deck_detail::describe_node(body));
  std::map<std::string, int> first_line;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string key = scalar_key(it->first, st.file);
    const std::string key_at = at(st.file, it->first.Mark());
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
  if (d.model.arch != ModelArch::gpt2) {
    if (!st.origins.count("model.tie_embeddings")) d.model.tie_embeddings = false;
    if (d.model.arch == ModelArch::qwen2 && !st.origins.count("model.rope_theta")) d.model.rope_theta = 1e6;
    if (d.model.arch == ModelArch::qwen2 && !st.origins.count("model.norm_eps")) d.model.norm_eps = 1e-6;
    if (!st.origins.count("model.n_kv_head")) d.model.n_kv_head = d.model.n_head;
    if (!st.origins.count("model.ffn_hidden"))
      d.model.ffn_hidden = llama_ffn_hidden(d.model.n_embd, d.model.ffn_multiplier, d.model.ffn_multiple_of);
  }
}

[[noreturn]] void inconsistent(const ParseState& st, std::initializer_list<const char*> paths,
                               const std::string& message) {
  const Origin* last = nullptr;
  for (const char* p : paths) {
    const auto found = st.origins.find(p);
    if (found != st.origins.end() && (!last || found->second.rank > last->rank)) last = &found->second;
  }
  reject("{}: {}", last ? last->where : st.file, message);
}

// The keys only the Llama family reads (deck.hpp), refused in a gpt2 deck rather than silently ignored.
constexpr const char* kLlamaOnlyKeys[] = {"model.n_kv_head",      "model.ffn_hidden", "model.ffn_multiplier",
                                          "model.ffn_multiple_of", "model.rope_theta", "model.norm_eps",
                                          "model.rope_scaling_factor", "model.rope_low_freq_factor",
                                          "model.rope_high_freq_factor", "model.rope_original_context"};

void check_model(const ParseState& st) {
  const ModelConfig& m = st.deck.model;
  if (m.n_embd % m.n_head != 0)
    inconsistent(st, {"model.n_embd", "model.n_head"},
                 fmt::format("model.n_embd ({}) must be a multiple of model.n_head ({})", m.n_embd, m.n_head));
  if (m.arch == ModelArch::gpt2) {
    for (const char* key : kLlamaOnlyKeys)
      if (st.origins.count(key))
        inconsistent(st, {key, "model.arch"},
                     fmt::format("{} applies to Llama models only, but model.arch is gpt2: remove {} or set "
                                 "model.arch: llama (or qwen2)", key, key));
    return;
  }
  if (m.n_head % m.n_kv_head != 0)
    inconsistent(st, {"model.n_kv_head", "model.n_head"},
                 fmt::format("model.n_kv_head ({}) must divide model.n_head ({}): each key/value head serves "
                             "n_head / n_kv_head query heads", m.n_kv_head, m.n_head));
  if ((m.n_embd / m.n_head) % 2 != 0)
    inconsistent(st, {"model.n_embd", "model.n_head"},
                 fmt::format("the head size model.n_embd / model.n_head ({} / {} = {}) must be even: RoPE rotates "
                             "channel pairs", m.n_embd, m.n_head, m.n_embd / m.n_head));
  if (m.rope_scaling_factor < 1)
    inconsistent(st, {"model.rope_scaling_factor"},
                 fmt::format("model.rope_scaling_factor ({}) must be at least 1 (1: plain RoPE; Llama 3.1: 8, "
                             "Llama 3.2: 32)", m.rope_scaling_factor));
  if (m.rope_scaling_factor != 1 && m.rope_high_freq_factor <= m.rope_low_freq_factor)
    inconsistent(st, {"model.rope_high_freq_factor", "model.rope_low_freq_factor"},
                 fmt::format("model.rope_high_freq_factor ({}) must exceed model.rope_low_freq_factor ({}) "
                             "(Llama 3.1: 4 and 1)", m.rope_high_freq_factor, m.rope_low_freq_factor));
}

void check_consistency(const ParseState& st) {
  const Deck& d = st.deck;
  check_model(st);
  if (d.train.micro_batch > d.train.global_batch)
    inconsistent(st, {"train.micro_batch", "train.global_batch"},
                 fmt::format("train.micro_batch ({}) must be <= train.global_batch ({})", d.train.micro_batch,
                             d.train.global_batch));
  if (d.train.global_batch % d.train.micro_batch != 0)
    inconsistent(st, {"train.micro_batch", "train.global_batch"},
                 fmt::format("train.global_batch ({}) must be a multiple of train.micro_batch ({})",
                             d.train.global_batch, d.train.micro_batch));
  if (d.schedule.min_lr > d.optim.lr)
    inconsistent(st, {"schedule.min_lr", "optim.lr"},
                 fmt::format("schedule.min_lr ({}) must be <= optim.lr ({})", d.schedule.min_lr, d.optim.lr));
  if (d.schedule.warmup_steps > d.train.steps)
    inconsistent(st, {"schedule.warmup_steps", "train.steps"},
                 fmt::format("schedule.warmup_steps ({}) must be <= train.steps ({})", d.schedule.warmup_steps,
                             d.train.steps));
  if (d.train.eval_interval > 0 && d.data.val_fraction == 0.0)
    inconsistent(st, {"train.eval_interval", "data.val_fraction"},
                 fmt::format("train.eval_interval ({}) needs held-out data: set data.val_fraction > 0, or "
                             "train.eval_interval: 0",
                             d.train.eval_interval));
  if (d.mesh.dp_replicate == -1 && d.mesh.dp_shard == -1)
    inconsistent(st, {"mesh.dp_replicate", "mesh.dp_shard"},
                 "mesh.dp_replicate and mesh.dp_shard are both -1, but only one size can be inferred from the job "
                 "size (mesh.dp_shard is -1 unless set)");
  if (d.fsdp.strategy == ShardStrategy::hybrid_shard && d.mesh.dp_replicate == 0)
    inconsistent(st, {"fsdp.strategy", "mesh.dp_shard"},
                 "fsdp.strategy hybrid_shard needs a mesh.dp_replicate dimension, e.g. mesh: {dp_replicate: 2, "
                 "dp_shard: -1}");
  if (d.mesh.tp_sequence_parallel && d.mesh.tp == 1)
    inconsistent(st, {"mesh.tp_sequence_parallel", "mesh.tp"},
                 "mesh.tp_sequence_parallel splits tokens over the tensor-parallel ranks, but mesh.tp is 1: set "
                 "mesh.tp > 1, or remove mesh.tp_sequence_parallel");
  if (d.mesh.tp > 1 && d.mesh.tp_sequence_parallel &&
      (std::int64_t{d.train.micro_batch} * d.model.context_length) % d.mesh.tp != 0)
    inconsistent(st, {"mesh.tp_sequence_parallel", "mesh.tp"},
                 fmt::format("mesh.tp_sequence_parallel splits a micro-batch's train.micro_batch x "
                             "model.context_length = {} x {} = {} tokens over mesh.tp = {} ranks: make it a multiple "
                             "of {}", d.train.micro_batch, d.model.context_length,
                             std::int64_t{d.train.micro_batch} * d.model.context_length, d.mesh.tp, d.mesh.tp));
  if (d.mesh.tp > 1) {
    const bool llama = d.model.arch != ModelArch::gpt2;
    if (d.model.n_head % d.mesh.tp != 0 || (llama && d.model.n_kv_head % d.mesh.tp != 0))
      inconsistent(st, {"mesh.tp", llama ? "model.n_kv_head" : "model.n_head"},
                   llama ? fmt::format("mesh.tp ({}) must divide model.n_head ({}) and model.n_kv_head ({}): each "
                                       "tensor-parallel rank computes whole query and key/value heads", d.mesh.tp,
                                       d.model.n_head, d.model.n_kv_head)
                         : fmt::format("mesh.tp ({}) must divide model.n_head ({}): each tensor-parallel rank "
                                       "computes whole attention heads", d.mesh.tp, d.model.n_head));
    else if (llama && d.model.ffn_hidden % d.mesh.tp != 0)
      inconsistent(st, {"mesh.tp", "model.ffn_hidden"},
                   fmt::format("mesh.tp ({}) must divide the MLP width model.ffn_hidden ({}); set model.ffn_hidden "
                               "(or model.ffn_multiple_of) to a multiple of {}", d.mesh.tp, d.model.ffn_hidden,
                               d.mesh.tp));
    else if (std::int64_t{d.mesh.tp - 1} * ((d.model.vocab_size + d.mesh.tp - 1) / d.mesh.tp) >= d.model.vocab_size)
      inconsistent(st, {"mesh.tp", "model.vocab_size"},
                   fmt::format("mesh.tp ({}) splits model.vocab_size ({}) like torch.chunk, which leaves the last "
                               "tensor-parallel rank no vocabulary rows; use a smaller mesh.tp", d.mesh.tp,
                               d.model.vocab_size));
    if (d.fsdp.strategy == ShardStrategy::no_shard)
      inconsistent(st, {"mesh.tp", "fsdp.strategy"},
                   "fsdp.strategy no_shard lays its own mesh over every rank; combine mesh.tp with full_shard, "
                   "shard_grad_op or hybrid_shard");
  }
  const ActivationCheckpointing& ac = d.train.activation_checkpointing;
  if (ac.kind == ActivationCheckpointing::Kind::every && ac.every > d.model.n_layer)
    inconsistent(st, {"train.activation_checkpointing", "model.n_layer"},
                 fmt::format("train.activation_checkpointing every_{} checkpoints blocks h.{}, h.{}, ..., but the "
                             "model has only {} (model.n_layer): none would be; use every_<k> with k <= {}, or full",
                             ac.every, ac.every - 1, 2 * ac.every - 1, d.model.n_layer, d.model.n_layer));
  const auto reshard = d.fsdp.reshard_after_forward.kind;
  const bool reshards = reshard == ReshardAfterForward::Kind::yes || reshard == ReshardAfterForward::Kind::group;
  if (reshards && (d.fsdp.strategy == ShardStrategy::shard_grad_op || d.fsdp.strategy == ShardStrategy::no_shard))
    inconsistent(st, {"fsdp.strategy", "fsdp.reshard_after_forward"},
                 fmt::format("fsdp.reshard_after_forward ({}) contradicts fsdp.strategy {}, which keeps parameters "
                             "unsharded after forward; leave it auto or set false",
                             to_string(d.fsdp.reshard_after_forward), to_string(d.fsdp.strategy)));
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
  check_consistency(st);
  return st.deck;
}

int grad_accum_steps(const TrainConfig& train, int dp_size) {
  FSDPP_REQUIRE(dp_size >= 1, "grad_accum_steps: data-parallel size must be >= 1, got {}", dp_size);
  const std::int64_t per_pass = std::int64_t{train.micro_batch} * dp_size;
  FSDPP_REQUIRE(train.global_batch % per_pass == 0,
                "train.global_batch ({}) must be a multiple of train.micro_batch ({}) x {} data-parallel ranks = {}; "
                "change train.global_batch or train.micro_batch, or the number of ranks",
                train.global_batch, train.micro_batch, dp_size, per_pass);
  return static_cast<int>(train.global_batch / per_pass);
}

}  // namespace fsdpp
