#include "fsdpp/data/token_file.hpp"

#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

namespace fsdpp {

std::size_t read_file_at(std::FILE* f, const std::string& path, std::uint64_t offset, char* dst, std::size_t n) {
  errno = 0;
  if (fseeko(f, static_cast<off_t>(offset), SEEK_SET) != 0)
    throw UsageError(fmt::format("{}: cannot seek to byte {}: {}", path, offset, std::strerror(errno)));
  const std::size_t got = std::fread(dst, 1, n, f);
  if (got < n && std::ferror(f)) throw UsageError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
  return got;
}
namespace {

constexpr std::size_t kHeaderBytes = kGpt2HeaderInts * 4;
constexpr std::size_t kChunkTokens = std::size_t{1} << 20;  // bounds the staging buffer at 4 MiB

// Decoded byte by byte so the files mean the same on any host, whatever its byte order.
std::uint32_t read_le(const unsigned char* p, int bytes) {
  std::uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void write_le(unsigned char* p, std::uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

std::string extension_hint() {
  return "use .bin (GPT-2/llm.c, with header), .u16 or .u32 (raw little-endian arrays)";
}

File open_for_read(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError(fmt::format("{}: is a directory, not a token file", path));
  errno = 0;
  File f(std::fopen(path.c_str(), "rb"));
  if (!f)
    throw UsageError(fmt::format("{}: cannot open token file: {} (check the path; 'fsdpp tokenize <text> <out.bin>' "
                                 "makes a token file from any text)",
                                 path, std::strerror(errno)));
  return f;
}

std::uint64_t file_size(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw UsageError(fmt::format("{}: cannot read the file size: {}", path, ec.message()));
  return size;
}

void read_exact(std::FILE* f, const std::string& path, unsigned char* dst, std::size_t bytes) {
  errno = 0;
  if (std::fread(dst, 1, bytes, f) != bytes)
    throw UsageError(fmt::format("{}: read failed: {}", path,
                                 std::ferror(f) && errno ? std::strerror(errno) : "unexpected end of file"));
}

// Reads `count` tokens of `elem_bytes` each from the current position, checking each against the vocabulary.
std::vector<std::uint32_t> read_tokens(std::FILE* f, const std::string& path, int elem_bytes, std::uint64_t count,
                                       std::int64_t vocab_size) {
  std::vector<std::uint32_t> tokens(count);
  std::vector<unsigned char> buf(std::min<std::uint64_t>(count, kChunkTokens) * elem_bytes);
  for (std::uint64_t start = 0; start < count; start += kChunkTokens) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunkTokens, count - start));
    read_exact(f, path, buf.data(), n * elem_bytes);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t t = read_le(buf.data() + i * elem_bytes, elem_bytes);
      if (vocab_size > 0 && t >= static_cast<std::uint64_t>(vocab_size))
        throw UsageError(fmt::format("{}: token {} at position {} is outside the vocabulary (vocab_size {}); the "
                                     "file was made for a larger vocabulary: raise the model's vocab_size above {} "
                                     "or re-tokenize the data",
                                     path, t, start + i, vocab_size, t));
      tokens[start + i] = t;
    }
  }
  return tokens;
}

std::vector<std::uint32_t> load_gpt2_bin(const std::string& path, std::int64_t vocab_size) {
  File f = open_for_read(path);
  const std::uint64_t size = file_size(path);
  unsigned char header[kHeaderBytes];
  const std::size_t head = static_cast<std::size_t>(std::min<std::uint64_t>(size, kHeaderBytes));
  read_exact(f.get(), path, header, head);
  auto header_int = [&](int i) { return static_cast<std::int32_t>(read_le(header + 4 * i, 4)); };
  // The magic is checked first even in a short file: a raw array misnamed .bin is the likelier mistake.
  if (head >= 4 && header_int(0) != kGpt2Magic && header_int(0) != kLlama3Magic)
    throw UsageError(fmt::format("{}: not a GPT-2 token file: magic {}, expected {} (or {} for uint32 tokens; raw "
                                 "token arrays need the extension .u16 or .u32)",
                                 path, header_int(0), kGpt2Magic, kLlama3Magic));
  if (head < kHeaderBytes)
    throw UsageError(fmt::format("{}: truncated GPT-2 token file: {} bytes, shorter than its {}-byte header", path,
                                 size, kHeaderBytes));
  const std::int32_t magic = header_int(0), version = header_int(1);
  const std::int32_t expected_version = magic == kGpt2Magic ? kGpt2Version : kLlama3Version;
  if (version != expected_version)
    throw UsageError(fmt::format("{}: unsupported {} token file version {} (llm.c's formats: magic {} version {} = "
                                 "uint16 tokens, magic {} version {} = uint32 tokens); re-create the file with "
                                 "'fsdpp tokenize' or llm.c's scripts",
                                 path, magic == kGpt2Magic ? "GPT-2" : "Llama 3", version, kGpt2Magic, kGpt2Version,
                                 kLlama3Magic, kLlama3Version));
  const int elem = magic == kGpt2Magic ? 2 : 4;
  const std::int32_t declared = header_int(2);
  if (declared < 0)
    throw UsageError(fmt::format("{}: corrupt GPT-2 token file: negative token count {} in the header", path,
                                 declared));
  const std::uint64_t payload = size - kHeaderBytes;
  const std::uint64_t held = payload / elem, stray = payload % elem;
  if (held != static_cast<std::uint64_t>(declared) || stray != 0)
    throw UsageError(fmt::format("{}: GPT-2 token file header says {} tokens but the file holds {}{} ({}; "
                                 "re-create the file)",
                                 path, declared, held, stray ? fmt::format(" and {} stray byte(s)", stray) : "",
                                 held < static_cast<std::uint64_t>(declared) ? "truncated?" : "corrupt header?"));
  return read_tokens(f.get(), path, elem, held, vocab_size);
}

std::vector<std::uint32_t> load_raw(const std::string& path, int elem, std::int64_t vocab_size) {
  File f = open_for_read(path);
  const std::uint64_t size = file_size(path);
  if (size % elem != 0)
    throw UsageError(fmt::format("{}: size {} bytes is not a multiple of {}, so the file is not a raw uint{} token "
                                 "array (wrong extension, or a truncated file?)",
                                 path, size, elem, 8 * elem));
  return read_tokens(f.get(), path, elem, size / elem, vocab_size);
}

}  // namespace

const char* to_string(TokenFormat format) {
  switch (format) {
    case TokenFormat::gpt2_bin: return "GPT-2 .bin";
    case TokenFormat::raw_u16: return "raw uint16 (.u16)";
    case TokenFormat::raw_u32: return "raw uint32 (.u32)";
  }
  return "?";
}

TokenFormat token_format_for_path(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".bin") return TokenFormat::gpt2_bin;
  if (ext == ".u16") return TokenFormat::raw_u16;
  if (ext == ".u32") return TokenFormat::raw_u32;
  throw UsageError(fmt::format("{}: unknown token file extension '{}': {}", path, ext, extension_hint()));
}

std::vector<std::uint32_t> load_tokens(const std::string& path, TokenFormat format, std::int64_t vocab_size) {
  FSDPP_REQUIRE(vocab_size >= 0, "{}: vocab_size must be positive (or 0 for no check), got {}", path, vocab_size);
  switch (format) {
    case TokenFormat::gpt2_bin: return load_gpt2_bin(path, vocab_size);
    case TokenFormat::raw_u16: return load_raw(path, 2, vocab_size);
    case TokenFormat::raw_u32: return load_raw(path, 4, vocab_size);
  }
  throw UsageError(fmt::format("{}: unknown token format", path));
}

std::vector<std::uint32_t> load_tokens(const std::string& path, std::int64_t vocab_size) {
  return load_tokens(path, token_format_for_path(path), vocab_size);
}

int token_bytes_for(const std::string& path, TokenFormat format, std::int64_t vocab_size) {
  const bool fits16 = vocab_size <= 65536;
  switch (format) {
    case TokenFormat::gpt2_bin: return fits16 ? 2 : 4;
    case TokenFormat::raw_u32: return 4;
    case TokenFormat::raw_u16:
      if (!fits16)
        throw UsageError(fmt::format("{}: a vocabulary of {} ids does not fit the 16-bit {} format; write .bin "
                                     "(uint32 tokens under llm.c's Llama 3 header) or .u32",
                                     path, vocab_size, to_string(format)));
      return 2;
  }
  return 4;
}

std::vector<unsigned char> gpt2_header(std::uint64_t count, int token_bytes) {
  std::vector<unsigned char> header(kHeaderBytes, 0);
  const bool wide = token_bytes == 4;
  write_le(header.data() + 0, static_cast<std::uint32_t>(wide ? kLlama3Magic : kGpt2Magic), 4);
  write_le(header.data() + 4, static_cast<std::uint32_t>(wide ? kLlama3Version : kGpt2Version), 4);
  write_le(header.data() + 8, static_cast<std::uint32_t>(count), 4);
  return header;
}

void append_token_bytes(std::vector<unsigned char>& out, const std::vector<std::uint32_t>& tokens, int token_bytes) {
  const std::size_t at = out.size();
  out.resize(at + tokens.size() * token_bytes);
  for (std::size_t i = 0; i < tokens.size(); ++i) write_le(out.data() + at + i * token_bytes, tokens[i], token_bytes);
}

void save_tokens(const std::string& path, const std::vector<std::uint32_t>& tokens, TokenFormat format) {
  const std::uint32_t largest = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  const int elem = format == TokenFormat::raw_u32 || (format == TokenFormat::gpt2_bin && largest > 0xFFFF) ? 4 : 2;
  // Checked before the file is opened, so a failed save leaves no partial file behind.
  if (elem == 2) {
    const auto it = std::find_if(tokens.begin(), tokens.end(), [](std::uint32_t t) { return t > 0xFFFF; });
    if (it != tokens.end())
      throw UsageError(fmt::format("{}: token {} at position {} does not fit the 16-bit {} format; use .u32", path,
                                   *it, it - tokens.begin(), to_string(format)));
  }
  if (format == TokenFormat::gpt2_bin && tokens.size() > 0x7FFFFFFFull)
    throw UsageError(fmt::format("{}: {} tokens exceed the GPT-2 .bin header's int32 count; use .u16 or .u32, or "
                                 "split the data into shards",
                                 path, tokens.size()));
  errno = 0;
  File f(std::fopen(path.c_str(), "wb"));
  if (!f) throw UsageError(fmt::format("{}: cannot write token file: {}", path, std::strerror(errno)));
  auto write = [&](const unsigned char* p, std::size_t n) {
    errno = 0;
    if (std::fwrite(p, 1, n, f.get()) != n)
      throw UsageError(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
  };
  if (format == TokenFormat::gpt2_bin) {
    const auto header = gpt2_header(tokens.size(), elem);
    write(header.data(), header.size());
  }
  std::vector<unsigned char> buf(std::min(tokens.size(), kChunkTokens) * elem);
  for (std::size_t start = 0; start < tokens.size(); start += kChunkTokens) {
    const std::size_t n = std::min(kChunkTokens, tokens.size() - start);
    for (std::size_t i = 0; i < n; ++i) write_le(buf.data() + i * elem, tokens[start + i], elem);
    write(buf.data(), n * elem);
  }
  std::FILE* raw = f.release();
  errno = 0;
  if (std::fclose(raw) != 0) throw UsageError(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
}

void save_tokens(const std::string& path, const std::vector<std::uint32_t>& tokens) {
  save_tokens(path, tokens, token_format_for_path(path));
}

}  // namespace fsdpp
