// Fuzz target: the token-file reader, load_tokens(path, format, vocab_size).
//
// Input: one control byte, then the file's bytes. The control byte's low two bits pick the format (0 and 3:
// GPT-2 .bin, 1: .u16, 2: .u32, through the extension, as a deck's data.source picks it); its next bits pick
// the vocabulary bound (0 = no check, 64, 50257, 65536). Contract: the tokens or an fsdpp::UsageError. On an
// accepted file: every token is below the bound, and the tokens survive save_tokens + load_tokens unchanged
// (for the formats that hold them).
#include "fuzz_common.hpp"

#include "fsdpp/data/token_file.hpp"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > 256 * 1024) return -1;
  static fsdpp::fuzz::ScratchFile bin(".bin"), u16(".u16"), u32(".u32"), out(".u32");
  const std::uint8_t control = data[0];
  static const std::int64_t vocabs[] = {0, 64, 50257, 65536};
  const std::int64_t vocab = vocabs[(control >> 2) & 3];
  fsdpp::fuzz::ScratchFile* const files[] = {&bin, &u16, &u32, &bin};
  const std::string& path = files[control & 3]->write(data + 1, size - 1);

  std::vector<std::uint32_t> tokens;
  try {
    tokens = fsdpp::load_tokens(path, vocab);
  } catch (const fsdpp::UsageError&) {
    return 0;
  }
  const fsdpp::TokenFormat format = fsdpp::token_format_for_path(path);
  const std::size_t elem = format == fsdpp::TokenFormat::raw_u32 ? 4 : 2;
  const std::size_t header = format == fsdpp::TokenFormat::gpt2_bin ? 1024 : 0;
  // A version-2 .bin holds 4-byte tokens.
  const std::size_t payload = size - 1 - header;
  FSDPP_FUZZ_ASSERT(tokens.size() * elem == payload || tokens.size() * 4 == payload,
                    "{} tokens from a {}-byte payload", tokens.size(), payload);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    FSDPP_FUZZ_ASSERT(vocab == 0 || tokens[i] < vocab, "token {} at {} passed vocab_size {}", tokens[i], i, vocab);

  fsdpp::save_tokens(out.path(), tokens);  // .u32 holds any token
  const std::vector<std::uint32_t> again = fsdpp::load_tokens(out.path(), vocab);
  FSDPP_FUZZ_ASSERT(again == tokens, "tokens differ after a save/load round trip ({} vs {})", again.size(),
                    tokens.size());
  return 0;
}
