#include "fsdpp/data/token_source.hpp"

#include "fsdpp/data/corpus_index.hpp"
#include "fsdpp/data/token_file.hpp"
#include "fsdpp/runtime/error.hpp"

#include <filesystem>

namespace fsdpp {

std::vector<std::uint32_t> load_token_source(const std::string& path, const DataConfig& data,
                                             std::int64_t vocab_size, const std::string& where) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    const bool relative = std::filesystem::path(path).is_relative();
    throw UsageError(fmt::format(
        "{}: {} does not exist{}: give a token file (.bin, .u16, .u32), a corpus folder written by `fsdpp tokenize`, "
        "or its index.json", where, path,
        relative ? fmt::format(" (relative paths start at the working directory, {})",
                               std::filesystem::current_path(ec).string())
                 : ""));
  }
  if (is_corpus(path)) {
    const CorpusIndex index = read_corpus_index(path);
    FSDPP_REQUIRE(index.vocab_size <= vocab_size,
                  "{}: the corpus was tokenized with a vocabulary of {} ids, but model.vocab_size is {}; set "
                  "model.vocab_size to at least {}", corpus_index_path(path), index.vocab_size, vocab_size,
                  index.vocab_size);
    // The masks split documents at data.eot_id; a corpus ends each document with its own id, so the two must agree
    // or every document would run into the next unseen.
    FSDPP_REQUIRE(!data.document_mask || data.eot_id == index.eot_id,
                  "{}: the corpus ends each document with token {}, but data.eot_id is {}: set data.eot_id: {} for "
                  "data.document_mask", corpus_index_path(path), index.eot_id, data.eot_id, index.eot_id);
    return load_corpus_tokens(path);
  }
  switch (data.format) {
    case DataFormat::automatic: return load_tokens(path, vocab_size);
    case DataFormat::gpt2: return load_tokens(path, TokenFormat::gpt2_bin, vocab_size);
    case DataFormat::uint16: return load_tokens(path, TokenFormat::raw_u16, vocab_size);
    case DataFormat::uint32: return load_tokens(path, TokenFormat::raw_u32, vocab_size);
  }
  return {};
}

}  // namespace fsdpp
