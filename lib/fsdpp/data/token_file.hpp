#pragma once
// Token files: training data on disk, loaded whole into host memory. Every rank loads the same file and the
// sampler (data/sampler.hpp) picks windows from it; nothing is memory-mapped, so a file may be deleted or
// rewritten while a run is going.
//
// Formats, chosen from the extension (token_format_for_path) or given explicitly:
//   .bin  GPT-2 / llm.c: a header of 256 little-endian int32 {20240520, version, token count, 0, ...}, then the
//         tokens. Version 1 = uint16 tokens (GPT-2, what save_tokens writes); version 2 = uint32 tokens (llm.c's
//         Llama 3 files), read for compatibility. The file must hold exactly `count` tokens after the header.
//   .u16  raw little-endian uint16 array, no header
//   .u32  raw little-endian uint32 array, no header
//
// Every problem with a file is a UsageError (each rank sees the same file) that names the file and says what to
// do, since the path comes from the user's deck.
#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

enum class TokenFormat { gpt2_bin, raw_u16, raw_u32 };

inline constexpr std::int32_t kGpt2Magic = 20240520;
inline constexpr int kGpt2HeaderInts = 256;  // 1024 bytes

const char* to_string(TokenFormat format);  // "GPT-2 .bin", "raw uint16 (.u16)", "raw uint32 (.u32)"

// .bin / .u16 / .u32 (case-sensitive); anything else is a UsageError listing the three.
TokenFormat token_format_for_path(const std::string& path);

// Loads every token and checks each is < vocab_size (vocab_size 0: no check; negative: UsageError).
std::vector<std::uint32_t> load_tokens(const std::string& path, TokenFormat format, std::int64_t vocab_size);
std::vector<std::uint32_t> load_tokens(const std::string& path, std::int64_t vocab_size);  // format from path

// Writes (replacing) the file. A token that does not fit the format's element (> 65535 for .bin / .u16) is a
// UsageError naming its position; nothing is written then.
void save_tokens(const std::string& path, const std::vector<std::uint32_t>& tokens, TokenFormat format);
void save_tokens(const std::string& path, const std::vector<std::uint32_t>& tokens);  // format from path

}  // namespace fsdpp
