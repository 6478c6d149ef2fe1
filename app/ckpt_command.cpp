// fsdpp ckpt inspect <ckpt> | verify <ckpt>: look at a checkpoint without the model that wrote it.
#include "commands.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/hf_convert.hpp"
#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/train/build_model.hpp"

#include <mpi.h>

namespace fsdpp::app {

Command add_ckpt_command(CLI::App& app) {
  auto* cli = app.add_subcommand("ckpt", "Inspect, verify, consolidate, import or export checkpoints");
  cli->require_subcommand(1);
  auto path = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* inspect = cli->add_subcommand("inspect", "Meta, parameters with shapes and shards, bytes, step and deck");
  auto* verify = cli->add_subcommand("verify", "Check the layout digest, every shard's checksum, shape and coverage, and that every value is finite");
  auto* consolidate = cli->add_subcommand("consolidate", "Write one plain HDF5 file with whole tensors at /model/<name>");
  for (auto* sub : {inspect, verify, consolidate}) sub->add_option("checkpoint", *path, "A step_<N>.h5 file")->required();
  consolidate->add_option("out", *out, "The HDF5 file to write")->required();
  auto* import = cli->add_subcommand("import", "Hugging Face GPT-2, Llama or Qwen2 safetensors -> an fsdpp weights file (for init_from)");
  auto* exporter = cli->add_subcommand("export", "An fsdpp checkpoint or weights file -> Hugging Face GPT-2, Llama or Qwen2 safetensors");
  auto deck_path = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("F32");
  import->add_option("safetensors", *path, "model.safetensors (GPT-2, Llama or Qwen2, HF layout)")->required();
  import->add_option("out", *out, "The fsdpp weights file to write (.h5)")->required();
  import->add_option("--deck", *deck_path, "The deck whose model the weights must fit")->required();
  exporter->add_option("checkpoint", *path, "A step_<N>.h5 checkpoint or a weights file")->required();
  exporter->add_option("out", *out, "The .safetensors file to write")->required();
  exporter->add_option("--dtype", *dtype, "F32 or BF16")->check(CLI::IsMember({"F32", "BF16"}));
  return {cli, [path, out, inspect, consolidate, import, exporter, deck_path, dtype](Runtime& rt) {
            // Every rank parses the deck (a bad deck is reported once); rank 0 converts.
            ShapeMap expected;  // the deck's model, on meta: its parameter names and shapes
            if (*import) {
              const auto model = make_model(parse_deck(read_deck_everywhere(rt.world(), *deck_path), *deck_path).model);
              for (Parameter* p : model->parameters()) expected[p->name()] = p->shape();
            }
            // Serial reads on rank 0; a failure is the same error (exit code 2) on every rank, and the verdict is
            // shared so every rank exits alike.
            std::string output;
            int problems = 0;
            root_does(rt.world(), [&] {
              if (*inspect) {
                output = inspect_checkpoint(*path);
              } else if (*import) {
                const char* model = import_hf(*path, *out, expected);
                output = fmt::format("wrote {}: {} weights in fsdpp layout; train from them with "
                                     "checkpoint.init_from={}", *out, model, *out);
              } else if (*exporter) {
                const char* model = export_hf(*path, *out, *dtype);
                output = fmt::format("wrote {}: Hugging Face {} layout, {}", *out, model, *dtype);
              } else if (*consolidate) {
                consolidate_checkpoint(*path, *out);
                output = fmt::format("wrote {}: whole tensors at /model/<name> (h5dump -d /model/wte.weight {})", *out, *out);
              } else {
                const auto found = verify_checkpoint(*path);
                problems = static_cast<int>(found.size());
                for (const auto& p : found) output += "problem: " + p + "\n";
                output += problems ? fmt::format("{}: {} problem(s)", *path, problems)
                                   : fmt::format("{}: every shard's checksum, shape and rows are sound, every value is "
                                                 "finite, and {}", *path,
                                                 check_checkpoint_layout(*path).has_digest
                                                     ? "the layout digest matches"
                                                     : "there is no layout digest to check (format_version 1)");
              }
            });
            FSDPP_MPI_CHECK(MPI_Bcast(&problems, 1, MPI_INT, 0, rt.world()));
            Log::info("{}", output);
            return problems ? 1 : 0;
          },
          [] { return false; }};  // HDF5 and host vectors only: runs without a GPU
}

}  // namespace fsdpp::app
