// `fsdpp tokenize` on several ranks: each rank tokenizes a byte range, and the file is byte-for-byte the one a
// single process writes (byte-level and a small byte-level BPE tokenizer.json, ranges cut mid-text); errors are
// the same on every rank and leave no part files behind.
#include "mpi_test.hpp"

#include "fsdpp/data/token_file.hpp"
#include "fsdpp/data/tokenize.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace fs = std::filesystem;
using namespace fsdpp;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A folder every rank of `comm` shares (rank 0 names it).
std::string shared_dir(MPI_Comm comm, const char* tag) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string dir = rank == 0 ? (fs::temp_directory_path() / fmt::format("fsdpp_mpi_tok_{}_{}", tag, ::getpid())).string()
                              : std::string();
  dir = broadcast_string(comm, dir);
  if (rank == 0) fs::create_directories(dir);
  MPI_Barrier(comm);
  return dir;
}

const char* kTinyBpe = R"({"normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "added_tokens": [{"id": 6, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": true}],
  "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "vocab": {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġab": 4, "\u010a": 5, "<|end|>": 6},
            "merges": [["a", "b"], ["Ġ", "ab"]]}})";

}  // namespace

MPI_TEST_CASE("tokenize: 2 ranks write the file 1 rank writes", 2) {
  const std::string dir = shared_dir(test_comm, "np2");
  const std::string text_path = dir + "/in.txt", tok_path = dir + "/tok.json";
  if (test_rank == 0) {
    std::ofstream text(text_path, std::ios::binary);
    for (int i = 0; i < 2000; ++i) text << (i % 5 ? "ab ab" : "<|end|>ab") << (i % 3 ? "\n" : "\n\n  ") << "ab";
    std::ofstream(tok_path) << kTinyBpe;
  }
  MPI_Barrier(test_comm);
  for (const std::string& tokenizer : {std::string(), tok_path}) {
    TokenizeOptions options;
    options.tokenizer_path = tokenizer;
    options.chunk_bytes = 1000;
    const auto both = tokenize_file(test_comm, text_path, dir + "/np2.bin", options);
    if (test_rank == 0) tokenize_file(MPI_COMM_SELF, text_path, dir + "/np1.bin", options);
    MPI_Barrier(test_comm);
    MPI_CHECK(0, read_all(dir + "/np2.bin") == read_all(dir + "/np1.bin"));
    MPI_CHECK(0, both.tokens == static_cast<std::int64_t>(load_tokens(dir + "/np1.bin", both.vocab_size).size()));
    MPI_CHECK(0, both.vocab_size == (tokenizer.empty() ? 256 : 7));
    MPI_CHECK(0, !fs::exists(dir + "/np2.bin.part0of2"));
    MPI_CHECK(0, !fs::exists(dir + "/np2.bin.part1of2"));
    MPI_Barrier(test_comm);
  }
  // A missing tokenizer: the same error on both ranks, nothing written.
  std::string error;
  try {
    TokenizeOptions options;
    options.tokenizer_path = dir + "/missing.json";
    tokenize_file(test_comm, text_path, dir + "/x.bin", options);
  } catch (const UsageError& e) {
    error = e.what();
  }
  CHECK(error == dir + "/missing.json: cannot open the tokenizer file: No such file or directory (--tokenizer takes a "
                       "Hugging Face tokenizer.json or a SentencePiece .model)");
  CHECK(!fs::exists(dir + "/x.bin"));
  MPI_Barrier(test_comm);
  if (test_rank == 0) fs::remove_all(dir);
}
