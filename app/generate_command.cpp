// fsdpp generate <checkpoint | weights | model-folder> [--deck deck.yaml] [key=value ...] --prompt TEXT |
//   --prompts FILE | --prompt-ids IDS [--tokenizer T] [--max-new-tokens N] [--temperature T --top-k K --top-p P
//   --seed S] [--stop-token ID ... | --ignore-eos] [--logits FILE]
// Continues prompts with a trained model: a prefill of every prompt, then one token at a time with a KV cache
// (fsdpp/infer/generator.hpp). One rank, or with mpiexec -n k the model split over k tensor-parallel ranks
// (mesh.tp = k: a model too big for one device). Prints each prompt's continuation and the prefill and decode
// throughput. A Hugging Face model folder brings its model (config.json), its weights, its stop tokens
// (eos_token_id) and its tokenizer (tokenizer.json).
#include "commands.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/hf_config.hpp"
#include "fsdpp/ckpt/hf_folder.hpp"
#include "fsdpp/data/tokenizer.hpp"
#include "fsdpp/infer/generator.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/parallel/build_model.hpp"

#include <fmt/ranges.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fsdpp::app {
namespace {

struct GenerateArgs {
  std::string source;
  std::vector<std::string> overrides;
  std::string deck, prompt, prompts_file, tokenizer, logits_file;
  std::vector<std::string> prompt_ids;  // one prompt each
  bool ignore_eos = false;
  GenerationOptions options;
};

// What a model folder brings besides its model: its tokenizer.json (when --tokenizer is not given) and its EOS
// ids as stop tokens (when --stop-token and --ignore-eos are not). Rank 0 reads; every rank gets the same.
void take_folder_defaults(MPI_Comm world, GenerateArgs& args) {
  if (!is_model_folder_everywhere(world, args.source)) return;
  std::string tokenizer, eos;
  root_does(world, [&] {
    const std::string json = (std::filesystem::path(args.source) / "tokenizer.json").string();
    if (std::filesystem::is_regular_file(json)) tokenizer = json;
    const HfTokenIds ids = read_hf_token_ids(read_folder_file(args.source, kHfConfigFile),
                                             read_folder_file(args.source, kHfGenerationConfigFile, true), args.source);
    eos = fmt::format("{}", fmt::join(ids.eos, ","));
  });
  tokenizer = broadcast_string(world, std::move(tokenizer));
  eos = broadcast_string(world, std::move(eos));
  if (args.tokenizer.empty() && !tokenizer.empty()) args.tokenizer = tokenizer;
  if (args.options.stop_tokens.empty() && !args.ignore_eos && !eos.empty()) {
    std::istringstream ids(eos);
    for (std::string id; std::getline(ids, id, ',');) args.options.stop_tokens.push_back(std::stoi(id));
    Log::info("stop tokens: {} (eos_token_id of {}; --ignore-eos generates past them)", eos, args.source);
  }
}

// The prefill's next-token logits of every prompt, as raw little-endian float32 (prompts x vocabulary).
void write_logits(const std::string& path, const std::vector<float>& logits) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  out.close();
  if (out.fail()) throw UsageError(fmt::format("--logits {}: cannot write the file: {}", path, std::strerror(errno)));
}

std::vector<std::string> prompt_texts(MPI_Comm world, const GenerateArgs& args) {
  std::vector<std::string> out;
  if (!args.prompt.empty()) out.push_back(args.prompt);
  if (!args.prompts_file.empty()) {
    std::string text;
    root_does(world, [&] {
      std::ifstream in(args.prompts_file);
      if (!in) throw UsageError(fmt::format("cannot read --prompts file '{}': {}", args.prompts_file, std::strerror(errno)));
      std::ostringstream buffer;
      buffer << in.rdbuf();
      text = buffer.str();
    });
    std::istringstream lines(broadcast_string(world, std::move(text)));
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) out.push_back(line);  // one prompt per line; empty lines separate nothing
    FSDPP_REQUIRE(!out.empty(), "--prompts file '{}' has no prompt (one per line)", args.prompts_file);
  }
  return out;
}

std::vector<int> parse_ids(const std::string& text) {
  std::vector<int> ids;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      std::size_t used = 0;
      ids.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw UsageError(fmt::format("--prompt-ids '{}': '{}' is not a token id; write ids separated by commas, "
                                   "e.g. 3,17,42", text, item));
    }
  }
  return ids;
}

int run_generate(Runtime& rt, GenerateArgs args) {
  const int given = (args.prompt.empty() ? 0 : 1) + (args.prompts_file.empty() ? 0 : 1) + (args.prompt_ids.empty() ? 0 : 1);
  FSDPP_REQUIRE(given == 1, "fsdpp generate takes one of --prompt TEXT, --prompts FILE (one prompt per line) or "
                "--prompt-ids 1,2,3");
  FSDPP_REQUIRE(!args.ignore_eos || args.options.stop_tokens.empty(), "--ignore-eos and --stop-token contradict each "
                "other: --ignore-eos generates --max-new-tokens tokens whatever they are");
  take_folder_defaults(rt.world(), args);
  const Deck deck = generation_layout(model_deck(rt.world(), args.source, args.deck, args.overrides), rt.size());
  std::unique_ptr<Tokenizer> tokenizer;
  if (!args.tokenizer.empty()) tokenizer = load_tokenizer(args.tokenizer);
  else if (args.prompt_ids.empty()) tokenizer = byte_level_tokenizer();
  FSDPP_REQUIRE(!tokenizer || tokenizer->vocab_size() <= deck.model.vocab_size, "{} has {} ids, more than the model's "
                "model.vocab_size = {}: pass the tokenizer the model was trained with (--tokenizer)",
                tokenizer ? tokenizer->describe() : "", tokenizer ? tokenizer->vocab_size() : 0, deck.model.vocab_size);

  std::vector<std::vector<int>> prompts;
  if (!args.prompt_ids.empty()) {
    for (const std::string& ids : args.prompt_ids) prompts.push_back(parse_ids(ids));
  } else {
    for (const std::string& text : prompt_texts(rt.world(), args)) {
      std::vector<std::uint32_t> ids;
      tokenizer->encode(text, text.size(), true, ids);
      prompts.emplace_back(ids.begin(), ids.end());
    }
  }

  TrainModel t = build_model(rt.world(), deck);
  load_weights(rt.world(), args.source, t.model->parameters(), &deck.model);
  auto& model = dynamic_cast<CausalLM&>(*t.model);
  Log::info("model: {}, {} parameters, from {}; {} on {} rank(s) (mesh.tp = {})", model.describe(),
            model.parameter_count(), args.source, args.options.sampling.describe(), rt.size(), rt.size());
  args.options.keep_prefill_logits = !args.logits_file.empty();
  const Generation g = generate(model, prompts, args.options);
  if (!args.logits_file.empty()) {
    root_does(rt.world(), [&] { write_logits(args.logits_file, g.prefill_logits); });
    Log::info("wrote {}: the prefill's next-token logits of {} prompt(s) x {} vocabulary, float32", args.logits_file,
              prompts.size(), model.vocab_size());
  }

  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto& ids = g.tokens[i];
    if (tokenizer) {
      const std::vector<std::uint32_t> prompt(prompts[i].begin(), prompts[i].end()), more(ids.begin(), ids.end());
      Log::info("---- prompt {} ({} tokens) ----\n{}\n---- continuation ({} tokens) ----\n{}", i + 1, prompt.size(),
                tokenizer->decode(prompt), more.size(), tokenizer->decode(more));
    } else {
      Log::info("---- prompt {} ({} tokens) ----\ncontinuation ids: {}", i + 1, prompts[i].size(), fmt::join(ids, ","));
    }
  }
  const double prefill = g.prefill_tokens / std::max(g.prefill_seconds, 1e-9);
  const double decode = g.decode_tokens / std::max(g.decode_seconds, 1e-9);
  Log::info("prefill {} tokens in {:.3f} s ({:.1f} tokens/s); decode {} tokens in {:.3f} s ({:.1f} tokens/s); KV cache "
            "{:.2f} MiB per rank ({} bytes)", g.prefill_tokens, g.prefill_seconds, prefill, g.decode_tokens,
            g.decode_seconds, decode, g.cache_bytes / 1048576.0, g.cache_bytes);
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto* cli = app.add_subcommand("generate", "Continue prompts with a trained model (KV cache; greedy or sampled)");
  auto args = std::make_shared<GenerateArgs>();
  cli->add_option("source", args->source, "An fsdpp checkpoint (its deck is used), a Hugging Face model folder "
                                          "(its config.json, weights, eos_token_id and tokenizer.json), or a "
                                          "weights file (.h5 from fsdpp init / ckpt import / consolidate, or "
                                          ".safetensors) with --deck")
      ->required();
  cli->add_option("overrides", args->overrides, "section.key=value overrides of the model's deck");
  cli->add_option("--deck", args->deck, "The deck of the model (required for a weights file)");
  cli->add_option("--prompt", args->prompt, "A prompt to continue");
  cli->add_option("--prompts", args->prompts_file, "A file of prompts, one per line, continued as one batch");
  cli->add_option("--prompt-ids", args->prompt_ids, "A prompt as token ids, e.g. 3,17,42 (no tokenizer); repeat "
                                                    "it for a batch of prompts");
  cli->add_option("--tokenizer", args->tokenizer, "The model's tokenizer.json or SentencePiece .model (default: a "
                                                  "model folder's tokenizer.json, else byte-level, one token per byte)");
  cli->add_option("--max-new-tokens", args->options.max_new_tokens, "Tokens to generate per prompt (64)");
  cli->add_option("--temperature", args->options.sampling.temperature, "0: greedy (default); > 0: sample");
  cli->add_option("--top-k", args->options.sampling.top_k, "Sample among the k most probable tokens (0: all)");
  cli->add_option("--top-p", args->options.sampling.top_p, "Sample among the most probable tokens holding p of the "
                                                            "probability (1: all)");
  cli->add_option("--seed", args->options.sampling.seed, "Sampling seed: the same seed gives the same text (1337)");
  cli->add_option("--stop-token", args->options.stop_tokens, "A token id that ends a continuation (repeatable; "
                                                              "default: a model folder's eos_token_id)");
  cli->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at a model folder's eos_token_id (generate "
                                                  "--max-new-tokens tokens)");
  cli->add_option("--logits", args->logits_file, "Write each prompt's next-token logits after the prefill to this "
                                                  "file: prompts x vocabulary float32, little-endian");
  return {cli, [args](Runtime& rt) { return run_generate(rt, *args); }};
}

}  // namespace fsdpp::app
