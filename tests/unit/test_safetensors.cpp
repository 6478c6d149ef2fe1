// safetensors reader and writer: round trips through our writer, plus files assembled byte by byte here, so
// the reader is checked against the format itself and not only against our own writer.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/ckpt/safetensors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/bf16.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

using fsdpp::bf16;
using fsdpp::SafetensorsReader;
using fsdpp::SafetensorsWriter;
using fsdpp::UsageError;

namespace {

using fsdpp::test::write_bytes;

const std::string kCorrupt = "; the file is corrupt or not a safetensors file";

// A unique temporary path, removed when the test ends.
struct TempPath {
  std::string path;
  TempPath() {
    static int counter = 0;
    path = (std::filesystem::temp_directory_path() /
            ("fsdpp_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".safetensors"))
               .string();
  }
  ~TempPath() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file: length, header text as given, then `data_bytes` zero bytes of data.
std::string st_bytes(const std::string& header, std::size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// The reader must reject `bytes` with exactly `message` (after the "<path>: " prefix).
void check_rejects(const std::string& bytes, const std::string& message) {
  TempPath tmp;
  write_bytes(tmp.path, bytes);
  CHECK_THROWS_WITH_AS(SafetensorsReader{tmp.path}, (tmp.path + ": " + message).c_str(), UsageError);
}

// One tensor entry with a header around it: `entry` is the JSON of the tensor's fields.
std::string one_tensor(const std::string& entry) { return "{\"t\":{" + entry + "}}"; }

}  // namespace

TEST_CASE("safetensors: F32 and BF16 round trip through the writer") {
  TempPath tmp;
  const std::vector<float> a = {1.0f, -2.5f, 3.14159265f, 1e-30f, -0.0f, 65504.0f};
  const std::vector<float> b = {1.0f, 1.00390625f, 1.01171875f, 3.14159265f, -1e20f,
                                std::numeric_limits<float>::infinity()};  // ties round to even, both ways
  const std::vector<float> empty;
  {
    SafetensorsWriter w(tmp.path, {});
    w.declare("a", {2, 3}, "F32");
    w.declare("b", {6}, "BF16");
    w.declare("empty", {0, 4}, "F32");
    w.write("a", a.data(), a.size());
    w.write("b", b.data(), b.size());
    w.write("empty", empty.data(), 0);
    w.finish();
  }
  SafetensorsReader r(tmp.path);
  REQUIRE(r.tensors().size() == 3);
  CHECK(r.tensors()[0].name == "a");
  CHECK(r.tensors()[1].name == "b");
  CHECK(r.tensors()[1].shape == std::vector<std::int64_t>{6});
  CHECK(r.tensors()[1].begin == 24);
  CHECK(r.tensors()[1].end == 36);
  REQUIRE(r.find("a") != nullptr);
  CHECK(r.find("missing") == nullptr);
  const std::vector<float> ra = r.read_f32(*r.find("a"));
  REQUIRE(ra.size() == a.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(std::memcmp(&ra[i], &a[i], 4) == 0);
  const std::vector<float> rb = r.read_f32(*r.find("b"));
  REQUIRE(rb.size() == b.size());
  for (std::size_t i = 0; i < b.size(); ++i) CHECK(rb[i] == bf16::from_float(b[i]).to_float());
  CHECK(rb[1] == 1.0f);          // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1
  CHECK(rb[2] == 1.015625f);     // 1 + 3 * 2^-8 is halfway: ties up to the even 1 + 2^-6
  CHECK(r.read_f32(*r.find("empty")).empty());
}

TEST_CASE("safetensors: metadata round trip and the reference header layout") {
  TempPath tmp;
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"source", "fsdpp \"quoted\" \xc3\xa9"}};
  const std::vector<float> x = {1, 2, 3};
  {
    SafetensorsWriter w(tmp.path, meta);
    w.declare("x", {3}, "F32");
    w.write("x", x.data(), 3);
    w.finish();
  }
  SafetensorsReader r(tmp.path);
  CHECK(r.metadata() == meta);
  std::ifstream f(tmp.path, std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  CHECK(n % 8 == 0);  // data section 8-byte aligned
  CHECK(std::filesystem::file_size(tmp.path) == 8 + n + 12);
}

TEST_CASE("safetensors: the writer refuses misuse") {
  TempPath tmp;
  const std::vector<float> x = {1, 2};
  SafetensorsWriter w(tmp.path, {});
  w.declare("x", {2}, "F32");
  w.declare("y", {2}, "BF16");
  CHECK_THROWS_AS(w.declare("x", {1}, "F32"), UsageError);
  CHECK_THROWS_AS(w.declare("z", {1}, "F16"), UsageError);
  CHECK_THROWS_AS(w.declare("z", {-1}, "F32"), UsageError);
  CHECK_THROWS_AS(w.write("y", x.data(), 2), UsageError);  // out of order
  CHECK_THROWS_AS(w.write("x", x.data(), 1), UsageError);  // wrong count
  w.write("x", x.data(), 2);
  CHECK_THROWS_AS(w.declare("z", {1}, "F32"), UsageError);  // after writing began
  CHECK_THROWS_WITH_AS(w.finish(),
                       (tmp.path + ": finish() with 1 of 2 declared tensors unwritten (next: 'y'); write every "
                                   "declared tensor first").c_str(),
                       UsageError);
}

TEST_CASE("safetensors: f16_to_float decodes known bit patterns") {
  using fsdpp::f16_to_float;
  CHECK(f16_to_float(0x3C00) == 1.0f);
  CHECK(f16_to_float(0xC000) == -2.0f);
  CHECK(f16_to_float(0x7BFF) == 65504.0f);
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(f16_to_float(0x03FF) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(f16_to_float(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(f16_to_float(0x8001) == -std::ldexp(1.0f, -24));
  CHECK(f16_to_float(0x3555) == 0x155 * std::ldexp(1.0f, -12) + std::ldexp(1.0f, -2));  // 0.333251953125
  const float zero = f16_to_float(0x0000), neg_zero = f16_to_float(0x8000);
  CHECK((zero == 0.0f && !std::signbit(zero)));
  CHECK((neg_zero == 0.0f && std::signbit(neg_zero)));
  CHECK(f16_to_float(0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(f16_to_float(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(f16_to_float(0x7E00)));
  CHECK(std::isnan(f16_to_float(0x7C01)));  // signalling-style NaN must not collapse to inf
  CHECK(std::isnan(f16_to_float(0xFFFF)));
}

TEST_CASE("safetensors: reads a file built byte by byte") {
  // Keys deliberately not in offset order; no padding; metadata last; data: h (F16), i (I32), f (F32), b (BF16).
  const std::string header =
      "{\"f\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[12,20]},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[20,24]},"
      "\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
      "\"i\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[8,12]},"
      "\"__metadata__\":{\"k\":\"v\"}}";
  const std::string data = raw(std::vector<std::uint16_t>{0x3C00, 0xC000, 0x0001, 0x7C00}) +
                           raw(std::vector<std::int32_t>{7}) + raw(std::vector<float>{0.5f, -3.0f}) +
                           raw(std::vector<std::uint16_t>{0x3F80, 0xC040});  // bf16 1.0, -3.0
  TempPath tmp;
  write_bytes(tmp.path, le64(header.size()) + header + data);
  SafetensorsReader r(tmp.path);
  REQUIRE(r.tensors().size() == 4);
  CHECK(r.tensors()[0].name == "h");
  CHECK(r.tensors()[1].name == "i");
  CHECK(r.tensors()[2].name == "f");
  CHECK(r.tensors()[3].name == "b");
  CHECK(r.tensors()[1].shape.empty());
  CHECK(r.metadata() == std::map<std::string, std::string>{{"k", "v"}});
  CHECK(r.read_f32(*r.find("h")) == std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24),
                                                       std::numeric_limits<float>::infinity()});
  CHECK(r.read_f32(*r.find("f")) == std::vector<float>{0.5f, -3.0f});
  CHECK(r.read_f32(*r.find("b")) == std::vector<float>{1.0f, -3.0f});
  CHECK_THROWS_WITH_AS(r.read_f32(*r.find("i")),
                       (tmp.path + ": tensor 'i' has dtype I32; only F32, F16 and BF16 tensors can be read as f32")
                           .c_str(),
                       UsageError);
  fsdpp::SafetensorInfo forged = *r.find("f");
  forged.end = 1000;  // not from this file: must not read past its end
  CHECK_THROWS_AS(r.read_f32(forged), UsageError);
}

TEST_CASE("safetensors: rejects a file shorter than 8 bytes") {
  check_rejects("abc", "3 bytes is too short for a safetensors file, which starts with an 8-byte header length; the "
                       "file is truncated or not a safetensors file");
}

TEST_CASE("safetensors: rejects a header length beyond the file") {
  check_rejects(le64(100) + "{}", "safetensors header length 100 exceeds the 2 bytes after the length field; the "
                                  "file is truncated or not a safetensors file");
  check_rejects(le64(~std::uint64_t(0)), "safetensors header length 18446744073709551615 exceeds the 0 bytes after "
                                         "the length field; the file is truncated or not a safetensors file");
}

TEST_CASE("safetensors: rejects a header over the 100 MB limit") {
  TempPath tmp;
  const std::uint64_t n = 100'000'001;
  write_bytes(tmp.path, le64(n));
  std::filesystem::resize_file(tmp.path, 8 + n);  // sparse: no 100 MB written
  CHECK_THROWS_WITH_AS(SafetensorsReader{tmp.path},
                       (tmp.path + ": safetensors header length 100000001 exceeds the 100000000-byte limit" + kCorrupt)
                           .c_str(),
                       UsageError);
}

TEST_CASE("safetensors: rejects invalid JSON, quoting the parser") {
  TempPath tmp;
  write_bytes(tmp.path, st_bytes("{\"t\": [1, 2", 0));
  std::string what;
  try {
    SafetensorsReader r(tmp.path);
  } catch (const UsageError& e) {
    what = e.what();
  }
  const std::string head = tmp.path + ": safetensors header is not valid JSON: [json.exception.parse_error.101]";
  CHECK(what.rfind(head, 0) == 0);
  CHECK(what.size() > head.size() + kCorrupt.size());
  CHECK(what.compare(what.size() - kCorrupt.size(), kCorrupt.size(), kCorrupt) == 0);
}

// nlohmann::json reports a number out of a double's range as out_of_range, not parse_error; it escaped the reader
// until fuzzing found it.
TEST_CASE("safetensors: rejects a header with a number too large for a double") {
  for (const std::string header : {"1e999", "{\"t\": {\"shape\": [1e400]}}"}) {
    TempPath tmp;
    write_bytes(tmp.path, st_bytes(header, 0));
    std::string what;
    try {
      SafetensorsReader r(tmp.path);
    } catch (const UsageError& e) {
      what = e.what();
    }
    CAPTURE(header);
    CHECK(what.rfind(tmp.path + ": safetensors header is not valid JSON: [json.exception.out_of_range.406]", 0) == 0);
  }
}

TEST_CASE("safetensors: rejects a header that is not an object") {
  check_rejects(st_bytes("[1, 2]", 0), "safetensors header is a JSON array, not an object" + kCorrupt);
}

TEST_CASE("safetensors: rejects tensor entries with missing or mistyped fields") {
  const std::string p = "tensor 't': ";
  check_rejects(st_bytes("{\"t\":5}", 0), p + "the header entry is not a JSON object" + kCorrupt);
  check_rejects(st_bytes(one_tensor("\"shape\":[1],\"data_offsets\":[0,4]"), 4), p + "missing \"dtype\"" + kCorrupt);
  check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"data_offsets\":[0,4]"), 4),
                p + "missing \"shape\"" + kCorrupt);
  check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"shape\":[1]"), 4), p + "missing \"data_offsets\"" + kCorrupt);
  check_rejects(st_bytes(one_tensor("\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]"), 4),
                p + "\"dtype\" must be a string" + kCorrupt);
  for (const char* shape : {"\"1\"", "[1.5]", "[\"1\"]"})
    check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"shape\":" + std::string(shape) + ",\"data_offsets\":[0,4]"),
                           4),
                  p + "\"shape\" must be an array of integers" + kCorrupt);
  for (const char* offs : {"[0]", "[0,4,8]", "[-4,4]", "[0,4.0]", "{}"})
    check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":" + std::string(offs)), 4),
                  p + "\"data_offsets\" must be an array of two non-negative integers" + kCorrupt);
  check_rejects(st_bytes("{\"__metadata__\":{\"k\":1}}", 0),
                "\"__metadata__\" must be an object of string values" + kCorrupt);
}

TEST_CASE("safetensors: rejects negative dimensions") {
  check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,0]"), 0),
                "tensor 't': shape [2, -3] has a negative dimension" + kCorrupt);
}

TEST_CASE("safetensors: rejects data offsets out of range or reversed") {
  check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]"), 12),
                "tensor 't': data_offsets [0, 16] run past the end of the 12-byte data section" + kCorrupt);
  check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]"), 12),
                "tensor 't': data_offsets [8, 4] begin after they end" + kCorrupt);
}

TEST_CASE("safetensors: rejects overlapping data ranges") {
  const std::string header = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[6,6]},"
                             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  check_rejects(st_bytes(header, 12),
                "tensors 'a' (data_offsets [0, 8]) and 'b' (data_offsets [4, 12]) overlap" + kCorrupt);
}

TEST_CASE("safetensors: rejects a shape that does not match its data range") {
  check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]"), 24),
                "tensor 't': shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20] span 20" + kCorrupt);
  // 2^32 * 2^32 wraps to 0 in 64 bits: the guard must catch it rather than accept an empty range.
  check_rejects(st_bytes(one_tensor("\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]"), 0),
                "tensor 't': shape [4294967296, 4294967296] of U8 is too large: its byte size overflows 64 bits" +
                    kCorrupt);
  check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"shape\":[18446744073709551615],\"data_offsets\":[0,0]"), 0),
                "tensor 't': \"shape\" has a dimension too large for a 64-bit signed integer" + kCorrupt);
}

TEST_CASE("safetensors: rejects an unknown dtype") {
  check_rejects(st_bytes(one_tensor("\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]"), 1),
                "tensor 't': unknown dtype \"Q4\" (known: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)" +
                    kCorrupt);
}

TEST_CASE("safetensors: rejects duplicate keys, at the top and inside an entry") {
  const std::string entry = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
  // JSON parsers keep one of two equal keys silently; which copy of 't' would be read is ambiguous.
  check_rejects(st_bytes("{\"t\":" + entry + ",\"t\":" + entry + "}", 4),
                "key 't' appears twice in the header; which one is meant is ambiguous" + kCorrupt);
  check_rejects(st_bytes(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"data_offsets\":[0,4]"), 4),
                "key 'data_offsets' appears twice in the entry of 't'; which one is meant is ambiguous" + kCorrupt);
  check_rejects(st_bytes("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0),
                "key 'a' appears twice in the entry of '__metadata__'; which one is meant is ambiguous" + kCorrupt);
  // Equal keys in different objects are fine.
  TempPath tmp;
  write_bytes(tmp.path, st_bytes("{\"a\":" + entry + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8));
  CHECK(SafetensorsReader(tmp.path).tensors().size() == 2);
}
