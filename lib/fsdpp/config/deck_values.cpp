// Scalar conversions for the deck. They are our own rather than yaml-cpp's as<T>(), whose only message is "bad
// conversion" and which accepts what a deck should not (as<int>("1.5") rounding, "0x10", trailing garbage).
#include "fsdpp/config/deck_schema.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

namespace fsdpp {
namespace deck_detail {

const EnumNames<ModelArch> kArchs = {{"gpt2", ModelArch::gpt2},   {"llama", ModelArch::llama},
                                    {"qwen2", ModelArch::qwen2}, {"qwen3", ModelArch::qwen3},
                                    {"qwen3_moe", ModelArch::qwen3_moe}, {"mixtral", ModelArch::mixtral}};
const EnumNames<MoeBalance> kMoeBalances = {
    {"aux_loss", MoeBalance::aux_loss}, {"bias", MoeBalance::bias}, {"none", MoeBalance::none}};
const EnumNames<AttentionKind> kAttentions = {
    {"auto", AttentionKind::automatic}, {"fused", AttentionKind::fused}, {"batched", AttentionKind::batched},
    {"reference", AttentionKind::reference}};
const EnumNames<OptimizerKind> kOptimizers = {{"adamw", OptimizerKind::adamw}, {"sgd", OptimizerKind::sgd}};
const EnumNames<ScheduleKind> kSchedules = {{"constant", ScheduleKind::constant}, {"cosine", ScheduleKind::cosine}};
const EnumNames<DataFormat> kFormats = {{"auto", DataFormat::automatic}, {"gpt2", DataFormat::gpt2},
                                        {"uint16", DataFormat::uint16}, {"uint32", DataFormat::uint32}};
const EnumNames<DataOrder> kOrders = {{"shuffled", DataOrder::shuffled}, {"sequential", DataOrder::sequential}};
const EnumNames<ShardStrategy> kStrategies = {{"full_shard", ShardStrategy::full_shard},
                                              {"hybrid_shard", ShardStrategy::hybrid_shard},
                                              {"shard_grad_op", ShardStrategy::shard_grad_op},
                                              {"no_shard", ShardStrategy::no_shard}};
const EnumNames<OffloadPolicy> kOffloads = {{"none", OffloadPolicy::none}, {"cpu", OffloadPolicy::cpu}};
const EnumNames<GradAccumulation> kAccumulations = {{"unsharded", GradAccumulation::unsharded},
                                                    {"sharded", GradAccumulation::sharded}};
const EnumNames<ReplicaAllReduce> kReplicaAllReduces = {{"every_micro_batch", ReplicaAllReduce::every_micro_batch},
                                                        {"last_micro_batch", ReplicaAllReduce::last_micro_batch}};
const EnumNames<ResumeMode> kResumes = {{"false", ResumeMode::off}, {"true", ResumeMode::on},
                                        {"auto", ResumeMode::automatic}, {"path", ResumeMode::path}};
const EnumNames<CommBackendChoice> kBackends = {{"auto", CommBackendChoice::automatic},
                                                {"mpi", CommBackendChoice::mpi}, {"nccl", CommBackendChoice::nccl}};
const EnumNames<CheckpointOnError> kOnErrors = {{"abort", CheckpointOnError::abort},
                                              {"continue", CheckpointOnError::keep_going}};
const EnumNames<NonFinitePolicy> kNonFinite = {{"abort", NonFinitePolicy::abort}, {"skip", NonFinitePolicy::skip}};
const EnumNames<MatmulPrecisionChoice> kMatmulPrecisions = {{"auto", MatmulPrecisionChoice::automatic},
                                                          {"f32", MatmulPrecisionChoice::f32},
                                                          {"bf16", MatmulPrecisionChoice::bf16}};
const EnumNames<PipelineScheduleKind> kPipelineSchedules = {
    {"gpipe", PipelineScheduleKind::gpipe}, {"1f1b", PipelineScheduleKind::one_f_one_b},
    {"interleaved_1f1b", PipelineScheduleKind::interleaved_1f1b}, {"zero_bubble", PipelineScheduleKind::zero_bubble}};
const EnumNames<DType> kFloatTypes = {{"f32", DType::f32}, {"bf16", DType::bf16}};

}  // namespace deck_detail

using deck_detail::name_of;

std::string_view to_string(ModelArch v) { return name_of(deck_detail::kArchs, v); }
std::string_view to_string(MoeBalance v) { return name_of(deck_detail::kMoeBalances, v); }
std::string_view to_string(AttentionKind v) { return name_of(deck_detail::kAttentions, v); }
std::string_view to_string(PipelineScheduleKind v) { return name_of(deck_detail::kPipelineSchedules, v); }
std::string_view to_string(OptimizerKind v) { return name_of(deck_detail::kOptimizers, v); }
std::string_view to_string(ScheduleKind v) { return name_of(deck_detail::kSchedules, v); }
std::string_view to_string(DataFormat v) { return name_of(deck_detail::kFormats, v); }
std::string_view to_string(DataOrder v) { return name_of(deck_detail::kOrders, v); }
std::string_view to_string(ShardStrategy v) { return name_of(deck_detail::kStrategies, v); }
std::string_view to_string(OffloadPolicy v) { return name_of(deck_detail::kOffloads, v); }
std::string_view to_string(GradAccumulation v) { return name_of(deck_detail::kAccumulations, v); }
std::string_view to_string(ReplicaAllReduce v) { return name_of(deck_detail::kReplicaAllReduces, v); }
std::string_view to_string(ResumeMode v) { return name_of(deck_detail::kResumes, v); }
std::string_view to_string(CommBackendChoice v) { return name_of(deck_detail::kBackends, v); }
std::string_view to_string(CheckpointOnError v) { return name_of(deck_detail::kOnErrors, v); }
std::string_view to_string(NonFinitePolicy v) { return name_of(deck_detail::kNonFinite, v); }
std::string_view to_string(MatmulPrecisionChoice v) { return name_of(deck_detail::kMatmulPrecisions, v); }

GemmPrecision resolved_gemm_precision(const Deck& deck) {
  const bool bf16 = deck.matmul.precision == MatmulPrecisionChoice::bf16 ||
                    (deck.matmul.precision == MatmulPrecisionChoice::automatic && deck.fsdp.param_dtype == DType::bf16);
  if (bf16) return GemmPrecision::bf16;
  return deck.matmul.tf32 ? GemmPrecision::tf32 : GemmPrecision::f32;
}

std::string to_string(const ReshardAfterForward& v) {
  switch (v.kind) {
    case ReshardAfterForward::Kind::automatic: return "auto";
    case ReshardAfterForward::Kind::yes: return "true";
    case ReshardAfterForward::Kind::no: return "false";
    case ReshardAfterForward::Kind::group: return std::to_string(v.group_size);
  }
  return "?";
}

std::string to_string(const PrefetchSetting& v) {
  if (v.lists.empty()) return std::to_string(v.depth);
  std::string out;
  for (const auto& [unit, targets] : v.lists) {
    out += (out.empty() ? "" : ";") + unit + ":";
    for (std::size_t i = 0; i < targets.size(); ++i) out += (i ? "," : "") + targets[i];
  }
  return out;
}

std::string to_string(const ActivationCheckpointing& v) {
  switch (v.kind) {
    case ActivationCheckpointing::Kind::none: return "none";
    case ActivationCheckpointing::Kind::full: return "full";
    case ActivationCheckpointing::Kind::every: return "every_" + std::to_string(v.every);
  }
  return "?";
}

namespace deck_detail {

namespace {
// from_chars takes no leading '+', which YAML allows; "+-5" and a lone "+" stay invalid.
std::string_view without_plus(std::string_view text) {
  if (text.size() > 1 && text[0] == '+' && (std::isdigit(static_cast<unsigned char>(text[1])) || text[1] == '.'))
    text.remove_prefix(1);
  return text;
}
}  // namespace

std::string describe_node(const YAML::Node& node) {
  if (is_null_value(node)) return "nothing";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a sequence";
  return fmt::format("'{}'", node.Scalar());
}

bool is_null_value(const YAML::Node& node) { return !node.IsDefined() || node.IsNull(); }

IntText parse_integer(std::string_view text) {
  IntText out;
  const std::string_view digits = without_plus(text);
  const char* end = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(digits.data(), end, out.value);
  if (ptr != end) return out;  // trailing characters: "12abc", "1.5"
  if (ec == std::errc::result_out_of_range) {
    out.is_integer = out.overflow = true;
    return out;
  }
  out.is_integer = ec == std::errc();
  return out;
}

bool parse_real(std::string_view text, double& out) {
  text = without_plus(text);
  const char* end = text.data() + text.size();
  // from_chars is locale-independent: a deck reads the same whatever LC_NUMERIC the job inherits.
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ptr == end && ec == std::errc() && std::isfinite(out);
}

bool parse_bool(std::string_view text, bool& out) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "true" || lower == "yes" || lower == "on") return out = true, true;
  if (lower == "false" || lower == "no" || lower == "off") return out = false, true;
  return false;
}

std::string yaml_scalar(const std::string& text) {
  const bool plain_chars = !text.empty() && (std::isalnum(static_cast<unsigned char>(text.front())) ||
                                             text.front() == '_' || text.front() == '.' || text.front() == '/') &&
                           std::all_of(text.begin(), text.end(), [](unsigned char c) {
                             return std::isalnum(c) || c == '_' || c == '.' || c == '/' || c == '-' || c == '+';
                           });
  // Text that reads as null, a boolean or a number is quoted too, so that other YAML readers keep it a string.
  double real = 0;
  bool boolean = false;
  const bool looks_typed = text == "null" || text == "Null" || text == "NULL" || parse_integer(text).is_integer ||
                           parse_real(text, real) || parse_bool(text, boolean);
  if (plain_chars && !looks_typed) return text;
  std::string quoted = "\"";
  for (const unsigned char c : text) {
    switch (c) {
      case '"': quoted += "\\\""; break;
      case '\\': quoted += "\\\\"; break;
      case '\n': quoted += "\\n"; break;
      case '\t': quoted += "\\t"; break;
      default:
        if (c < 0x20) quoted += fmt::format("\\x{:02x}", c);
        else quoted += static_cast<char>(c);
    }
  }
  return quoted + "\"";
}

std::string format_real(double value) {
  // Shortest round-trip digits, with a '.' so that YAML 1.1 readers (PyYAML) also see a float: "1.0", "1.0e-08".
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".n") != std::string::npos) return text;  // has a point already, or is inf/nan
  const auto e = text.find('e');
  return e == std::string::npos ? text + ".0" : text.insert(e, ".0");
}

namespace {
// Optimal string alignment distance: a swap of two neighbours ("lr" / "rl") costs one edit, as typos do.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
}  // namespace

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  // Short words are close to everything; only suggest what a typo of that length plausibly is.
  const std::size_t limit = word.size() <= 3 ? 1 : std::max<std::size_t>(2, word.size() / 3);
  std::string best;
  std::size_t best_distance = limit + 1;
  for (const auto& candidate : candidates) {
    const std::size_t distance = edit_distance(lowercase(word), lowercase(candidate));
    if (distance < best_distance) best = candidate, best_distance = distance;
  }
  return best;
}

}  // namespace deck_detail
}  // namespace fsdpp
