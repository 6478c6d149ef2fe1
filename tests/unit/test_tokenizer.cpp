// The tokenizers of `fsdpp tokenize`: GPT-2's byte-to-unicode table, BPE merges by rank (both JSON forms, ties,
// ignore_merges), added tokens, pre-tokenizer expressions with Oniguruma's meaning (and their PCRE2 translation
// against Oniguruma itself on every code point), invalid UTF-8, chunk boundaries, streaming in chunks, and the exact
// error of each refused file. Parity with the Python implementations on real vocabularies is tests/cli/tokenizers.sh.
#include <doctest/doctest.h>

#include "test_helpers.hpp"
#include "fsdpp/data/bpe_tokenizer.hpp"
#include "fsdpp/data/onig_to_pcre2.hpp"
#include "fsdpp/data/regex_splitter.hpp"
#include "fsdpp/data/utf8.hpp"
#include "fsdpp/data/token_file.hpp"
#include "fsdpp/data/tokenize.hpp"
#include "fsdpp/runtime/error.hpp"

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>

namespace fs = std::filesystem;
using namespace fsdpp;

namespace {

using fsdpp::test::usage_error_of;

// A tiny byte-level BPE tokenizer.json: the letters a, b, c and the space (Ġ), merges as given.
std::string tiny_json(const std::string& merges, const std::string& extra_model = "",
                      const std::string& added = "", const std::string& pre = "") {
  const std::string pre_tokenizer =
      pre.empty() ? R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})"
                  : pre;
  return fmt::format(R"({{"version": "1.0", "normalizer": null, "pre_tokenizer": {},
    "added_tokens": [{}],
    "model": {{"type": "BPE", "dropout": null, "unk_token": null, {}
      "vocab": {{"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "bc": 5, "abc": 6, "aa": 7, "Ġa": 8, "<|end|>": 9}},
      "merges": [{}]}}}})",
                     pre_tokenizer, added, extra_model, merges);
}

std::vector<std::uint32_t> encode(Tokenizer& t, std::string_view text) {
  std::vector<std::uint32_t> ids;
  t.encode(text, text.size(), true, ids);
  return ids;
}

using Ids = std::vector<std::uint32_t>;
using Pieces = std::vector<std::string>;

Pieces split(const RegexSplitter& splitter, std::string_view text) {
  auto scratch = splitter.scratch();
  std::vector<std::pair<std::size_t, std::size_t>> offsets;
  splitter.split(text, 0, text.size(), *scratch, offsets);
  Pieces pieces;
  for (const auto& [b, e] : offsets) pieces.emplace_back(text.substr(b, e - b));
  return pieces;
}

// The pieces of `text` under `pattern`, checked the same on PCRE2 (the translation) and on Oniguruma.
Pieces split_both(const std::string& pattern, std::string_view text) {
  const RegexSplitter fast(pattern, false, "t.json"), onig(pattern, false, "t.json", RegexSplitter::Engine::oniguruma);
  const Pieces pieces = split(onig, text);
  CHECK(split(fast, text) == pieces);
  return pieces;
}

// Every code point of planes 0-2 and 14 (the large uniform blocks of CJK ideographs and Hangul syllables sampled),
// each between letters, digits, spaces, an apostrophe and itself: each expression's classes meet every character.
std::string every_code_point() {
  auto sampled = [](char32_t c) {
    const bool uniform = (c >= 0x3400 && c < 0x4DC0) || (c >= 0x4E00 && c < 0xA000) || (c >= 0xAC00 && c < 0xD7A4) ||
                         (c >= 0x20000 && c < 0x30000);
    return !uniform || c % 61 == 0;
  };
  std::string text;
  for (char32_t c = 0; c < 0xE0200; c = c == 0x2FFFF ? 0xE0000 : c + 1) {
    if ((c >= 0xD800 && c < 0xF900) || !sampled(c)) continue;  // surrogates, private use
    std::string ch;
    append_utf8(ch, c);
    text += "a" + ch + "b " + ch + ch + "1" + ch + " '" + ch + "\n";
  }
  return text;
}

// The pre-tokenizer expressions of real tokenizer.json files.
const std::vector<std::pair<std::string, std::string>>& real_expressions() {
  static const std::vector<std::pair<std::string, std::string>> expressions = {
      {"GPT-2", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
      {"Llama 3", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {"Qwen2", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {"cl100k_base", R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)"},
      {"o200k_base", R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {"tekken", R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {"DeepSeek V3 (1)", R"(\p{N}{1,3})"},
      {"DeepSeek V3 (2)", "[一-龥぀-ゟ゠-ヿ]+"},
      {"DeepSeek V3 (3)",  // its [^\r\n...] hold the characters CR and LF (JSON escapes), not backslashes
       "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
      {"deepseek-coder", R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)"},
      {"deepseek-coder $", R"(\s+$)"},
      {"BLOOM", R"( ?[^(\s|[.,!?…。，、।۔،])]+)"},
  };
  return expressions;
}

}  // namespace

TEST_CASE("byte_to_unicode: GPT-2's bijection of the 256 bytes onto printable code points") {
  const auto& table = byte_to_unicode();
  CHECK(std::set<char32_t>(table.begin(), table.end()).size() == 256);
  for (int b = '!'; b <= '~'; ++b) CHECK(table[b] == static_cast<char32_t>(b));  // printable ASCII is itself
  CHECK(table[' '] == U'\u0120');   // Ġ: the 33rd unprintable byte (0..32 come first)
  CHECK(table['\n'] == U'\u010A');  // Ċ
  CHECK(table[0] == U'\u0100');
  CHECK(table[0xAD] == U'\u0143');  // the soft hyphen is the last byte moved
  CHECK(byte_level_string("hello world\n") == "hello\xC4\xA0world\xC4\x8A");
  CHECK(byte_level_string("\xC3\xA9") == "\xC3\x83\xC2\xA9");  // é's two bytes, each a Latin-1 letter
}

TEST_CASE("BPE: merges apply by rank, lowest first, leftmost among equal ranks") {
  auto bc_first = bpe_tokenizer_from_json(tiny_json(R"(["b", "c"], ["a", "b"])"), "t.json");
  auto ab_first = bpe_tokenizer_from_json(tiny_json(R"(["a", "b"], ["b", "c"])"), "t.json");
  CHECK(encode(*bc_first, "abc") == Ids{0, 5});  // a + bc
  CHECK(encode(*ab_first, "abc") == Ids{4, 2});  // ab + c
  auto both = bpe_tokenizer_from_json(tiny_json(R"(["b", "c"], ["a", "bc"])"), "t.json");
  CHECK(encode(*both, "abc") == Ids{6});
  auto aa = bpe_tokenizer_from_json(tiny_json(R"(["a", "a"])"), "t.json");
  CHECK(encode(*aa, "aaa") == Ids{7, 0});  // the leftmost pair merges first
  CHECK(encode(*aa, "aaaa") == Ids{7, 7});
  // The older "a b" string form reads the same as the [a, b] pairs; the pre-tokenizer keeps words apart.
  auto strings = bpe_tokenizer_from_json(tiny_json(R"("b c", "a b", "Ġ a")"), "t.json");
  CHECK(encode(*strings, "abc abc") == Ids{0, 5, 8, 5});
  CHECK(strings->vocab_size() == 10);
  // ignore_merges: a piece that is itself in the vocabulary is one token, whatever the merges would make.
  auto whole = bpe_tokenizer_from_json(tiny_json(R"(["a", "b"])", R"("ignore_merges": true,)"), "t.json");
  CHECK(encode(*whole, "abc") == Ids{6});
  CHECK(encode(*ab_first, "abc") == Ids{4, 2});
  // Characters without a vocabulary entry are dropped when there is no unk_token, as HF does.
  CHECK(encode(*ab_first, "abxc") == Ids{4, 2});
}

TEST_CASE("BPE: added tokens are matched first, leftmost-longest, with lstrip; new ones get HF's ids") {
  const std::string added =
      R"({"id": 9, "content": "<|end|>", "single_word": false, "lstrip": true, "rstrip": false,
          "normalized": false, "special": true},
         {"id": 5000, "content": "<|end|>x", "single_word": false, "lstrip": false, "rstrip": false,
          "normalized": false, "special": true})";
  auto t = bpe_tokenizer_from_json(tiny_json(R"(["a", "b"])", "", added), "t.json");
  CHECK(encode(*t, "ab<|end|>ab") == Ids{4, 9, 4});
  CHECK(encode(*t, "ab  <|end|>ab") == Ids{4, 9, 4});  // lstrip takes the spaces before it
  // "<|end|>x" is not in the vocabulary: HF gives it the next id after the vocabulary's 10 entries, not 5000.
  CHECK(encode(*t, "a<|end|>xb") == Ids{0, 10, 1});
  CHECK(t->vocab_size() == 11);
  CHECK(encode(*t, "<|end|") == Ids{});  // a partial special token is ordinary text (here: no vocabulary entries)
}

TEST_CASE("decode: the text of ids, special tokens included, as Hugging Face's decode; byte-level ids are bytes") {
  const std::string added =
      R"({"id": 9, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false,
          "normalized": false, "special": true})";
  auto t = bpe_tokenizer_from_json(tiny_json(R"(["a", "b"], ["Ġ", "a"])", "", added), "t.json");
  for (const std::string text : {"ab a", "ab<|end|> abc", "c a ab"}) {
    CAPTURE(text);
    CHECK(t->decode(encode(*t, text)) == text);
  }
  CHECK(t->decode({3, 0, 9}) == " a<|end|>");  // Ġ is the space's byte
  CHECK(usage_error_of([&] { t->decode({0, 10}); }) == "t.json: token id 10 is outside its 10 ids");
  auto bytes = byte_level_tokenizer();
  const std::string text = "grüße, 世界\n\x01";
  CHECK(bytes->decode(encode(*bytes, text)) == text);
  CHECK(usage_error_of([&] { bytes->decode({256}); }).rfind("token id 256 is not a byte", 0) == 0);
}

TEST_CASE("BPE: a Sequence of Split and ByteLevel, as Llama 3 and Qwen files have") {
  const std::string pre = R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{L}{1,2}|\\s+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})";
  auto t = bpe_tokenizer_from_json(tiny_json(R"(["b", "c"], ["a", "b"])", "", "", pre), "t.json");
  CHECK(encode(*t, "abc") == Ids{4, 2});  // pieces "ab" and "c": the Split limits what merges can reach
  CHECK(encode(*t, "bc a") == Ids{5, 3, 0});
}

TEST_CASE("pre-tokenizer expressions mean what they mean to Oniguruma (Hugging Face tokenizers' engine)") {
  // Pieces as Python's tokenizers.pre_tokenizers.Split(Regex(pattern), "isolated") gives them, on both engines.
  CHECK(split_both(R"(\p{N}{1,3}+)", "1234567890 12") == Pieces{"1234567890", " ", "12"});  // not possessive
  CHECK(split_both(R"(\s+$|\S+|\s+)", "a  \nb  ") == Pieces{"a", "  ", "\n", "b", "  "});  // $: end of a line
  CHECK(split_both(R"(\s+)", "a\u0085b\u00a0\u200bc\u180e") ==
        Pieces{"a", "\u0085", "b", "\u00a0", "\u200bc\u180e"});  // White_Space: NEL, not U+180E as PCRE2's \s
  CHECK(split_both(R"( ?[^(\s|[.,!?…。，、।۔،])]+)", "hi, there(x)|y") ==
        Pieces{"hi", ",", " there", "(", "x", ")|", "y"});  // a nested class is a union
  CHECK(split_both("a{,2}", "aaab") == Pieces{"aa", "a", "b"});
  CHECK(split_both(R"(\d{2}?)", "12345") == Pieces{"12", "34", "5"});  // {n}? repeats {n} optionally
  CHECK(split_both("^a|b$", "ab\nab") == Pieces{"a", "b", "\n", "a", "b"});
  CHECK(split_both(".+", "a\rb\nc\u2028d") == Pieces{"a\rb", "\n", "c\u2028d"});
  CHECK(split_both("x*", "abxc") == Pieces{"a", "b", "x", "c"});  // empty matches split the text between matches
  // Left to Oniguruma (no translation): \h is a hexadecimal digit there; (?i)ss matches ß.
  const RegexSplitter hex(R"(\h+)", false, "t.json"), fold("(?i:'s|ss)", false, "t.json");
  CHECK(hex.engine() == RegexSplitter::Engine::oniguruma);
  CHECK(split(hex, "xyz 0aF g") == Pieces{"xyz ", "0aF", " g"});
  CHECK(fold.engine() == RegexSplitter::Engine::oniguruma);
  CHECK(fold.untranslated() == "'ss' under (?i) (a character folds to it) at offset 9");
  CHECK(split(fold, "'S 'ſ ß SS") == Pieces{"'S", " ", "'ſ", " ", "ß", " ", "SS"});
}

TEST_CASE("pre-tokenizer expressions: what is translated for PCRE2, and what is left to Oniguruma") {
  CHECK(pcre2_from_oniguruma(R"(\p{N}{1,3}+)").pattern == R"((?:\p{N}{1,3})+)");
  CHECK(pcre2_from_oniguruma(R"(\s+(?!\S)|x$)").pattern ==
        R"([\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}])|x(?![^\n]))");
  CHECK(pcre2_from_oniguruma(R"([^\r\n\p{L}\p{N}]?+)").pattern == R"([^\x{D}\x{A}\p{L}\p{N}]?+)");
  CHECK(pcre2_from_oniguruma("(?i:'s|[dm]\\.)").pattern == "(?i:\\'s|[\\x{64}\\x{6D}]\\.)");
  for (const auto& [construct, why] : std::vector<std::pair<std::string, std::string>>{
           {R"(\w+)", "\\w (not translated) at offset 2"},
           {R"(\p{Han})", "\\p{han} (only general categories are translated) at offset 7"},
           {"(?i:ß)", "a non-ASCII character under (?i) at offset 6"},
           {"[[:alpha:]]", "a POSIX bracket at offset 1"},
           {"[a-z&&[^aeiou]]", "a class intersection (&&) at offset 4"},
           {R"(\xFF)", "\\xHH past 7F (a byte, not a character, to Oniguruma) at offset 4"},
           {"a(?i)b", "(?i) after the start of the expression at offset 4"},
           {R"((a)\1)", "\\1 (not translated) at offset 5"}}) {
    const std::string shown_construct = construct;  // a copy: CAPTURE cannot capture a structured binding before C++20
    CAPTURE(shown_construct);
    CHECK(pcre2_from_oniguruma(construct).refused == why);
    CHECK(RegexSplitter(construct, false, "t.json").engine() == RegexSplitter::Engine::oniguruma);
  }
}

TEST_CASE("pre-tokenizer expressions of real tokenizer.json files: PCRE2 splits every code point as Oniguruma does") {
  const std::string text = every_code_point();
  for (const auto& [model, pattern] : real_expressions()) {
    const std::string shown_model = model;  // a copy: CAPTURE cannot capture a structured binding before C++20
    CAPTURE(shown_model);
    const RegexSplitter fast(pattern, false, "t.json");
    CHECK(fast.untranslated() == "");
    const RegexSplitter onig(pattern, false, "t.json", RegexSplitter::Engine::oniguruma);
    const Pieces want = split(onig, text), got = split(fast, text);
    std::size_t i = 0;  // the first piece that differs: Oniguruma's, then PCRE2's
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    CAPTURE(i);
    CHECK((i < want.size() ? want[i] : "(no more pieces)") == (i < got.size() ? got[i] : "(no more pieces)"));
  }
}

TEST_CASE("invalid UTF-8: valid runs are encoded as texts of their own, other bytes as a piece") {
  CHECK(valid_utf8_length("ab\xC3\xA9\xF0\x9F\x98\x80") == 8);
  CHECK(valid_utf8_length("ab\xC3") == 2);                // a truncated character
  CHECK(valid_utf8_length("\xC0\xAF") == 0);              // overlong
  CHECK(valid_utf8_length("\xED\xA0\x80") == 0);         // a surrogate
  CHECK(valid_utf8_length("\xF4\x90\x80\x80") == 0);     // past U+10FFFF
  CHECK(invalid_utf8_length("\xFF\x80\xE2\x82" "a") == 4);  // up to the 'a'
  CHECK(invalid_utf8_length("\xFF\xC3\xA9") == 1);        // é starts a character
  // The vocabulary has no entry for 0xFF (dropped, as HF drops what it cannot represent): "a" and "bc" are encoded
  // apart, so "a" does not merge with "b" across the invalid byte.
  auto t = bpe_tokenizer_from_json(tiny_json(R"(["a", "b"], ["b", "c"])"), "t.json");
  CHECK(encode(*t, "ab") == Ids{4});
  CHECK(encode(*t, "a\xFF" "bc") == Ids{0, 5});
}

TEST_CASE("BPE: every unsupported or malformed tokenizer.json is refused with the component named") {
  const std::string tail = "; fsdpp reads byte-level BPE tokenizer.json files (GPT-2, Llama 3, Qwen style) and "
                           "SentencePiece .model files";
  CHECK(usage_error_of([] { bpe_tokenizer_from_json("{\"model\": ", "bad.json"); }).rfind(
            "bad.json: not valid JSON (byte 11): ", 0) == 0);
  std::string json = tiny_json(R"(["a", "b"])");
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string j = json;
    j.replace(j.find(from), from.size(), to);
    return j;
  };
  CHECK(usage_error_of([&] {
          bpe_tokenizer_from_json(replaced("\"normalizer\": null", R"("normalizer": {"type": "NFKC"})"), "t.json");
        }) == "t.json: unsupported normalizer 'NFKC' (implemented: null, NFC, a Sequence of them)" + tail);
  CHECK(usage_error_of([&] {
          bpe_tokenizer_from_json(
              replaced("\"normalizer\": null", R"("normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKD"}]})"),
              "t.json");
        }) == "t.json: unsupported normalizer 'NFKD' (implemented: null, NFC, a Sequence of them)" + tail);
  // DeepSeek V3's empty Sequence normalizer is no normalization.
  CHECK(encode(*bpe_tokenizer_from_json(
            replaced("\"normalizer\": null", R"("normalizer": {"type": "Sequence", "normalizers": []})"), "t.json"),
               "ab") == Ids{4});
  CHECK(usage_error_of([&] {
          bpe_tokenizer_from_json(replaced("\"type\": \"ByteLevel\"", "\"type\": \"Metaspace\""), "t.json");
        }) == "t.json: unsupported pre_tokenizer 'Metaspace' (implemented: ByteLevel, or a Sequence of Split steps "
              "ending in ByteLevel)" + tail);
  CHECK(usage_error_of([&] {
          bpe_tokenizer_from_json(replaced("\"type\": \"BPE\"", "\"type\": \"WordPiece\""), "t.json");
        }) == "t.json: unsupported model type 'WordPiece' (only BPE is implemented)" + tail);
  CHECK(usage_error_of([&] { bpe_tokenizer_from_json(replaced("[\"a\", \"b\"]", "[\"a\", \"q\"]"), "t.json"); }) ==
        "t.json: merge 0 uses 'q', which is not in the vocabulary (a corrupt file?)" + tail);
  CHECK(usage_error_of([&] { bpe_tokenizer_from_json(replaced("[\"a\", \"b\"]", "\"a b c\""), "t.json"); }) ==
        "t.json: merge 0 'a b c' is not two tokens separated by one space" + tail);
  CHECK(usage_error_of([&] {
          bpe_tokenizer_from_json(tiny_json("", "", "", R"({"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated", "invert": false},
              {"type": "ByteLevel", "use_regex": false}]})"),
                                  "t.json");
        }) == "t.json: the pre_tokenizer's regular expression '(a' does not compile (Oniguruma, the engine of "
              "Hugging Face tokenizers): end pattern with unmatched parenthesis");
  CHECK(usage_error_of([&] {
          bpe_tokenizer_from_json(tiny_json("", "", "", R"({"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed", "invert": false},
              {"type": "ByteLevel", "use_regex": false}]})"),
                                  "t.json");
        }) == "t.json: unsupported Split behavior 'Removed' in pre_tokenizer (only 'Isolated' is implemented)" + tail);
  CHECK(usage_error_of([] { load_tokenizer("/no/such/tokenizer.json"); }) ==
        "/no/such/tokenizer.json: cannot open the tokenizer file: No such file or directory (--tokenizer takes a "
        "Hugging Face tokenizer.json or a SentencePiece .model)");
}

TEST_CASE("chunk boundaries: after a newline, before an ASCII letter or digit") {
  const std::string text = "ab\n cd\n\nEf\n9\n";
  CHECK(next_chunk_boundary(text, 0) == 8);  // not before " cd" or the empty line: "Ef" starts at 8
  CHECK(next_chunk_boundary(text, 8) == 8);
  CHECK(next_chunk_boundary(text, 9) == 11);
  CHECK(next_chunk_boundary(text, 12) == text.size());  // none: the end
  CHECK(next_chunk_boundary("", 0) == 0);
}

TEST_CASE("tokenize_file: any chunk size writes the same file as one chunk") {
  const auto dir = fs::temp_directory_path() /
                   fmt::format("fsdpp_test_tok_{}_{}", ::getpid(), std::chrono::steady_clock::now().time_since_epoch().count());
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 300; ++i) text += fmt::format("abc ab{}c  \n{}aab cab\n\n", i % 3 ? "" : " ", i % 7 ? "" : " ");
  std::ofstream((dir / "in.txt").string(), std::ios::binary) << text;
  std::ofstream((dir / "tok.json").string()) << tiny_json(R"(["b", "c"], ["a", "b"], ["Ġ", "a"], ["a", "a"])");
  TokenizeOptions one, small;
  one.tokenizer_path = small.tokenizer_path = (dir / "tok.json").string();
  small.chunk_bytes = 7;
  const auto a = tokenize_file(MPI_COMM_SELF, (dir / "in.txt").string(), (dir / "one.bin").string(), one);
  const auto b = tokenize_file(MPI_COMM_SELF, (dir / "in.txt").string(), (dir / "small.bin").string(), small);
  CHECK(a.tokens == b.tokens);
  CHECK(a.vocab_size == 10);
  CHECK(a.token_bytes == 2);
  CHECK(a.bytes == static_cast<std::int64_t>(text.size()));
  CHECK(load_tokens((dir / "one.bin").string(), 10) == load_tokens((dir / "small.bin").string(), 10));
  auto whole = bpe_tokenizer_from_json(tiny_json(R"(["b", "c"], ["a", "b"], ["Ġ", "a"], ["a", "a"])"), "t");
  CHECK(load_tokens((dir / "one.bin").string(), 10) == encode(*whole, text));
  CHECK(usage_error_of([&] {
          TokenizeOptions wide = one;
          wide.tokenizer_path = (dir / "nope.json").string();
          tokenize_file(MPI_COMM_SELF, (dir / "in.txt").string(), (dir / "x.bin").string(), wide);
        }).find("nope.json: cannot open the tokenizer file") != std::string::npos);
  fs::remove_all(dir);
}
