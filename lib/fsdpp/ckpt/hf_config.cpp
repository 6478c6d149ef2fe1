#include "fsdpp/ckpt/hf_config.hpp"

#include "fsdpp/ckpt/hf_convert.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>

namespace fsdpp {
namespace {

using json = nlohmann::json;

// Fields of every transformers config (PretrainedConfig, v4 and v5) that do not change what the model computes:
// names and bookkeeping, labels of classification heads, the token ids (generation reads them elsewhere), the
// generation defaults that older configs carry (fsdpp generate takes its own options), and how HF runs it.
constexpr const char* kHarmless[] = {
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "output_attentions",
    "output_hidden_states", "return_dict", "output_scores", "return_dict_in_generate", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward", "is_decoder", "tokenizer_class", "prefix",
    "task_specific_params", "_attn_implementation", "_attn_implementation_autoset", "_commit_hash",
    "attn_implementation", "_from_model_config", "auto_map", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "output_router_logits"};

bool harmless(const std::string& field) {
  return std::find(std::begin(kHarmless), std::end(kHarmless), field) != std::end(kHarmless);
}

std::string type_text(const json& v) { return v.is_null() ? "null" : v.dump(); }

}  // namespace

struct HfConfigReader::Json {
  json value;
};

HfConfigReader::HfConfigReader(const std::string& json_text, std::string where)
    : json_(std::make_unique<Json>()), where_(std::move(where)) {
  try {
    json_->value = json::parse(json_text);
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{}: not valid JSON ({}); a Hugging Face config.json is one JSON object", where_,
                                 e.what()));
  }
  FSDPP_REQUIRE(json_->value.is_object(), "{}: a JSON {}, not an object; a Hugging Face config.json is one JSON object",
                where_, json_->value.type_name());
}

HfConfigReader::~HfConfigReader() = default;
HfConfigReader::HfConfigReader(HfConfigReader&&) noexcept = default;
HfConfigReader& HfConfigReader::operator=(HfConfigReader&&) noexcept = default;

bool HfConfigReader::has(const char* field) const {
  const auto it = json_->value.find(field);
  return it != json_->value.end() && !it->is_null();
}

std::string HfConfigReader::text(const char* field) const {
  const auto it = json_->value.find(field);
  return it == json_->value.end() ? "absent" : type_text(*it);
}

namespace {

// The field's value, or nullptr when absent or null.
const json* value_of(const json& object, const char* field) {
  const auto it = object.find(field);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

bool HfConfigReader::record_take(const char* field, const char* deck_key, bool present, bool has_fallback) {
  read_.emplace_back(field);
  (parent_keys_ ? *parent_keys_ : keys_).push_back({deck_key, field, false});
  FSDPP_REQUIRE(present || has_fallback, "{}: field '{}' is missing; it gives {}", where_, field, deck_key);
  return present;
}

void HfConfigReader::take(const char* field, const char* deck_key, int& out, std::optional<int> fallback) {
  const json* v = value_of(json_->value, field);
  if (!record_take(field, deck_key, v != nullptr, fallback.has_value())) {
    out = *fallback;
    return;
  }
  FSDPP_REQUIRE(v->is_number_integer() && v->get<std::int64_t>() >= std::numeric_limits<int>::min() &&
                    v->get<std::int64_t>() <= std::numeric_limits<int>::max(),
                "{}: field '{}' is {}; expected an integer (it gives {})", where_, field, type_text(*v), deck_key);
  out = v->get<int>();
}

void HfConfigReader::take(const char* field, const char* deck_key, double& out, std::optional<double> fallback) {
  const json* v = value_of(json_->value, field);
  if (!record_take(field, deck_key, v != nullptr, fallback.has_value())) {
    out = *fallback;
    return;
  }
  FSDPP_REQUIRE(v->is_number(), "{}: field '{}' is {}; expected a number (it gives {})", where_, field, type_text(*v),
                deck_key);
  out = v->get<double>();
}

void HfConfigReader::take(const char* field, const char* deck_key, bool& out, std::optional<bool> fallback) {
  const json* v = value_of(json_->value, field);
  if (!record_take(field, deck_key, v != nullptr, fallback.has_value())) {
    out = *fallback;
    return;
  }
  FSDPP_REQUIRE(v->is_boolean(), "{}: field '{}' is {}; expected true or false (it gives {})", where_, field,
                type_text(*v), deck_key);
  out = v->get<bool>();
}

void HfConfigReader::take(const char* field, const char* deck_key, std::vector<int>& out) {
  const json* v = value_of(json_->value, field);
  out.clear();
  if (!record_take(field, deck_key, v != nullptr, true)) return;
  FSDPP_REQUIRE(v->is_array(), "{}: field '{}' is {}; expected a list of integers (it gives {})", where_, field,
                type_text(*v), deck_key);
  for (const json& n : *v) {
    FSDPP_REQUIRE(n.is_number_integer() && n.get<std::int64_t>() >= 0 && n.get<std::int64_t>() <= std::numeric_limits<int>::max(),
                  "{}: field '{}' holds {}; expected layer indices >= 0 (it gives {})", where_, field, n.dump(), deck_key);
    out.push_back(n.get<int>());
  }
}

void HfConfigReader::determined(const char* deck_key, const char* field) {
  (parent_keys_ ? *parent_keys_ : keys_).push_back({deck_key, field, false});
}

void HfConfigReader::mark_less_allowed(const char* deck_key) {
  for (auto& k : parent_keys_ ? *parent_keys_ : keys_)
    if (k.deck_key == deck_key) k.deck_may_be_less = true;
}

void HfConfigReader::require(const char* field, const std::vector<std::string>& allowed, const std::string& computes) {
  read_.emplace_back(field);
  const auto it = json_->value.find(field);
  if (it == json_->value.end()) return;
  for (const std::string& a : allowed)
    if (*it == json::parse(a)) return;
  throw UsageError(fmt::format("{}: field '{}' is {}, which fsdpp does not implement: it computes {} ({} {}); "
                               "fsdpp refuses to load a model it would compute differently", where_, field,
                               type_text(*it), computes, field, fmt::join(allowed, " or ")));
}

std::optional<std::string> HfConfigReader::string(const char* field) {
  read_.emplace_back(field);
  const json* v = value_of(json_->value, field);
  if (!v) return std::nullopt;
  FSDPP_REQUIRE(v->is_string(), "{}: field '{}' is {}; expected a string", where_, field, type_text(*v));
  return v->get<std::string>();
}

std::vector<std::string> HfConfigReader::strings(const char* field) {
  read_.emplace_back(field);
  std::vector<std::string> out;
  const json* v = value_of(json_->value, field);
  if (!v) return out;
  FSDPP_REQUIRE(v->is_array(), "{}: field '{}' is {}; expected a list of strings", where_, field, type_text(*v));
  for (const json& s : *v) {
    FSDPP_REQUIRE(s.is_string(), "{}: field '{}' holds {}; expected a list of strings", where_, field, type_text(s));
    out.push_back(s.get<std::string>());
  }
  return out;
}

std::optional<HfConfigReader> HfConfigReader::object(const char* field) {
  read_.emplace_back(field);
  const json* v = value_of(json_->value, field);
  if (!v) return std::nullopt;
  FSDPP_REQUIRE(v->is_object(), "{}: field '{}' is {}; expected an object", where_, field, type_text(*v));
  HfConfigReader inner(v->dump(), fmt::format("{} field '{}'", where_, field));
  inner.parent_keys_ = parent_keys_ ? parent_keys_ : &keys_;
  return inner;
}

void HfConfigReader::ignore(const char* field) { read_.emplace_back(field); }

void HfConfigReader::finish(const std::string& model) const {
  std::vector<std::string> unknown;
  for (const auto& [field, value] : json_->value.items())
    if (std::find(read_.begin(), read_.end(), field) == read_.end() && (parent_keys_ || !harmless(field)))
      unknown.push_back(fmt::format("'{}' ({})", field, type_text(value)));
  FSDPP_REQUIRE(unknown.empty(), "{}: {} {} {} not implemented by fsdpp's {}; fsdpp cannot tell how {} the "
                "computation, and refuses to load a model it may compute differently", where_,
                unknown.size() == 1 ? "field" : "fields", fmt::join(unknown, ", "), unknown.size() == 1 ? "is" : "are",
                model, unknown.size() == 1 ? "it changes" : "they change");
}

struct HfConfigWriter::Json {
  nlohmann::ordered_json value = nlohmann::ordered_json::object();
};

HfConfigWriter::HfConfigWriter() : json_(std::make_unique<Json>()) {}
HfConfigWriter::~HfConfigWriter() = default;
void HfConfigWriter::set(const char* field, int value) { json_->value[field] = value; }
void HfConfigWriter::set(const char* field, double value) { json_->value[field] = value; }
void HfConfigWriter::set(const char* field, bool value) { json_->value[field] = value; }
void HfConfigWriter::set(const char* field, const char* value) { json_->value[field] = value; }
void HfConfigWriter::set(const char* field, const std::vector<int>& values) {
  if (values.size() == 1) json_->value[field] = values.front();
  else json_->value[field] = values;
}
void HfConfigWriter::set_list(const char* field, const std::vector<int>& values) {
  json_->value[field] = json::array();
  for (const int v : values) json_->value[field].push_back(v);
}
void HfConfigWriter::set(const char* field, const std::vector<std::string>& values) { json_->value[field] = values; }
void HfConfigWriter::set_null(const char* field) { json_->value[field] = nullptr; }
void HfConfigWriter::set(const char* field, const HfConfigWriter& object) { json_->value[field] = object.json_->value; }
std::string HfConfigWriter::text() const { return json_->value.dump(2) + "\n"; }

ModelSource read_hf_model_config(const std::string& json_text, const std::string& where) {
  HfConfigReader config(json_text, where);
  const std::optional<std::string> type = config.string("model_type");
  FSDPP_REQUIRE(type.has_value(), "{}: field 'model_type' is missing; fsdpp reads the configs of gpt2, llama and "
                "qwen2 models", where);
  const HfNaming* naming = hf_naming_of_model_type(*type);
  FSDPP_REQUIRE(naming != nullptr, "{}: model_type '{}' is not a model fsdpp implements (gpt2, llama, qwen2)", where,
                *type);
  // Structure every causal LM of these shares: one decoder stack, no cross-attention, nothing pruned or quantized.
  config.require("is_encoder_decoder", {"false"}, "a decoder-only model");
  config.require("add_cross_attention", {"false"}, "a decoder-only model");
  config.require("tie_encoder_decoder", {"false"}, "a decoder-only model");
  config.require("cross_attention_hidden_size", {"null"}, "a decoder-only model");
  config.require("pruned_heads", {"{}"}, "every attention head of every layer");
  ModelSource out;
  out.where = where;
  config.determined("model.arch", "model_type");
  naming->read_config(config, out.model);
  config.finish(naming->model);
  out.keys = config.keys();
  return out;
}

namespace {

// An int or a list of ints (HF's eos_token_id), nullopt when absent or null.
std::optional<std::vector<int>> token_ids(const json& object, const char* field, const std::string& where) {
  const json* v = value_of(object, field);
  if (!v) return std::nullopt;
  std::vector<int> ids;
  if (v->is_number_integer()) ids.push_back(v->get<int>());
  else if (v->is_array())
    for (const json& id : *v) {
      FSDPP_REQUIRE(id.is_number_integer(), "{}: field '{}' holds {}; expected token ids (integers)", where, field,
                    type_text(id));
      ids.push_back(id.get<int>());
    }
  else
    throw UsageError(fmt::format("{}: field '{}' is {}; expected a token id or a list of them", where, field,
                                 type_text(*v)));
  return ids;
}

json parse_object(const std::string& text, const std::string& where) {
  json v;
  try {
    v = json::parse(text);
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{}: not valid JSON ({})", where, e.what()));
  }
  FSDPP_REQUIRE(v.is_object(), "{}: a JSON {}, not an object", where, v.type_name());
  return v;
}

}  // namespace

HfTokenIds read_hf_token_ids(const std::string& config_text, const std::string& generation_config_text,
                             const std::string& where) {
  const json config = config_text.empty() ? json::object() : parse_object(config_text, where + "/config.json");
  const json generation = generation_config_text.empty()
                              ? json::object()
                              : parse_object(generation_config_text, where + "/generation_config.json");
  HfTokenIds ids;
  // generate() reads generation_config.json, which save_pretrained derives from config.json: it wins.
  for (const char* field : {"bos_token_id", "eos_token_id"}) {
    std::optional<std::vector<int>> found = token_ids(generation, field, where + "/generation_config.json");
    if (!found) found = token_ids(config, field, where + "/config.json");
    (field[0] == 'b' ? ids.bos : ids.eos) = found.value_or(std::vector<int>{});
  }
  if (auto pad = token_ids(generation, "pad_token_id", where + "/generation_config.json"); pad && pad->size() == 1)
    ids.pad = pad->front();
  else if (pad = token_ids(config, "pad_token_id", where + "/config.json"); pad && pad->size() == 1)
    ids.pad = pad->front();
  return ids;
}

namespace {

void set_ids(HfConfigWriter& out, const HfTokenIds& ids) {
  if (ids.bos.empty()) out.set_null("bos_token_id");
  else out.set("bos_token_id", ids.bos);
  if (ids.eos.empty()) out.set_null("eos_token_id");
  else out.set("eos_token_id", ids.eos);
  if (ids.pad) out.set("pad_token_id", *ids.pad);
}

}  // namespace

std::string hf_config_json(const ModelConfig& model, const std::string& dtype, const HfTokenIds& ids) {
  const HfNaming& naming = hf_naming_of(model.arch);
  HfConfigWriter out;
  out.set("architectures", std::vector<std::string>{naming.architecture});
  naming.write_config(model, out);
  set_ids(out, ids);
  out.set("torch_dtype", dtype == "BF16" ? "bfloat16" : "float32");
  return out.text();
}

std::string hf_generation_config_json(const HfTokenIds& ids) {
  HfConfigWriter out;
  if (!ids.bos.empty()) out.set("bos_token_id", ids.bos);
  if (!ids.eos.empty()) out.set("eos_token_id", ids.eos);
  if (ids.pad) out.set("pad_token_id", *ids.pad);
  return out.text();
}

}  // namespace fsdpp
