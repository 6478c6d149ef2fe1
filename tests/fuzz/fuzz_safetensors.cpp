// Fuzz target: the safetensors reader (SafetensorsReader), which treats its file as untrusted.
//
// Input: the file's bytes. Contract: a reader whose every tensor lies inside the data section, or an
// fsdpp::Error (UsageError) naming the file. On an accepted file: every tensor is found by name, ranges do not
// overlap, and every F32/F16/BF16 tensor reads back as exactly its element count of floats.
#include "fuzz_common.hpp"

#include "fsdpp/ckpt/safetensors.hpp"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 256 * 1024) return -1;
  static fsdpp::fuzz::ScratchFile file(".safetensors");
  const std::string& path = file.write(data, size);
  try {
    const fsdpp::SafetensorsReader reader(path);
    std::uint64_t furthest = 0;
    for (const fsdpp::SafetensorInfo& t : reader.tensors()) {
      FSDPP_FUZZ_ASSERT(reader.find(t.name) == &t, "tensor '{}' is not found by name", t.name);
      FSDPP_FUZZ_ASSERT(t.begin <= t.end && t.end <= size, "tensor '{}' spans [{}, {}) of a {}-byte file", t.name,
                        t.begin, t.end, size);
      if (t.begin == t.end) continue;
      FSDPP_FUZZ_ASSERT(t.begin >= furthest, "tensor '{}' at {} overlaps the previous one (ends {})", t.name, t.begin,
                        furthest);
      furthest = t.end;
      if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") continue;
      std::uint64_t numel = 1;
      for (const std::int64_t d : t.shape) numel *= static_cast<std::uint64_t>(d);
      const std::vector<float> values = reader.read_f32(t);
      FSDPP_FUZZ_ASSERT(values.size() == numel, "tensor '{}' read {} values, shape holds {}", t.name, values.size(),
                        numel);
    }
    FSDPP_FUZZ_ASSERT(reader.find("__metadata__") == nullptr, "__metadata__ taken for a tensor");
  } catch (const fsdpp::Error&) {
  }
  return 0;
}
