#pragma once
// A Hugging Face model's config.json <-> the deck's ModelConfig. Each architecture writes its mapping once, next
// to its name map (hf_gpt2.cpp, hf_llama.cpp), in the small vocabulary below; this file holds what they share:
// the JSON, the type checks, the fields every config carries, and the refusal of every field no mapping read.
//
// A field the model's computation depends on is either mapped to a deck key, or checked against the one value
// fsdpp computes (hidden_act "silu", attention_bias false, ...), or refused: a model fsdpp would compute
// differently is never loaded as if it were another. Fields that do not change the computation (token ids,
// initializer_range, generation defaults, dropout, which fsdpp does not train with) are named as harmless.
#include "fsdpp/config/deck.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

// Reads one JSON object (config.json, or an object inside it such as rope_scaling) field by field. Every read
// marks the field as understood; finish() refuses the ones no read marked.
class HfConfigReader {
 public:
  HfConfigReader(const std::string& json_text, std::string where);  // UsageError: not a JSON object
  ~HfConfigReader();
  HfConfigReader(HfConfigReader&&) noexcept;
  HfConfigReader& operator=(HfConfigReader&&) noexcept;

  const std::string& where() const { return where_; }
  bool has(const char* field) const;  // present and not null

  // A field mapped to a deck key: into `out`, recorded in `keys`. `fallback`: HF's default when the field is
  // absent or null; without one the field is required.
  void take(const char* field, const char* deck_key, int& out, std::optional<int> fallback = std::nullopt);
  void take(const char* field, const char* deck_key, double& out, std::optional<double> fallback = std::nullopt);
  void take(const char* field, const char* deck_key, bool& out, std::optional<bool> fallback = std::nullopt);
  void take(const char* field, const char* deck_key, std::vector<int>& out);  // a list of integers; absent: empty
  // A deck key the config determines by leaving `field` out (no rope_scaling: model.rope_scaling_factor 1).
  void determined(const char* deck_key, const char* field);
  void mark_less_allowed(const char* deck_key);  // see ModelSource::Key::deck_may_be_less
  const std::vector<ModelSource::Key>& keys() const { return keys_; }

  // A field fsdpp has no key for, whose every value but `allowed` (JSON texts: "false", "\"silu\"", "null") would
  // compute another model: absent, or one of them. `computes` says what fsdpp computes, for the message.
  void require(const char* field, const std::vector<std::string>& allowed, const std::string& computes);
  std::optional<std::string> string(const char* field);  // a string field, nullopt when absent or null
  std::vector<std::string> strings(const char* field);   // a list of strings (absent or null: empty)
  // An object field (rope_scaling), read by its own reader; nullopt when absent or null.
  std::optional<HfConfigReader> object(const char* field);
  void ignore(const char* field);  // understood, and without effect on what fsdpp computes
  // Refuses every field neither read nor harmless in any config (token ids, generation defaults, labels, ...);
  // `model` names what fsdpp implements ("Llama", "llama3 RoPE scaling") in the message.
  void finish(const std::string& model) const;

  // The value of a field as JSON text ("64", "\"gelu\""), for messages; "absent" when it is not there.
  std::string text(const char* field) const;

 private:
  struct Json;
  // Every take(): marks the field read and its deck key determined; false when the field is absent (then the
  // fallback applies), a UsageError when it is absent without one.
  bool record_take(const char* field, const char* deck_key, bool present, bool has_fallback);
  std::unique_ptr<Json> json_;
  std::string where_;
  std::vector<std::string> read_;
  std::vector<ModelSource::Key> keys_;
  std::vector<ModelSource::Key>* parent_keys_ = nullptr;  // an object's reader records into its config's
};

// Builds a config.json (keys in the order they are set), written as HF's save_pretrained does (2-space indent).
class HfConfigWriter {
 public:
  HfConfigWriter();
  ~HfConfigWriter();
  void set(const char* field, int value);
  void set(const char* field, double value);
  void set(const char* field, bool value);
  void set(const char* field, const char* value);
  void set(const char* field, const std::vector<int>& values);  // a list; one value is written as a number
  void set_list(const char* field, const std::vector<int>& values);  // a list, whatever its length
  void set(const char* field, const std::vector<std::string>& values);
  void set_null(const char* field);
  void set(const char* field, const HfConfigWriter& object);
  std::string text() const;

 private:
  struct Json;
  // Every take(): marks the field read and its deck key determined; false when the field is absent (then the
  // fallback applies), a UsageError when it is absent without one.
  bool record_take(const char* field, const char* deck_key, bool present, bool has_fallback);
  std::unique_ptr<Json> json_;
};

// config.json's model_type -> the mapping of its architecture. UsageError naming the file and the field for a
// model fsdpp does not implement, a field it does not understand, or a value it does not compute.
ModelSource read_hf_model_config(const std::string& json_text, const std::string& where);

// The special token ids a folder's generation_config.json (preferred) or config.json gives (either text may be
// "": the file is absent); empty lists when neither says.
struct HfTokenIds {
  std::vector<int> bos, eos;  // HF writes an int or a list of ints
  std::optional<int> pad;
};
HfTokenIds read_hf_token_ids(const std::string& config_text, const std::string& generation_config_text,
                             const std::string& where);

// config.json and generation_config.json for `model`, its weights in `dtype` (F32 or BF16).
std::string hf_config_json(const ModelConfig& model, const std::string& dtype, const HfTokenIds& ids);
std::string hf_generation_config_json(const HfTokenIds& ids);

}  // namespace fsdpp
