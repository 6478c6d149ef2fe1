#pragma once
// One path of data.source / data.sources as a token stream: a corpus folder or its index.json (corpus_index.hpp),
// or a token file in data.format (token_file.hpp). Training (train/data_feed) and `fsdpp eval --all` read data
// through this one function, so both accept the same paths and refuse the same mismatches.
#include "fsdpp/config/deck.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// UsageError naming the path when it does not exist (at `where`, the deck's key or entry that gave it), when a
// corpus's vocabulary exceeds `vocab_size`, when data.document_mask is on and data.eot_id is not the corpus's
// end-of-text id, or when a token file has a token outside the vocabulary.
std::vector<std::uint32_t> load_token_source(const std::string& path, const DataConfig& data,
                                             std::int64_t vocab_size, const std::string& where);

}  // namespace fsdpp
