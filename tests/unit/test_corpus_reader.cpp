// Corpus mode's reading side (tokenize_corpus.hpp, corpus_reader.hpp): work units tile each file and cut it only
// where a document ends, so the documents of the units are those of the whole file; fields and separators; the
// end-of-text and BOS ids read from a tokenizer.json. Parity with Python on whole corpora is cli_tokenize_corpus.
#include <doctest/doctest.h>

#include "fsdpp/data/bpe_tokenizer.hpp"
#include "fsdpp/data/corpus_reader.hpp"
#include "fsdpp/data/tokenize_corpus.hpp"
#include "fsdpp/runtime/error.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace fsdpp;

namespace {

std::string write_temp(const std::string& name, const std::string& content) {
  const fs::path path = fs::temp_directory_path() / fmt::format("fsdpp_corpus_{}_{}", ::getpid(), name);
  std::ofstream(path, std::ios::binary) << content;
  return path.string();
}

std::vector<std::string> documents_of(const std::vector<CorpusUnit>& units, const DocumentOptions& options) {
  std::vector<std::string> docs;
  for (const CorpusUnit& unit : units)
    read_unit_documents(
        unit, options, [&](std::string_view d) { docs.emplace_back(d); },
        [](const BadDocument& bad) { throw UsageError(bad.where + ": " + bad.what); });
  return docs;
}

}  // namespace

TEST_CASE("corpus units tile a JSON Lines file at line ends and keep its documents") {
  std::string content;
  for (int i = 0; i < 40; ++i) content += fmt::format("{{\"meta\": {{\"body\": \"doc {} {}\"}}}}\n", i, std::string(i % 7, 'x'));
  const std::string path = write_temp("units.jsonl", content);
  const auto units = plan_corpus_units({path}, 100, "");
  REQUIRE(units.size() > 5);
  std::uint64_t at = 0;
  for (const CorpusUnit& u : units) {
    CHECK(u.byte_begin == at);
    CHECK(content[u.byte_end - 1] == '\n');  // a unit ends with a whole line
    at = u.byte_end;
  }
  CHECK(at == content.size());
  const DocumentOptions options{"meta.body", ""};
  const auto whole = documents_of({{path, InputKind::json_lines, 0, content.size()}}, options);
  CHECK(whole.size() == 40);
  CHECK(whole[3] == "doc 3 xxx");
  CHECK(documents_of(units, options) == whole);
  fs::remove(path);
}

TEST_CASE("corpus units of a text file are cut just after a separator") {
  std::string content;
  for (int i = 0; i < 30; ++i) content += fmt::format("document {}\nline two{}\n\n", i, std::string(i % 5, '!'));
  const std::string path = write_temp("units.txt", content);
  const std::string sep = unescape_separator("\\n\\n");
  CHECK(sep == "\n\n");
  const auto units = plan_corpus_units({path}, 64, sep);
  REQUIRE(units.size() > 3);
  for (std::size_t i = 0; i + 1 < units.size(); ++i) CHECK(content.substr(units[i].byte_end - 2, 2) == "\n\n");
  const auto docs = documents_of(units, {"text", sep});
  REQUIRE(docs.size() == 30);
  CHECK(docs[7] == "document 7\nline two!!");
  // Without a separator a text file is one unit and one document, whatever its size.
  const auto one = plan_corpus_units({path}, 64, "");
  CHECK(one.size() == 1);
  CHECK(documents_of(one, {"text", ""}) == std::vector<std::string>{content});
  fs::remove(path);
}

TEST_CASE("corpus input kinds and separators") {
  CHECK(input_kind_for_path("a/b.jsonl") == InputKind::json_lines);
  CHECK(input_kind_for_path("a/b.jsonl.zst") == InputKind::json_lines_zst);
  CHECK(input_kind_for_path("a/b.txt") == InputKind::text);
  CHECK_THROWS_WITH_AS(input_kind_for_path("b.jsonl.gz"), doctest::Contains("recompress it with zstd"), UsageError);
  CHECK(unescape_separator("a\\tb\\\\n\\q") == "a\tb\\n\\q");
}

TEST_CASE("end of text and BOS from a tokenizer.json") {
  const std::string base = R"({"normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "added_tokens": [{"id": 3, "content": "<|begin_of_text|>", "special": true},
                     {"id": 4, "content": "<|end_of_text|>", "special": true}],
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "vocab": {"a": 0, "b": 1, "ab": 2},
              "merges": [["a", "b"]]})";
  const auto plain = bpe_tokenizer_from_json(base + "}", "plain.json");
  CHECK(plain->end_of_text_id() == std::optional<std::uint32_t>(4));
  CHECK_FALSE(plain->bos_id().has_value());
  const auto llama = bpe_tokenizer_from_json(
      base + R"(, "post_processor": {"type": "Sequence", "processors": [{"type": "ByteLevel"},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                                  {"Sequence": {"id": "A", "type_id": 0}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [3]}}}]}})",
      "llama.json");
  CHECK(llama->bos_id() == std::optional<std::uint32_t>(3));
  CHECK_FALSE(byte_level_tokenizer()->end_of_text_id().has_value());
}
