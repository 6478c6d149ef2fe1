#include "fsdpp/config/deck_loading.hpp"

#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace fsdpp {

std::string read_deck_everywhere(MPI_Comm world, const std::string& path) {
  std::string text;
  root_does(world, [&] {
    std::ifstream in(path);
    if (!in) throw UsageError(fmt::format("cannot read deck '{}': {}", path, std::strerror(errno)));
    std::ostringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  });
  return broadcast_string(world, std::move(text));
}

Deck deck_from_words(MPI_Comm world, std::vector<std::string> words, const ModelSourceReader& from_hf) {
  std::string file_name = "tiny.yaml (embedded)", text = embedded_tiny_deck();
  if (!words.empty() && words.front().find('=') == std::string::npos) {
    file_name = words.front();
    text = read_deck_everywhere(world, file_name);
    words.erase(words.begin());
  }
  return parse_deck(text, file_name, words, from_hf);
}

}  // namespace fsdpp
