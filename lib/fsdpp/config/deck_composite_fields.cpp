// The deck keys whose values have a shape of their own: true|false|N, step ranges, prefetch lists, booleans that
// also take a file, mesh sizes, lists of maps. Their kinds and helpers: deck_field_kinds.hpp.
#include "fsdpp/config/deck_field_kinds.hpp"

#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

namespace fsdpp::deck_detail {

Field reshard_after_forward() {
  Field f = base("fsdp.reshard_after_forward",
                 "Free unsharded parameters after forward and all-gather them again in backward. auto (or null, "
                 "FSDP2's None): true for every group but the root; an integer k keeps a 1/k slice after forward and "
                 "all-gathers over groups of k ranks in backward (k must divide the shard size).");
  f.type = "auto|true|false|integer >= 2";
  f.set = [](Deck& d, const YAML::Node& v, const std::string& where) {
    ReshardAfterForward r;
    if (!is_null_value(v)) {
      const std::string s = scalar_or_fail(v, where, "auto, true, false or an integer >= 2");
      const IntText n = parse_integer(s);
      bool b = false;
      if (s == "auto") {
        r.kind = ReshardAfterForward::Kind::automatic;
      } else if (parse_bool(s, b)) {
        r.kind = b ? ReshardAfterForward::Kind::yes : ReshardAfterForward::Kind::no;
      } else if (n.is_integer && !n.overflow && n.value >= 2 && n.value <= std::numeric_limits<int>::max()) {
        r.kind = ReshardAfterForward::Kind::group;
        r.group_size = static_cast<int>(n.value);
      } else {
        fail(where, fmt::format("expected auto, true, false or an integer >= 2, got '{}'", s));
      }
    }
    d.fsdp.reshard_after_forward = r;
  };
  f.get = [](const Deck& d) { return to_string(d.fsdp.reshard_after_forward); };
  return f;
}

Field trace_steps() {
  Field f = base("run.trace",
                 "Record a per-rank timeline of these optimizer steps (compute spans, each collective per "
                 "communicator, waits) to <run.output>/trace/rank<r>.json (Chrome trace format); `fsdpp report "
                 "<run> --trace` merges and summarizes it (docs/trace.md). none; a step; or <first>-<last>.");
  f.type = "none|<step>|<first>-<last>";
  f.set = [](Deck& d, const YAML::Node& v, const std::string& where) {
    const std::string s = scalar_or_fail(v, where, "none, a step or <first>-<last>");
    const std::string expected = fmt::format("expected none, a step (3) or a range of steps (2-4), got '{}'", s);
    if (s == "none") {
      d.run.trace_first = d.run.trace_last = 0;
      return;
    }
    const auto dash = s.find('-', 1);  // a leading '-' is a negative number, refused below
    const IntText first = parse_integer(s.substr(0, dash));
    const IntText last = dash == std::string::npos ? first : parse_integer(s.substr(dash + 1));
    if (!first.is_integer || !last.is_integer || first.overflow || last.overflow) fail(where, expected);
    if (first.value < 1) fail(where, fmt::format("expected steps >= 1 (the first step is 1), got '{}'", s));
    d.run.trace_first = first.value;
    d.run.trace_last = last.value;
  };
  f.get = [](const Deck& d) {
    if (d.run.trace_first == 0) return std::string("none");
    if (d.run.trace_first == d.run.trace_last) return fmt::format("{}", d.run.trace_first);
    return fmt::format("{}-{}", d.run.trace_first, d.run.trace_last);
  };
  return f;
}

// A unit name in a prefetch list: what the banner and the plan print (h.0, h.1, ..., root); checked against the
// model's units when it is sharded (parallelize.cpp).
static std::string prefetch_unit(const std::string& text, const std::string& where, const std::string& whole) {
  std::string s = text;
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  if (s.empty() || s.find_first_of(":;, \t") != std::string::npos)
    fail(where, fmt::format("expected a unit name (h.<i> or root) in '{}', got '{}'", whole, s));
  return s;
}

// The scalar form: 0, 1, 2, or "h.3:h.4,h.5;h.4:h.6" (what --set and the echo use).
static PrefetchSetting parse_prefetch_text(const std::string& s, const std::string& where) {
  PrefetchSetting p;
  const IntText n = parse_integer(s);
  if (n.is_integer) {
    if (n.overflow || n.value < 0 || n.value > 2)
      fail(where, fmt::format("expected 0, 1 or 2 units ahead, or per-unit lists (h.3:h.4,h.5;h.4:h.6), got '{}'", s));
    p.depth = static_cast<int>(n.value);
    return p;
  }
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t end = std::min(s.find(';', start), s.size());
    const std::string entry = s.substr(start, end - start);
    const auto colon = entry.find(':');
    if (colon == std::string::npos)
      fail(where, fmt::format("expected 0, 1, 2 or <unit>:<unit>[,<unit>];... (h.3:h.4,h.5;h.4:h.6), got '{}'", s));
    std::vector<std::string> targets;
    for (std::size_t t = colon + 1; t <= entry.size();) {
      const std::size_t comma = std::min(entry.find(',', t), entry.size());
      targets.push_back(prefetch_unit(entry.substr(t, comma - t), where, s));
      t = comma + 1;
    }
    p.lists.emplace_back(prefetch_unit(entry.substr(0, colon), where, s), std::move(targets));
    start = end + 1;
  }
  return p;
}

// The YAML map form, in files: {h.3: [h.4, h.5], h.4: h.6}.
static PrefetchSetting parse_prefetch_map(const YAML::Node& v, const std::string& where) {
  PrefetchSetting p;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const YAML::Node key = it->first, value = it->second;
    const std::string unit = prefetch_unit(scalar_or_fail(key, where, "a unit name"), where, "the map");
    std::vector<std::string> targets;
    if (value.IsSequence()) {
      for (std::size_t i = 0; i < value.size(); ++i)
        targets.push_back(prefetch_unit(scalar_or_fail(value[i], where, "a unit name"), where, unit + "'s list"));
    } else {
      const std::string list = scalar_or_fail(value, where, "a unit name or a list of them");
      for (std::size_t t = 0; t <= list.size();) {
        const std::size_t comma = std::min(list.find(',', t), list.size());
        targets.push_back(prefetch_unit(list.substr(t, comma - t), where, list));
        t = comma + 1;
      }
    }
    p.lists.emplace_back(unit, std::move(targets));
  }
  return p;
}

Field prefetch(std::string_view path, PrefetchSetting FsdpConfig::*member, std::string doc) {
  Field f = base(path, std::move(doc));
  f.type = "0|1|2|<unit>:<unit>[,<unit>];...";
  f.set = [member](Deck& d, const YAML::Node& v, const std::string& where) {
    PrefetchSetting p = v.IsMap() ? parse_prefetch_map(v, where)
                                  : parse_prefetch_text(scalar_or_fail(v, where, "0, 1, 2 or per-unit lists"), where);
    for (std::size_t i = 0; i < p.lists.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (p.lists[i].first == p.lists[j].first) {
          PrefetchSetting merged;
          merged.lists = {p.lists[j]};
          for (const std::string& t : p.lists[i].second) merged.lists[0].second.push_back(t);
          fail(where, fmt::format("unit {} has two prefetch lists; give it one: {}", p.lists[i].first,
                                  to_string(merged)));
        }
    d.fsdp.*member = std::move(p);
  };
  f.get = [member](const Deck& d) {
    const PrefetchSetting& p = d.fsdp.*member;
    return p.lists.empty() ? std::to_string(p.depth) : yaml_scalar(to_string(p));  // a depth is a plain integer
  };
  return f;
}

Field activation_checkpointing() {
  Field f = base("train.activation_checkpointing",
                 "Blocks that keep only their output in forward and recompute the rest in backward (less activation "
                 "memory, about one more forward of time): none; full, every block; every_<k>, every k-th block "
                 "(h.<k-1>, h.<2k-1>, ...; 2 <= k <= model.n_layer). Losses are bitwise those without it.");
  f.type = "none|full|every_<k>";
  f.set = [](Deck& d, const YAML::Node& v, const std::string& where) {
    const std::string s = scalar_or_fail(v, where, "none, full or every_<k>");
    const std::string expected = fmt::format("expected none, full or every_<k> with an integer k >= 2 (every_2 "
                                             "checkpoints every second block), got '{}'", s);
    ActivationCheckpointing ac;
    if (s == "full") {
      ac.kind = ActivationCheckpointing::Kind::full;
    } else if (s.rfind("every_", 0) == 0) {
      const IntText n = parse_integer(s.substr(6));
      if (!n.is_integer || n.overflow || n.value < 1 || n.value > std::numeric_limits<int>::max()) fail(where, expected);
      // every_1 is every block: full, named once.
      ac.kind = n.value == 1 ? ActivationCheckpointing::Kind::full : ActivationCheckpointing::Kind::every;
      ac.every = n.value == 1 ? 0 : static_cast<int>(n.value);
    } else if (s != "none") {
      fail(where, expected);
    }
    d.train.activation_checkpointing = ac;
  };
  f.get = [](const Deck& d) { return to_string(d.train.activation_checkpointing); };
  return f;
}

// A boolean that also takes "auto", "none" or a checkpoint file, so it reads yes/no/on/off like every other
// boolean and a requeued job can name exactly what to continue from.
Field resume() {
  Field f = base("checkpoint.resume",
                 "true: resume from the latest checkpoint in checkpoint.dir (an error if there is none); auto: "
                 "resume if there is one; false or none: start fresh; a path (.h5): resume from that checkpoint.");
  f.type = "true|false|auto|none|<path>";
  f.set = [](Deck& d, const YAML::Node& v, const std::string& where) {
    const std::string s = scalar_or_fail(v, where, "true, false, auto, none or a checkpoint path");
    bool b = false;
    d.checkpoint.resume_path.clear();
    if (s == "auto") d.checkpoint.resume = ResumeMode::automatic;
    else if (s == "none") d.checkpoint.resume = ResumeMode::off;
    else if (parse_bool(s, b)) d.checkpoint.resume = b ? ResumeMode::on : ResumeMode::off;
    else if (s.find('/') != std::string::npos || (s.size() > 3 && s.compare(s.size() - 3, 3, ".h5") == 0)) {
      d.checkpoint.resume = ResumeMode::path;
      d.checkpoint.resume_path = s;
    } else {
      fail(where, fmt::format("expected true, false, auto, none or a checkpoint path (.h5), got '{}'", s));
    }
  };
  f.get = [](const Deck& d) {
    return d.checkpoint.resume == ResumeMode::path ? d.checkpoint.resume_path : std::string(to_string(d.checkpoint.resume));
  };
  return f;
}

// "none", or the weights to start from; distinct from resume, which continues a run.
Field init_from() {
  Field f = base("checkpoint.init_from",
                 "none, or the path of weights to start from (fine-tuning): an fsdpp checkpoint, a consolidated "
                 "file or a .safetensors file. Training starts at step 0 with a fresh optimizer; resume continues a "
                 "run instead.");
  f.type = "none|<path>";
  f.set = [](Deck& d, const YAML::Node& v, const std::string& where) {
    const std::string s = scalar_or_fail(v, where, "none or a path");
    if (s.empty()) fail(where, "expected none or a path, got ''");
    d.checkpoint.init_from = s;
  };
  f.get = [](const Deck& d) { return yaml_scalar(d.checkpoint.init_from); };
  return f;
}

// A mesh dimension's size: -1 to infer it from the job size, or a fixed size.
Field mesh_dim(std::string_view path, int MeshConfig::*member, std::string doc) {
  Field f = base(path, std::move(doc));
  f.type = "-1 or integer >= 1";
  f.set = [=](Deck& d, const YAML::Node& v, const std::string& where) {
    const std::string s = scalar_or_fail(v, where, "an integer");
    const IntText n = parse_integer(s);
    if (!n.is_integer) fail(where, fmt::format("expected an integer, got '{}'", s));
    if (n.overflow || n.value == 0 || n.value < -1 || n.value > std::numeric_limits<int>::max())
      fail(where, fmt::format("expected -1 (infer from the job size) or an integer >= 1, got {}", s));
    d.mesh.*member = static_cast<int>(n.value);
  };
  f.get = [=](const Deck& d) { return d.mesh.*member == 0 ? std::string() : std::to_string(d.mesh.*member); };
  return f;
}

// A key only the Llama family (llama, qwen2) reads: refused in a gpt2 deck (deck_parse.cpp), left out of its
// echo (so the echo parses back), its default documented. The one list of which architectures read which keys.
Field llama_only(Field f, std::string default_doc) {
  for (const auto& arch : kArchs)
    if (is_llama_family(arch.value)) f.archs.push_back(arch.value);
  f.family = "Llama";
  const auto get = f.get;
  f.get = [get](const Deck& d) { return is_llama_family(d.model.arch) ? get(d) : std::string(); };
  f.default_doc = std::move(default_doc);
  return f;
}

// ---- data.sources: a list of {path, weight} ----

// "deck.yaml:7:5: data.sources" (where the list starts) -> the same for a node inside it, so that an error points
// at the entry's own line; an override has no lines and keeps its text.
static std::string where_inside(const std::string& where, const YAML::Node& list, const YAML::Node& inner,
                         const std::string& what) {
  const YAML::Mark m = list.Mark(), e = inner.Mark();
  const std::string tail = fmt::format(":{}:{}: data.sources", m.line + 1, m.column + 1);
  const bool from_file = !m.is_null() && !e.is_null() && where.size() > tail.size() &&
                         where.compare(where.size() - tail.size(), tail.size(), tail) == 0;
  if (!from_file) return fmt::format("{}: {}", where, what);
  return fmt::format("{}:{}:{}: data.sources {}", where.substr(0, where.size() - tail.size()), e.line + 1,
                     e.column + 1, what);
}

static DataSource read_data_source(const YAML::Node& list, std::size_t index, const std::string& where) {
  const YAML::Node entry = list[index];
  const std::string entry_name = fmt::format("entry {}", index + 1);
  const std::string at_entry = where_inside(where, list, entry, entry_name);
  if (!entry.IsMap())
    fail(at_entry, fmt::format("expected a map {{path: ..., weight: ...}}, got {}", describe_node(entry)));
  DataSource source;
  bool has_path = false, has_weight = false;
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    const std::string key = scalar_or_fail(it->first, at_entry, "a key name");
    const std::string at_value = where_inside(where, list, it->second.IsNull() ? it->first : it->second,
                                              entry_name + " " + key);
    if (key == "path") {
      source.path = scalar_or_fail(it->second, at_value, "the path of a token file or corpus folder");
      if (source.path.empty()) fail(at_value, "expected a non-empty path, got ''");
      source.where = at_value;
      has_path = true;
    } else if (key == "weight") {
      const std::string text = scalar_or_fail(it->second, at_value, "a number > 0");
      if (!parse_real(text, source.weight) || !kPositive.contains(source.weight))
        fail(at_value, fmt::format("expected a number > 0 (the weights are normalised), got '{}'", text));
      has_weight = true;
    } else {
      const std::string near = closest(key, {"path", "weight"});
      fail(where_inside(where, list, it->first, entry_name),
           fmt::format("unknown key '{}'{}: an entry has a path and a weight", key,
                       near.empty() ? "" : " (did you mean '" + near + "'?)"));
    }
  }
  if (!has_path || !has_weight)
    fail(at_entry, fmt::format("missing {}: an entry has a path and a weight, e.g. {{path: corpus/, weight: 0.5}}",
                               has_path ? "weight" : "path"));
  return source;
}

Field data_sources() {
  Field f = base("data.sources",
                 "A weighted mixture instead of data.source: a list of {path, weight}, each path a token file, a "
                 "corpus folder or its index.json, each weight > 0 (normalised). Each sequence takes one source, in "
                 "the proportions of the weights (a low-discrepancy rule: every prefix of the run is within a few "
                 "sequences of them); each source keeps data.val_fraction of itself for validation "
                 "(docs/models-and-data.md, Mixtures).");
  f.type = "list of {path, weight}";
  f.default_doc = "none (data.source)";
  f.set = [](Deck& d, const YAML::Node& v, const std::string& where) {
    if (!v.IsSequence() || v.size() == 0)
      fail(where, fmt::format("expected a list of {{path, weight}} entries, e.g. [{{path: web/, weight: 0.7}}, "
                              "{{path: code.bin, weight: 0.3}}], got {}", describe_node(v)));
    std::vector<DataSource> sources;
    for (std::size_t i = 0; i < v.size(); ++i) {
      sources.push_back(read_data_source(v, i, where));
      for (std::size_t j = 0; j < i; ++j)
        if (sources[j].path == sources[i].path)
          fail(where_inside(where, v, v[i], fmt::format("entry {}", i + 1)),
               fmt::format("{} is already entry {}: give each source one entry (with the weights summed)",
                           sources[i].path, j + 1));
    }
    d.data.sources = std::move(sources);
  };
  f.get = [](const Deck& d) {
    std::string out;
    for (const DataSource& s : d.data.sources)
      out += fmt::format("{}{{path: {}, weight: {}}}", out.empty() ? "[" : ", ", yaml_scalar(s.path),
                         format_real(s.weight));
    return out.empty() ? out : out + "]";
  };
  return f;
}

}  // namespace fsdpp::deck_detail

namespace fsdpp::deck_detail {

namespace {
// A list of non-negative integers: a YAML sequence, or an override's (or a model folder's) text "[0, 3]".
std::vector<int> read_index_list(const YAML::Node& given, const std::string& where, const std::string& expected) {
  std::vector<int> out;
  YAML::Node v = given;
  if (v.IsScalar()) {
    try {
      v = YAML::Load(v.Scalar());
    } catch (const YAML::Exception&) {
      fail(where, fmt::format("expected {}, got '{}'", expected, given.Scalar()));
    }
  }
  if (is_null_value(v)) return out;
  if (!v.IsSequence()) fail(where, fmt::format("expected {}, got {}", expected, describe_node(given)));
  for (std::size_t i = 0; i < v.size(); ++i)
    out.push_back(static_cast<int>(read_int(v[i], where, 0, std::numeric_limits<int>::max(), ">= 0")));
  return out;
}
}  // namespace

Field pipeline_split() {
  Field f = base("pipeline.split",
                 "The first block of each stage after the first, ascending: [4, 8] cuts 12 blocks into 0-3, 4-7 and "
                 "8-11 (pp x pipeline.virtual_stages - 1 entries). Empty: stages balanced by each block's FLOPs, "
                 "the embedding counted on the first and the head and loss on the last.");
  f.type = "list of block indices";
  f.set = [](Deck& d, const YAML::Node& v, const std::string& where) {
    d.pipeline.split = read_index_list(v, where, "a list of block indices such as [4, 8]");
  };
  f.get = [](const Deck& d) { return fmt::format("[{}]", fmt::join(d.pipeline.split, ", ")); };
  f.default_doc = "[]";
  return f;
}

// ---- model.moe.*: the keys of ModelConfig::moe, read by the mixture-of-experts architectures only ----

namespace {

// A key only qwen3_moe and mixtral read: refused elsewhere (deck_parse.cpp), left out of other decks' echo.
Field moe_only(Field f) {
  for (const auto& arch : kArchs)
    if (is_moe_arch(arch.value)) f.archs.push_back(arch.value);
  f.family = "mixture-of-experts";
  const auto get = f.get;
  f.get = [get](const Deck& d) { return is_moe_arch(d.model.arch) ? get(d) : std::string(); };
  return f;
}

template <class T, class Read, class Show>
Field moe_key(const std::string& name, T MoeConfig::*member, std::string type, std::string doc, Read read, Show show) {
  Field f = base("model.moe." + name, std::move(doc));
  f.type = std::move(type);
  f.set = [=](Deck& d, const YAML::Node& v, const std::string& where) { d.model.moe.*member = read(v, where); };
  f.get = [=](const Deck& d) { return show(d.model.moe.*member); };
  f.default_doc = show(MoeConfig{}.*member);  // the help's: a gpt2 deck (the defaults') echoes no model.moe key
  return moe_only(f);
}

Field moe_integer(const std::string& name, int MoeConfig::*member, int lo, std::string doc) {
  const std::string range = int_range_text(lo, kNoMax);
  return moe_key(
      name, member, "integer " + range, std::move(doc),
      [=](const YAML::Node& v, const std::string& where) {
        return static_cast<int>(read_int(v, where, lo, std::numeric_limits<int>::max(), range));
      },
      [](int v) { return std::to_string(v); });
}

Field moe_real(const std::string& name, double MoeConfig::*member, RealRange range, std::string doc) {
  return moe_key(
      name, member, "number " + range.text(), std::move(doc),
      [=](const YAML::Node& v, const std::string& where) {
        const std::string text = scalar_or_fail(v, where, "a number");
        double x = 0;
        if (!parse_real(text, x)) fail(where, fmt::format("expected a number, got '{}'", text));
        if (!range.contains(x)) fail(where, fmt::format("expected a number {}, got {}", range.text(), text));
        return x;
      },
      [](double v) { return format_real(v); });
}

}  // namespace

std::vector<Field> moe_fields() {
  std::vector<Field> f;
  f.push_back(moe_integer("num_experts", &MoeConfig::num_experts, 1,
                          "Experts E in each sparse layer (HF num_experts / num_local_experts)."));
  f.push_back(moe_integer("top_k", &MoeConfig::top_k, 1,
                          "Experts each token is sent to, at most num_experts (HF num_experts_per_tok)."));
  f.push_back(moe_integer("expert_ffn_hidden", &MoeConfig::expert_ffn_hidden, 1,
                          "Each expert's SwiGLU width (HF moe_intermediate_size; Mixtral's intermediate_size). "
                          "Required."));
  f.back().default_doc = "required";  // (after moe_key's)
  f.push_back(moe_key(
      "norm_topk_prob", &MoeConfig::norm_topk_prob, "true|false",
      "Divide the top-k routing probabilities by their sum (Qwen3-MoE's norm_topk_prob; Mixtral always does).",
      [](const YAML::Node& v, const std::string& where) {
        const std::string text = scalar_or_fail(v, where, "true or false");
        bool b = false;
        if (!parse_bool(text, b)) fail(where, fmt::format("expected true or false, got '{}'", text));
        return b;
      },
      [](bool b) { return std::string(b ? "true" : "false"); }));
  f.push_back(moe_key(
      "balance", &MoeConfig::balance, enum_choices(kMoeBalances),
      "How the router's load is kept even: aux_loss (transformers' load-balancing loss, weighted by aux_loss_coef), "
      "bias (DeepSeek-V3's aux-loss-free balancing: a per-expert bias on the routing scores, for the choice only, "
      "moved by bias_update_rate after each step toward the mean load) or none.",
      [](const YAML::Node& v, const std::string& where) { return read_enum(v, where, kMoeBalances); },
      [](MoeBalance b) { return std::string(name_of(kMoeBalances, b)); }));
  f.push_back(moe_real("aux_loss_coef", &MoeConfig::aux_loss_coef, kNonNegative,
                       "The load-balancing loss's weight in the training loss (HF router_aux_loss_coef)."));
  f.push_back(moe_real("bias_update_rate", &MoeConfig::bias_update_rate, kNonNegative,
                       "balance: bias: after each step every expert's routing bias moves by this much toward the mean "
                       "load (up when the expert got fewer tokens than the mean over the step's every rank, down when "
                       "more; DeepSeek-V3's gamma)."));
  f.push_back(moe_real("router_z_loss_coef", &MoeConfig::router_z_loss_coef, kNonNegative,
                       "ST-MoE's router z-loss weight: mean over routed rows of logsumexp(router logits)^2."));
  f.push_back(moe_integer("sparse_step", &MoeConfig::sparse_step, 1,
                          "Layer l (from 0) is sparse when (l + 1) is a multiple of it (HF decoder_sparse_step)."));
  f.push_back(moe_key(
      "dense_layers", &MoeConfig::dense_layers, "list of layer indices",
      "Layers (from 0) kept dense whatever sparse_step says (HF mlp_only_layers); their MLP is model.ffn_hidden wide.",
      [](const YAML::Node& given, const std::string& where) {
        return read_index_list(given, where, "a list of layer indices such as [0, 3]");
      },
      [](const std::vector<int>& layers) { return fmt::format("[{}]", fmt::join(layers, ", ")); }));
  f.push_back(moe_real("capacity_factor", &MoeConfig::capacity_factor, kNonNegative,
                       "0: dropless. c > 0: each expert takes at most ceil(c x rows x top_k / num_experts) rows of a "
                       "micro-batch, the first by token order; the rest are dropped (counted in the log)."));
  return f;
}

}  // namespace fsdpp::deck_detail
