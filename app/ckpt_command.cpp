// fsdpp ckpt inspect | verify | consolidate | import | export | deck: look at a checkpoint without the model that
// wrote it, and move weights in and out of Hugging Face's formats (one .safetensors file, or a model folder).
#include "commands.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/hf_config.hpp"
#include "fsdpp/ckpt/hf_convert.hpp"
#include "fsdpp/ckpt/hf_export.hpp"
#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/parallel/build_model.hpp"

#include <fmt/ranges.h>
#include <mpi.h>

namespace fsdpp::app {
namespace {

struct CkptArgs {
  std::string path, out, deck, dtype = "F32", max_shard_size = "5GB", tokenizer;
  bool hf = false;
};

// The deck `fsdpp ckpt deck <folder>` prints: the model section config.json implies, which parses back as the
// same model.
std::string folder_model_section(MPI_Comm world, const std::string& folder) {
  const Deck deck = model_deck(world, folder, "");
  std::vector<std::string> keys = {"model.arch"};
  for (const auto& k : hf_folder_reader(world)(folder).keys)
    if (std::find(keys.begin(), keys.end(), k.deck_key) == keys.end()) keys.push_back(k.deck_key);
  return fmt::format("# the model of {}/config.json ({}); a deck may say model.from_hf: {} instead\n{}", folder,
                     make_model(deck.model)->describe(), folder, deck_keys_yaml(deck, keys));
}

// The subcommands of `fsdpp ckpt`, as CLI11 parsed them (the one given is true).
struct CkptSubcommands {
  CLI::App* inspect = nullptr;
  CLI::App* consolidate = nullptr;
  CLI::App* import = nullptr;
  CLI::App* exporter = nullptr;
  CLI::App* deck = nullptr;
};

CkptSubcommands add_ckpt_options(CLI::App* cli, CkptArgs& args) {
  CkptSubcommands sub;
  sub.inspect = cli->add_subcommand("inspect", "Meta, parameters with shapes and shards, bytes, step and deck");
  auto* verify = cli->add_subcommand("verify", "Check the layout digest, every shard's checksum, shape and coverage, and that every value is finite");
  sub.consolidate = cli->add_subcommand("consolidate", "Write one plain HDF5 file with whole tensors at /model/<name>");
  for (CLI::App* command : {sub.inspect, verify, sub.consolidate})
    command->add_option("checkpoint", args.path, "A step_<N>.h5 file")->required();
  sub.consolidate->add_option("out", args.out, "The HDF5 file to write")->required();
  sub.import = cli->add_subcommand("import", "A Hugging Face model folder or safetensors file (GPT-2, Llama, Qwen2) -> an fsdpp weights file (for init_from)");
  sub.exporter = cli->add_subcommand("export", "An fsdpp checkpoint or weights file -> a Hugging Face model folder (--hf) or safetensors file");
  sub.deck = cli->add_subcommand("deck", "Print the deck's model: section a Hugging Face model folder's config.json implies");
  sub.import->add_option("source", args.path, "A Hugging Face model folder (config.json and its weights: "
                                               "model.safetensors or an index and its shards), or a .safetensors file")
      ->required();
  sub.import->add_option("out", args.out, "The fsdpp weights file to write (.h5)")->required();
  sub.import->add_option("--deck", args.deck, "The deck whose model the weights must fit (required for a "
                                               ".safetensors file; a folder's config.json is its model)");
  sub.exporter->add_option("checkpoint", args.path, "A step_<N>.h5 checkpoint or a weights file")->required();
  sub.exporter->add_option("out", args.out, "The folder (--hf) or .safetensors file to write")->required();
  sub.exporter->add_option("--dtype", args.dtype, "F32 or BF16")->check(CLI::IsMember({"F32", "BF16"}));
  sub.exporter->add_flag("--hf", args.hf, "Write a Hugging Face model folder: config.json, generation_config.json, "
                                           "the weights in shards with their index, the tokenizer");
  sub.exporter->add_option("--max-shard-size", args.max_shard_size, "--hf: the largest shard, as transformers' "
                                                                     "max_shard_size (5GB = 5 x 10^9 bytes)");
  sub.exporter->add_option("--tokenizer", args.tokenizer, "--hf: a tokenizer file, or a model folder whose "
                                                           "tokenizer files and token ids (bos, eos) to copy");
  sub.exporter->add_option("--deck", args.deck, "--hf: the deck of a weights file's model (a checkpoint carries its own)");
  sub.deck->add_option("folder", args.path, "A Hugging Face model folder")->required();
  return sub;
}

// What a rank-0 subcommand does, and what it prints: `problems` counts what verify found.
std::string run_on_rank_zero(const CkptArgs& args, const CkptSubcommands& sub, const ShapeMap& expected,
                             const ModelConfig& model, int& problems) {
  std::string output;
  if (*sub.inspect) {
    output = inspect_checkpoint(args.path);
  } else if (*sub.import) {
    const char* name = import_hf(args.path, args.out, expected);
    output = fmt::format("wrote {}: {} weights in fsdpp layout; train from them with checkpoint.init_from={}",
                         args.out, name, args.out);
  } else if (*sub.exporter && args.hf) {
    HfFolderExport options;
    options.dtype = args.dtype;
    options.max_shard_bytes = parse_shard_size(args.max_shard_size);
    options.tokenizer = args.tokenizer;
    const HfFolderWritten w = export_hf_folder(args.path, model, args.out, options);
    output = fmt::format("wrote {}: a Hugging Face {} model folder, {} ({:.1f} MB of weights): {}",
                         args.out, w.model, args.dtype, w.tensor_bytes / 1e6, fmt::join(w.files, ", "));
  } else if (*sub.exporter) {
    const char* name = export_hf(args.path, args.out, args.dtype);
    output = fmt::format("wrote {}: Hugging Face {} layout, {}", args.out, name, args.dtype);
  } else if (*sub.consolidate) {
    consolidate_checkpoint(args.path, args.out);
    output = fmt::format("wrote {}: whole tensors at /model/<name> (h5dump -d /model/wte.weight {})",
                         args.out, args.out);
  } else {
    const auto found = verify_checkpoint(args.path);
    problems = static_cast<int>(found.size());
    for (const auto& p : found) output += "problem: " + p + "\n";
    output += problems ? fmt::format("{}: {} problem(s)", args.path, problems)
                       : fmt::format("{}: every shard's checksum, shape and rows are sound, every value is "
                                     "finite, and {}", args.path,
                                     check_checkpoint_layout(args.path).has_digest
                                         ? "the layout digest matches"
                                         : "there is no layout digest to check (format_version 1)");
  }
  return output;
}

int run_ckpt(Runtime& rt, const CkptArgs& args, const CkptSubcommands& sub) {
  if (*sub.deck) {
    Log::info("{}", folder_model_section(rt.world(), args.path));
    return 0;
  }
  FSDPP_REQUIRE(!*sub.exporter || args.hf || (args.tokenizer.empty() && args.deck.empty()),
                "--tokenizer and --deck belong to export --hf (a model folder); a .safetensors file holds the "
                "weights only");
  // Every rank parses the deck (a bad deck is reported once); rank 0 converts.
  ShapeMap expected;  // import: the deck's model, on meta: its parameter names and shapes
  ModelConfig model;  // export --hf: the model the folder describes
  if (*sub.import) {
    FSDPP_REQUIRE(!args.deck.empty() || is_model_folder_everywhere(rt.world(), args.path),
                  "{}: a .safetensors file holds no model description: pass --deck with the deck whose "
                  "model it is (or import the model folder that holds config.json)", args.path);
    const Deck d = model_deck(rt.world(), args.path, args.deck);
    if (is_model_folder_everywhere(rt.world(), args.path)) check_hf_folder_config(rt.world(), args.path, d.model);
    const auto meta = make_model(d.model);  // names and shapes only
    for (Parameter* p : meta->parameters()) expected[p->name()] = p->shape();
  }
  if (*sub.exporter && args.hf) model = model_deck(rt.world(), args.path, args.deck).model;
  // Serial reads on rank 0; a failure is the same error (exit code 2) on every rank, and the verdict is shared so
  // every rank exits alike.
  std::string output;
  int problems = 0;
  root_does(rt.world(), [&] { output = run_on_rank_zero(args, sub, expected, model, problems); });
  FSDPP_MPI_CHECK(MPI_Bcast(&problems, 1, MPI_INT, 0, rt.world()));
  Log::info("{}", output);
  return problems ? 1 : 0;
}

}  // namespace

Command add_ckpt_command(CLI::App& app) {
  auto* cli = app.add_subcommand("ckpt", "Inspect, verify, consolidate, import or export checkpoints");
  cli->require_subcommand(1);
  auto args = std::make_shared<CkptArgs>();
  const CkptSubcommands sub = add_ckpt_options(cli, *args);
  return {cli, [args, sub](Runtime& rt) { return run_ckpt(rt, *args, sub); },
          [] { return false; }};  // HDF5 and host vectors only: runs without a GPU
}

}  // namespace fsdpp::app
