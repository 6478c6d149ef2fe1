// Corpus mode's reading side (tokenize_corpus.hpp, corpus_reader.hpp): work units tile each file and cut it only
// where a document ends, so the documents of the units are those of the whole file; fields and separators; the
// four compressions, several frames in a file and a cut anywhere in one; a byte-order mark; empty documents
// counted, and indexes of earlier versions still read; the end-of-text and BOS ids read from a tokenizer.json.
// Parity with Python on whole corpora is cli_tokenize_corpus.
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

// Everything a read of some units reports: documents, bad ones (skipped) and the count of empty ones.
struct Reading {
  std::vector<std::string> documents;
  std::vector<BadDocument> bad;
  std::int64_t empty = 0;
};

Reading read_all(const std::vector<CorpusUnit>& units, const DocumentOptions& options) {
  Reading r;
  for (const CorpusUnit& unit : units)
    r.empty += read_unit_documents(
        unit, options, [&](std::string_view d) { r.documents.emplace_back(d); },
        [&](const BadDocument& bad) { r.bad.push_back(bad); });
  return r;
}

// Two JSON lines, {"text": "a"} and {"text": "b"}, each compressed on its own and the two files concatenated (as
// `cat a.gz b.gz` makes): `gzip -n -9`, `bzip2 -9`, `xz -9e` and `zstd -19`.
struct TwoFrames {
  const char* extension;
  std::string bytes;
  std::size_t first_frame_bytes;
};

std::vector<TwoFrames> two_frame_files() {
  return {{".jsonl.gz",
           std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xab\x56\x2a\x49\xad\x28\x51\xb2\x52\x50\x4a\x54"
                       "\xaa\xe5\x02\x00\xbd\xd2\x2a\x20\x0e\x00\x00\x00\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03"
                       "\xab\x56\x2a\x49\xad\x28\x51\xb2\x52\x50\x4a\x52\xaa\xe5\x02\x00\x53\x7d\x9f\x32\x0e\x00"
                       "\x00\x00",
                       68),
           34},
          {".json.bz2",
           std::string("\x42\x5a\x68\x39\x31\x41\x59\x26\x53\x59\x0f\x71\x3c\x91\x00\x00\x06\x59\x80\x00\x10\x50"
                       "\x00\x00\x10\x22\x00\x04\x4a\x20\x00\x31\x00\x30\x21\x33\x46\xa7\xea\x09\xa1\xb8\x45\x05"
                       "\x70\xbb\x92\x29\xc2\x84\x80\x7b\x89\xe4\x88\x42\x5a\x68\x39\x31\x41\x59\x26\x53\x59\x6f"
                       "\x06\x8e\xff\x00\x00\x06\x59\x80\x00\x10\x50\x00\x00\x10\x12\x00\x04\x4a\x20\x00\x31\x00"
                       "\x30\x21\x33\x46\xa7\xea\x09\xa1\xb8\x45\x05\x70\xbb\x92\x29\xc2\x84\x83\x78\x34\x77\xf8",
                       110),
           55},
          {".jsonl.xz",
           std::string("\xfd\x37\x7a\x58\x5a\x00\x00\x04\xe6\xd6\xb4\x46\x02\x00\x21\x01\x1c\x00\x00\x00\x10\xcf"
                       "\x58\xcc\x01\x00\x0d\x7b\x22\x74\x65\x78\x74\x22\x3a\x20\x22\x61\x22\x7d\x0a\x00\x00\x00"
                       "\x23\x04\xe6\xc1\x52\x84\xdd\xbc\x00\x01\x26\x0e\x08\x1b\xe0\x04\x1f\xb6\xf3\x7d\x01\x00"
                       "\x00\x00\x00\x04\x59\x5a\xfd\x37\x7a\x58\x5a\x00\x00\x04\xe6\xd6\xb4\x46\x02\x00\x21\x01"
                       "\x1c\x00\x00\x00\x10\xcf\x58\xcc\x01\x00\x0d\x7b\x22\x74\x65\x78\x74\x22\x3a\x20\x22\x62"
                       "\x22\x7d\x0a\x00\x00\x00\x47\xe6\x93\xa7\xb0\x1a\xee\x9a\x00\x01\x26\x0e\x08\x1b\xe0\x04"
                       "\x1f\xb6\xf3\x7d\x01\x00\x00\x00\x00\x04\x59\x5a",
                       144),
           72},
          {".jsonl.zst",
           std::string("\x28\xb5\x2f\xfd\x24\x0e\x71\x00\x00\x7b\x22\x74\x65\x78\x74\x22\x3a\x20\x22\x61\x22\x7d"
                       "\x0a\xfc\x0c\x48\x58\x28\xb5\x2f\xfd\x24\x0e\x71\x00\x00\x7b\x22\x74\x65\x78\x74\x22\x3a"
                       "\x20\x22\x62\x22\x7d\x0a\x38\x7d\x47\xc0",
                       54),
           27}};
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
  CHECK(input_kind_for_path("a/b.jsonl.gz") == InputKind::json_lines_gz);
  CHECK(input_kind_for_path("dolma/v1_7/c4-0000.json.gz") == InputKind::json_lines_gz);
  CHECK(input_kind_for_path("a/b.jsonl.bz2") == InputKind::json_lines_bz2);
  CHECK(input_kind_for_path("a/b.json.xz") == InputKind::json_lines_xz);
  CHECK(input_kind_for_path("a/b.txt") == InputKind::text);
  CHECK(input_kind_for_path("a.tar.d/b.jsonl") == InputKind::json_lines);  // only the file's name counts
  CHECK_THROWS_WITH_AS(input_kind_for_path("web.tar.gz"), doctest::Contains("an archive (.tar.gz) is not read"),
                       UsageError);
  CHECK_THROWS_WITH_AS(input_kind_for_path("web.zip"), doctest::Contains("extract its files"), UsageError);
  CHECK_THROWS_WITH_AS(input_kind_for_path("b.jsonl.lz4"), doctest::Contains("recompress it with zstd"), UsageError);
  CHECK(unescape_separator("a\\tb\\\\n\\q") == "a\tb\\n\\q");
}

TEST_CASE("compressed JSON Lines: frames one after another are one text; a cut anywhere else is reported once") {
  for (const TwoFrames& f : two_frame_files()) {
    CAPTURE(f.extension);
    const std::string path = write_temp(std::string("frames") + f.extension, f.bytes);
    const InputKind kind = input_kind_for_path(path);
    const Reading whole = read_all(plan_corpus_units({path}, 1, ""), {"text", ""});
    CHECK(whole.documents == std::vector<std::string>{"a", "b"});
    CHECK(whole.bad.empty());
    // Every cut: at the end of the first frame (or of none) nothing is lost; elsewhere the line the file ends in
    // is reported, with its line and how far the decoder read, and the whole lines before it are kept.
    for (std::size_t size = 0; size < f.bytes.size(); ++size) {
      CAPTURE(size);
      std::ofstream(path, std::ios::binary | std::ios::trunc) << f.bytes.substr(0, size);
      const Reading cut = read_all({{path, kind, 0, size}}, {"text", ""});
      const std::vector<std::string> kept = cut.documents;
      if (size == 0 || size == f.first_frame_bytes) {
        CHECK(cut.bad.empty());
        CHECK(kept.size() == (size == 0 ? 0 : 1));
      } else {
        REQUIRE(cut.bad.size() == 1);
        CHECK(cut.bad[0].reason == BadReason::truncated_compressed);
        CHECK(cut.bad[0].where == fmt::format("{}:{}, compressed byte {}", path, kept.size() + 1, size));
        CHECK(kept.size() <= (size < f.first_frame_bytes ? 1 : 2));
      }
      CHECK(kept == std::vector<std::string>(whole.documents.begin(), whole.documents.begin() + kept.size()));
    }
    fs::remove(path);
  }
}

TEST_CASE("a byte-order mark at the start of a JSON Lines file is skipped, and only there") {
  const std::string bom = "\xEF\xBB\xBF";
  const std::string path = write_temp("bom.jsonl", bom + "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  const Reading r = read_all(plan_corpus_units({path}, 1, ""), {"text", ""});  // a unit per line
  CHECK(r.documents == std::vector<std::string>{"a", "b"});
  CHECK(r.bad.empty());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "{\"text\": \"a\"}\n" << bom << "{\"text\": \"b\"}\n";
  const Reading later = read_all(plan_corpus_units({path}, 1 << 20, ""), {"text", ""});
  CHECK(later.documents == std::vector<std::string>{"a"});
  REQUIRE(later.bad.size() == 1);
  CHECK(later.bad[0].reason == BadReason::malformed_json);
  CHECK(later.bad[0].where == path + ":2");
  fs::remove(path);
}

TEST_CASE("empty documents are left out and counted: documents + empty + bad = lines") {
  // 7 lines: a, blank, blank with spaces, "", a malformed line, b, and an empty string without a final newline.
  const std::string content =
      "{\"text\": \"a\"}\n\n  \r\n{\"text\": \"\"}\n{oops}\n{\"text\": \"b\"}\n{\"meta\": 1, \"text\": \"\"}";
  const std::string path = write_temp("empty.jsonl", content);
  for (std::uint64_t shard_bytes : {std::uint64_t{1}, std::uint64_t{1} << 20}) {
    const Reading r = read_all(plan_corpus_units({path}, shard_bytes, ""), {"text", ""});
    CHECK(r.documents == std::vector<std::string>{"a", "b"});
    CHECK(r.empty == 4);
    CHECK(r.bad.size() == 1);
  }
  // Text: an empty piece between separators, and an empty file (the file is the document).
  std::ofstream(path + ".txt", std::ios::binary) << "x\n\n\n\ny";
  const Reading text = read_all(plan_corpus_units({path + ".txt"}, 1 << 20, "\n\n"), {"text", "\n\n"});
  CHECK(text.documents == std::vector<std::string>{"x", "y"});
  CHECK(text.empty == 1);
  std::ofstream(path + ".txt", std::ios::binary | std::ios::trunc);
  CHECK(read_all(plan_corpus_units({path + ".txt"}, 1 << 20, ""), {"text", ""}).empty == 1);
  fs::remove(path);
  fs::remove(path + ".txt");
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

TEST_CASE("an index written before empty documents were counted still loads; such a record is not reused") {
  const fs::path folder = fs::temp_directory_path() / fmt::format("fsdpp_corpus_{}_old_index", ::getpid());
  fs::create_directories(folder);
  const std::string shard = R"({"path": "shard-00000.bin", "source": "a.jsonl.zst", "byte_begin": 0, "byte_end": 9,
    "documents": 3, "tokens": 7, "bytes": 12,
    "skipped": {"invalid_utf8": 0, "malformed_json": 0, "missing_field": 0, "truncated_zstd": 1}})";
  std::ofstream(folder / "index.json") << R"({"format": "fsdpp-corpus", "version": 1, "tokenizer": "t",
    "vocab_size": 64, "eot_id": 63, "bos_id": null, "token_bytes": 2, "shards": [)" << shard << "]}";
  const CorpusIndex index = read_corpus_index(folder.string());
  CHECK(index.shards.at(0).skipped.truncated_compressed == 1);
  CHECK(index.empty_documents() == 0);
  CHECK_THROWS_WITH_AS(corpus_shard_from_json_text(shard, "shard-00000.json"),
                       doctest::Contains("without \"empty_documents\" (written by an older fsdpp)"), UsageError);
  CorpusShard now = index.shards.at(0);
  now.empty_documents = 2;
  const CorpusShard back = corpus_shard_from_json_text(to_json_text(now), "shard-00000.json");
  CHECK(back.empty_documents == 2);
  CHECK(back.skipped.truncated_compressed == 1);
  fs::remove_all(folder);
}
