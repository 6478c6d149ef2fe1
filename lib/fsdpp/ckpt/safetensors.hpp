#pragma once
// safetensors files (https://github.com/huggingface/safetensors): the weight format of the Hugging Face
// ecosystem, so fsdpp can load published GPT-2 weights and export its own. Layout: an 8-byte little-endian
// header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__": {..}}, then the data
// section (little-endian, row-major, offsets relative to its start).
//
// The reader treats the file as untrusted: every header field is checked (types, dtypes, bounds, overlaps,
// overflow-guarded sizes) before any data is read, and every problem is a UsageError naming the file.
// The writer streams one tensor at a time, so exporting a model never holds more than one tensor's bytes.
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace fsdpp {

struct SafetensorInfo {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte range in the data section
};

// IEEE 754 binary16 bits -> float; exact for every input, subnormals, infinities and NaN included.
float f16_to_float(std::uint16_t bits);

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);  // reads and validates the header; keeps the file open

  const std::vector<SafetensorInfo>& tensors() const { return tensors_; }  // in data-offset order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorInfo* find(const std::string& name) const;  // nullptr if absent
  const std::string& path() const { return path_; }

  // One tensor converted to f32 from F32, F16 or BF16. Not thread-safe: reads share one file position.
  std::vector<float> read_f32(const SafetensorInfo& t) const;

 private:
  std::string path_;
  mutable std::ifstream file_;
  std::uint64_t data_start_ = 0, data_size_ = 0;
  std::vector<SafetensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Declare every tensor (dtype "F32" or "BF16"), then write them in declared order, then finish(). The header
  // goes out with the first write, since it needs every tensor's offsets. A writer destroyed before finish()
  // leaves a file whose header promises more data than it holds, which every reader rejects.
  SafetensorsWriter(const std::string& path, std::map<std::string, std::string> metadata);

  void declare(const std::string& name, const std::vector<std::int64_t>& shape, const std::string& dtype);
  void write(const std::string& name, const float* data, std::size_t count);  // converts to the declared dtype
  void finish();  // checks every declared tensor was written; flushes and closes

 private:
  void write_header();

  std::string path_;
  std::ofstream file_;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorInfo> declared_;
  std::map<std::string, std::size_t> index_;
  std::uint64_t data_size_ = 0;
  std::size_t next_ = 0;  // the declared tensor the next write() must name
  bool header_written_ = false, finished_ = false;
};

}  // namespace fsdpp
