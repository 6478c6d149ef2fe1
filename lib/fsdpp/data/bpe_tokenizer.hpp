#pragma once
// Byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama 3, Qwen, cl100k/o200k conversions, DeepSeek), token
// for token what the Python `tokenizers` package produces with add_special_tokens=False:
//   1. added tokens ("<|endoftext|>", ...) are matched first, leftmost-longest, on the raw text (lstrip/rstrip
//      honoured) and become their ids; the text between them is NFC-normalized (ICU) if the file's normalizer is
//      NFC (Qwen), and tokenized as follows;
//   2. pre-tokenization: a Sequence of Split(regex, "Isolated") steps and a final ByteLevel, or a ByteLevel alone
//      (with use_regex, GPT-2's expression); the expressions mean what they mean to Oniguruma, the engine of
//      `tokenizers` (regex_splitter.hpp: on PCRE2's JIT where they translate, else on Oniguruma);
//   3. each piece's bytes map to printable code points (GPT-2's bytes_to_unicode) and BPE merges them by rank,
//      lowest first, leftmost among equals (ignore_merges: a piece that is itself in the vocabulary is one token).
// Text that is not valid UTF-8, which `tokenizers` cannot take, is cut into runs: each valid run is tokenized as a
// text of its own, and each run of bytes that starts no character is one piece (its bytes, BPE-merged).
// The normalizer must be null, NFC or a Sequence of those, the model BPE without dropout, subword prefix/suffix or
// byte fallback; anything else is refused with a UsageError naming the component. Post-processors (a BOS template)
// are not applied by encode(); a TemplateProcessing's leading special token is bos_id(), which corpus mode adds.
// A per-piece cache makes repeated words cost one hash lookup.
#include "fsdpp/data/tokenizer.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace fsdpp {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes map to U+0100.. in
// byte order. A bijection of the 256 bytes onto 256 code points.
const std::array<char32_t, 256>& byte_to_unicode();
// The UTF-8 of bytes' code points under byte_to_unicode ("hello world" -> "helloĠworld").
std::string byte_level_string(std::string_view bytes);

// The tokenizer described by `json_text`, the content of a tokenizer.json; `origin` (its path) prefixes errors.
std::unique_ptr<Tokenizer> bpe_tokenizer_from_json(std::string_view json_text, const std::string& origin);

}  // namespace fsdpp
