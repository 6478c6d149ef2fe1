#include "fsdpp/ckpt/safetensors.hpp"

#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/bf16.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

// Data bytes are copied straight into host floats and integers.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace fsdpp {
namespace {

using json = nlohmann::json;

constexpr const char* kCorrupt = "; the file is corrupt or not a safetensors file";
// The reference implementation refuses larger headers; without a cap a forged length would make us allocate
// as much as the file's size.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

std::uint64_t element_size(const std::string& dtype) {
  static const std::map<std::string, std::uint64_t> sizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2},
                                                             {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
                                                             {"U8", 1},  {"BOOL", 1}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// Byte size of a tensor, or false when the product overflows 64 bits (a forged shape must not wrap around
// to a small size that then passes the offset check).
bool byte_size(const std::vector<std::int64_t>& shape, std::uint64_t elem, std::uint64_t& out) {
  std::uint64_t n = elem;
  for (const std::int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return false;
  out = n;
  return true;
}

SafetensorInfo parse_entry(const std::string& path, const std::string& name, const json& v) {
  const auto fail = [&](const std::string& what) {
    return UsageError(fmt::format("{}: tensor '{}': {}{}", path, name, what, kCorrupt));
  };
  if (!v.is_object()) throw fail("the header entry is not a JSON object");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) throw fail(fmt::format("missing \"{}\"", field));
  SafetensorInfo t;
  t.name = name;
  const json& dtype = v["dtype"];
  if (!dtype.is_string()) throw fail("\"dtype\" must be a string");
  t.dtype = dtype.get<std::string>();
  const json& shape = v["shape"];
  if (!shape.is_array()) throw fail("\"shape\" must be an array of integers");
  for (const json& d : shape) {
    if (!d.is_number_integer()) throw fail("\"shape\" must be an array of integers");
    // Dimensions past int64 would turn negative on conversion; no real tensor has them.
    if (d.is_number_unsigned() && d.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
      throw fail("\"shape\" has a dimension too large for a 64-bit signed integer");
    t.shape.push_back(d.get<std::int64_t>());
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw fail("\"data_offsets\" must be an array of two non-negative integers");
  t.begin = off[0].get<std::uint64_t>();
  t.end = off[1].get<std::uint64_t>();
  for (const std::int64_t d : t.shape)
    if (d < 0) throw fail(fmt::format("shape {} has a negative dimension", shape_str(t.shape)));
  const std::uint64_t elem = element_size(t.dtype);
  if (elem == 0)
    throw fail(fmt::format("unknown dtype \"{}\" (known: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)", t.dtype));
  return t;
}

// Checks that need the data section's size: bounds, then that the shape fills the range exactly.
void check_range(const std::string& path, const SafetensorInfo& t, std::uint64_t data_size) {
  const auto fail = [&](const std::string& what) {
    return UsageError(fmt::format("{}: tensor '{}': {}{}", path, t.name, what, kCorrupt));
  };
  const std::string offs = fmt::format("data_offsets [{}, {}]", t.begin, t.end);
  if (t.begin > t.end) throw fail(offs + " begin after they end");
  if (t.end > data_size) throw fail(fmt::format("{} run past the end of the {}-byte data section", offs, data_size));
  std::uint64_t bytes = 0;
  if (!byte_size(t.shape, element_size(t.dtype), bytes))
    throw fail(fmt::format("shape {} of {} is too large: its byte size overflows 64 bits", shape_str(t.shape),
                           t.dtype));
  if (bytes != t.end - t.begin)
    throw fail(fmt::format("shape {} of {} needs {} bytes but {} span {}", shape_str(t.shape), t.dtype, bytes, offs,
                           t.end - t.begin));
}

// The header's bytes: the 8-byte little-endian length, checked against the file's `size` and the limit, then that
// many bytes. `file` is left at the start of the data.
std::string read_header_text(std::ifstream& file, const std::string& path, std::uint64_t size) {
  FSDPP_REQUIRE(size >= 8,
                "{}: {} bytes is too short for a safetensors file, which starts with an 8-byte header length; the "
                "file is truncated or not a safetensors file",
                path, size);
  unsigned char len_bytes[8];
  file.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  FSDPP_REQUIRE(n <= size - 8,
                "{}: safetensors header length {} exceeds the {} bytes after the length field; the file is truncated "
                "or not a safetensors file",
                path, n, size - 8);
  FSDPP_REQUIRE(n <= kMaxHeaderBytes, "{}: safetensors header length {} exceeds the {}-byte limit{}", path, n,
                kMaxHeaderBytes, kCorrupt);
  std::string text(n, '\0');
  file.read(text.data(), static_cast<std::streamsize>(n));
  FSDPP_REQUIRE(file.good(), "{}: reading the {}-byte safetensors header failed; check the file", path, n);
  return text;
}

// The header as a JSON object, refusing duplicate keys.
json parse_header(const std::string& path, const std::string& text) {
  json header;
  // JSON leaves duplicate keys undefined and nlohmann keeps the last one silently: a tensor listed twice (or an
  // entry with two "data_offsets") would be read from whichever copy the parser kept. Refuse them instead.
  std::vector<std::set<std::string>> open_objects;
  std::string entry, duplicate;
  const json::parser_callback_t find_duplicates = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == json::parse_event_t::key && !open_objects.empty()) {
      const std::string key = parsed.get<std::string>();
      if (open_objects.size() == 1) entry = key;
      if (!open_objects.back().insert(key).second && duplicate.empty())
        duplicate = open_objects.size() == 1 ? fmt::format("key '{}' appears twice in the header", key)
                                             : fmt::format("key '{}' appears twice in the entry of '{}'", key, entry);
    }
    return true;
  };
  try {
    header = json::parse(text, find_duplicates);
  } catch (const json::exception& e) {
    // Not only parse_error: a number too large for a double ("1e999") is an out_of_range (found by fuzzing,
    // tests/fuzz/regressions/safetensors/).
    throw UsageError(fmt::format("{}: safetensors header is not valid JSON: {}{}", path, e.what(), kCorrupt));
  }
  FSDPP_REQUIRE(duplicate.empty(), "{}: {}; which one is meant is ambiguous{}", path, duplicate, kCorrupt);
  FSDPP_REQUIRE(header.is_object(), "{}: safetensors header is a JSON {}, not an object{}", path, header.type_name(),
                kCorrupt);
  return header;
}

// "__metadata__": an object of string values, copied into `metadata`.
void read_metadata(const std::string& path, const json& value, std::map<std::string, std::string>& metadata) {
  bool ok = value.is_object();
  for (const auto& [mk, mv] : value.items()) {
    if (!ok || !mv.is_string()) {
      ok = false;
      break;
    }
    metadata[mk] = mv.get<std::string>();
  }
  FSDPP_REQUIRE(ok, "{}: \"__metadata__\" must be an object of string values{}", path, kCorrupt);
}

// `tensors` in data-offset order: empty ranges hold no bytes, so they overlap nothing; among the rest, a range must
// start at or after the furthest end seen so far.
void check_no_overlap(const std::string& path, const std::vector<SafetensorInfo>& tensors) {
  const SafetensorInfo* furthest = nullptr;
  for (const SafetensorInfo& t : tensors) {
    if (t.begin == t.end) continue;
    FSDPP_REQUIRE(furthest == nullptr || t.begin >= furthest->end,
                  "{}: tensors '{}' (data_offsets [{}, {}]) and '{}' (data_offsets [{}, {}]) overlap{}", path,
                  furthest ? furthest->name : "", furthest ? furthest->begin : 0, furthest ? furthest->end : 0, t.name,
                  t.begin, t.end, kCorrupt);
    if (furthest == nullptr || t.end > furthest->end) furthest = &t;
  }
}

}  // namespace

float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);  // inf, or NaN with its payload kept (still non-zero)
  } else if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float since every binary16 subnormal is a normal float.
    const float f = std::ldexp(static_cast<float>(mant), -24);
    std::memcpy(&u, &f, sizeof u);
    u |= sign;
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  file_.open(path, std::ios::binary);
  FSDPP_REQUIRE(file_.is_open(), "{}: cannot open the safetensors file ({}); check the path and its permissions",
                path, std::strerror(errno));
  file_.seekg(0, std::ios::end);
  const std::uint64_t size = static_cast<std::uint64_t>(file_.tellg());
  file_.seekg(0);
  const std::string text = read_header_text(file_, path, size);
  const json header = parse_header(path, text);
  data_start_ = 8 + text.size();
  data_size_ = size - data_start_;

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      read_metadata(path, value, metadata_);
      continue;
    }
    tensors_.push_back(parse_entry(path, key, value));
    check_range(path, tensors_.back(), data_size_);
  }

  // Name breaks ties so that empty tensors sharing an offset come out in a reproducible order.
  std::sort(tensors_.begin(), tensors_.end(), [](const SafetensorInfo& a, const SafetensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  check_no_overlap(path, tensors_);
  for (std::size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const SafetensorInfo* SafetensorsReader::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> SafetensorsReader::read_f32(const SafetensorInfo& t) const {
  const std::uint64_t elem = element_size(t.dtype);
  FSDPP_REQUIRE(t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16",
                "{}: tensor '{}' has dtype {}; only F32, F16 and BF16 tensors can be read as f32", path_, t.name,
                t.dtype);
  // The caller may hand in an info that did not come from this file: never let it steer a read out of bounds.
  FSDPP_REQUIRE(t.begin <= t.end && t.end <= data_size_ && (t.end - t.begin) % elem == 0,
                "{}: tensor '{}' with data_offsets [{}, {}] does not fit the {}-byte data section; pass an entry "
                "from this reader's tensors()",
                path_, t.name, t.begin, t.end, data_size_);
  const std::size_t count = static_cast<std::size_t>((t.end - t.begin) / elem);
  std::vector<float> out(count);
  file_.clear();
  file_.seekg(static_cast<std::streamoff>(data_start_ + t.begin));
  if (t.dtype == "F32") {
    file_.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * 4));
  } else {
    std::vector<std::uint16_t> raw(count);
    file_.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(count * 2));
    if (t.dtype == "F16")
      for (std::size_t i = 0; i < count; ++i) out[i] = f16_to_float(raw[i]);
    else
      for (std::size_t i = 0; i < count; ++i) out[i] = bf16::from_bits(raw[i]).to_float();
  }
  FSDPP_CHECK(file_.good(), "{}: reading tensor '{}' failed (was the file changed after it was opened?)", path_,
              t.name);
  return out;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::map<std::string, std::string> metadata)
    : path_(path), metadata_(std::move(metadata)) {
  file_.open(path, std::ios::binary | std::ios::trunc);
  FSDPP_REQUIRE(file_.is_open(), "{}: cannot open for writing ({}); check the directory exists and is writable",
                path, std::strerror(errno));
}

void SafetensorsWriter::declare(const std::string& name, const std::vector<std::int64_t>& shape,
                                const std::string& dtype) {
  FSDPP_REQUIRE(!header_written_, "{}: tensor '{}' declared after writing began; declare every tensor first", path_,
                name);
  FSDPP_REQUIRE(name != "__metadata__", "{}: \"__metadata__\" is reserved and cannot name a tensor", path_);
  FSDPP_REQUIRE(index_.count(name) == 0, "{}: tensor '{}' is declared twice; tensor names must be unique", path_,
                name);
  FSDPP_REQUIRE(dtype == "F32" || dtype == "BF16",
                "{}: tensor '{}': cannot write dtype \"{}\"; use \"F32\" or \"BF16\"", path_, name, dtype);
  for (const std::int64_t d : shape)
    FSDPP_REQUIRE(d >= 0, "{}: tensor '{}': shape {} has a negative dimension", path_, name, shape_str(shape));
  std::uint64_t bytes = 0;
  FSDPP_REQUIRE(byte_size(shape, element_size(dtype), bytes) && !__builtin_add_overflow(data_size_, bytes, &bytes),
                "{}: tensor '{}': shape {} is too large to write", path_, name, shape_str(shape));
  index_[name] = declared_.size();
  declared_.push_back(SafetensorInfo{name, dtype, shape, data_size_, bytes});
  data_size_ = bytes;
}

void SafetensorsWriter::write_header() {
  // ordered_json keeps the declared order, so the header lists tensors as they lie in the data section.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  for (const SafetensorInfo& t : declared_)
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", nlohmann::ordered_json::array({t.begin, t.end})}};
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: cannot write the safetensors header ({}); tensor names and metadata must be "
                                 "valid UTF-8",
                                 path_, e.what()));
  }
  // The reference implementation pads with spaces so the data section starts 8-byte aligned for mmap readers.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(std::uint64_t(text.size()) >> (8 * i));
  file_.write(reinterpret_cast<const char*>(len_bytes), 8);
  file_.write(text.data(), static_cast<std::streamsize>(text.size()));
  header_written_ = true;
}

void SafetensorsWriter::write(const std::string& name, const float* data, std::size_t count) {
  FSDPP_REQUIRE(!finished_, "{}: write('{}') after finish()", path_, name);
  const auto it = index_.find(name);
  FSDPP_REQUIRE(it != index_.end(), "{}: tensor '{}' was never declared; declare it before the first write", path_,
                name);
  FSDPP_REQUIRE(it->second == next_,
                "{}: tensor '{}' written out of order; expected '{}' next (write in declared order)", path_, name,
                next_ < declared_.size() ? declared_[next_].name : std::string("nothing: all written"));
  const SafetensorInfo& t = declared_[next_];
  const std::uint64_t elem = element_size(t.dtype);
  FSDPP_REQUIRE(count == (t.end - t.begin) / elem, "{}: tensor '{}' of shape {} needs {} values, got {}", path_, name,
                shape_str(t.shape), (t.end - t.begin) / elem, count);
  if (!header_written_) write_header();
  if (t.dtype == "F32") {
    file_.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(count * sizeof(float)));
  } else {
    // Converted in chunks, so the extra memory stays small whatever the tensor's size.
    std::vector<std::uint16_t> chunk(std::min<std::size_t>(count, 1 << 16));
    for (std::size_t i = 0; i < count; i += chunk.size()) {
      const std::size_t n = std::min(chunk.size(), count - i);
      for (std::size_t j = 0; j < n; ++j) chunk[j] = bf16::from_float(data[i + j]).bits;
      file_.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(n * 2));
    }
  }
  FSDPP_CHECK(file_.good(), "{}: writing tensor '{}' failed; check free disk space", path_, name);
  ++next_;
}

void SafetensorsWriter::finish() {
  FSDPP_REQUIRE(!finished_, "{}: finish() called twice", path_);
  FSDPP_REQUIRE(next_ == declared_.size(),
                "{}: finish() with {} of {} declared tensors unwritten (next: '{}'); write every declared tensor first",
                path_, declared_.size() - next_, declared_.size(),
                next_ < declared_.size() ? declared_[next_].name : "");
  if (!header_written_) write_header();  // no tensors declared: still a valid (empty) file
  file_.flush();
  file_.close();
  FSDPP_CHECK(!file_.fail(), "{}: flushing the safetensors file failed; check free disk space", path_);
  finished_ = true;
}

}  // namespace fsdpp
