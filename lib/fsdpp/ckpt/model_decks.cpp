#include "fsdpp/ckpt/model_decks.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/hf_config.hpp"
#include "fsdpp/ckpt/hf_folder.hpp"
#include "fsdpp/config/deck_loading.hpp"
#include "fsdpp/runtime/collective_errors.hpp"

namespace fsdpp {

ModelSourceReader hf_folder_reader(MPI_Comm world) {
  return [world](const std::string& folder) {
    std::string text;
    root_does(world, [&] { text = read_folder_file(folder, kHfConfigFile); });
    return read_hf_model_config(broadcast_string(world, std::move(text)), folder + "/" + kHfConfigFile);
  };
}

bool is_model_folder_everywhere(MPI_Comm world, const std::string& path) {
  int folder = 0;
  root_does(world, [&] { folder = is_model_folder(path) ? 1 : 0; });
  MPI_Bcast(&folder, 1, MPI_INT, 0, world);
  return folder != 0;
}

Deck model_deck(MPI_Comm world, const std::string& source, const std::string& deck_path,
                const std::vector<std::string>& overrides) {
  if (!deck_path.empty())
    return parse_deck(read_deck_everywhere(world, deck_path), deck_path, overrides, hf_folder_reader(world));
  if (is_model_folder_everywhere(world, source)) {
    // The folder's config.json is the model; train.steps, which every deck must give, means nothing here.
    std::vector<std::string> words = {"model.from_hf=" + source, "train.steps=1"};
    words.insert(words.end(), overrides.begin(), overrides.end());
    return parse_deck("", source + "/" + kHfConfigFile, words, hf_folder_reader(world));
  }
  std::string text;
  root_does(world, [&] { text = checkpoint_deck(source); });
  return parse_deck(broadcast_string(world, std::move(text)), source + " (its deck)", overrides, hf_folder_reader(world));
}

}  // namespace fsdpp
