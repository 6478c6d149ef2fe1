#pragma once
// Token files: training data on disk, loaded whole into host memory. Every rank loads the same file and the
// sampler (data/sampler.hpp) picks windows from it; nothing is memory-mapped, so a file may be deleted or
// rewritten while a run is going.
//
// Formats, chosen from the extension (token_format_for_path) or given explicitly:
//   .bin  llm.c (dev/data/data_common.py): a header of 256 little-endian int32 {magic, version, token count, 0,
//         ...}, then the tokens. {20240520, 1} = GPT-2, uint16 tokens; {20240801, 7} = Llama 3, uint32 tokens.
//         Writers pick uint16 while every token fits (vocabulary <= 65536), uint32 otherwise. The file must hold
//         exactly `count` tokens after the header.
//   .u16  raw little-endian uint16 array, no header
//   .u32  raw little-endian uint32 array, no header
//
// Every problem with a file is a UsageError (each rank sees the same file) that names the file and says what to
// do, since the path comes from the user's deck.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace fsdpp {

// A C stream closed when it goes out of scope: token files and the tokenizer's output are read and written
// through stdio in large chunks.
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Reads up to n bytes of `f` at byte `offset` into dst (fewer only at the end of the file); a failed seek or read is
// a UsageError naming `path`.
std::size_t read_file_at(std::FILE* f, const std::string& path, std::uint64_t offset, char* dst, std::size_t n);

enum class TokenFormat { gpt2_bin, raw_u16, raw_u32 };

inline constexpr std::int32_t kGpt2Magic = 20240520;  // version 1, uint16 tokens
inline constexpr std::int32_t kGpt2Version = 1;
inline constexpr std::int32_t kLlama3Magic = 20240801;  // version 7, uint32 tokens
inline constexpr std::int32_t kLlama3Version = 7;
inline constexpr int kGpt2HeaderInts = 256;  // 1024 bytes

const char* to_string(TokenFormat format);  // "GPT-2 .bin", "raw uint16 (.u16)", "raw uint32 (.u32)"

// .bin / .u16 / .u32 (case-sensitive); anything else is a UsageError listing the three.
TokenFormat token_format_for_path(const std::string& path);

// Loads every token and checks each is < vocab_size (vocab_size 0: no check; negative: UsageError).
std::vector<std::uint32_t> load_tokens(const std::string& path, TokenFormat format, std::int64_t vocab_size);
std::vector<std::uint32_t> load_tokens(const std::string& path, std::int64_t vocab_size);  // format from path

// Writes (replacing) the file. .bin takes the uint16 GPT-2 header while every token fits, else the uint32 Llama 3
// one. A token that does not fit .u16 is a UsageError naming its position; nothing is written then.
void save_tokens(const std::string& path, const std::vector<std::uint32_t>& tokens, TokenFormat format);
void save_tokens(const std::string& path, const std::vector<std::uint32_t>& tokens);  // format from path

// Bytes per token a file of `format` uses for a vocabulary of `vocab_size` ids (.bin: 2 up to 65536, else 4).
// .u16 with a vocabulary above 65536 is a UsageError naming `path` (use .bin or .u32).
int token_bytes_for(const std::string& path, TokenFormat format, std::int64_t vocab_size);

// The 1024-byte .bin header for `count` tokens of `token_bytes` (2: GPT-2, 4: Llama 3) each.
std::vector<unsigned char> gpt2_header(std::uint64_t count, int token_bytes);

// Little-endian token bytes, appended to `out`: the payload of every format.
void append_token_bytes(std::vector<unsigned char>& out, const std::vector<std::uint32_t>& tokens, int token_bytes);

}  // namespace fsdpp
