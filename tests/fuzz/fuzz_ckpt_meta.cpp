// Fuzz target: what fsdpp reads from a checkpoint's metadata without the model that wrote it, i.e. `fsdpp ckpt
// inspect` and `fsdpp ckpt verify` (inspect_checkpoint, verify_checkpoint: /meta, /train, and every tensor group's
// global_shape, shards, and each shard's offset, rows and checksum), through the h5:: attribute readers that
// load_checkpoint uses too.
//
// Fuzzing the HDF5 file's bytes would mostly fuzz libhdf5's own parser. Instead the input is a small text
// program that builds a well-formed HDF5 file with hostile contents, one operation per line:
//   group PATH                       a group (and its parents)
//   attr PATH NAME TYPE VALUE        TYPE: str (VALUE: rest of the line, "\n" for a newline), vstr (a
//                                    variable-length string, as h5py writes them), i64, u64, f64, i32 (VALUE: one
//                                    number, a scalar attribute); str[] (VALUE: "a|b|c"), i64[], u64[], f64[]
//                                    (VALUE: "1,2,3"): a 1-D attribute of that many elements
//   dataset PATH DIMS                an f32 dataset of DIMS ("2,3"; at most 4 dims, 65536 elements), filled
//   checksum PATH                    the dataset's "checksum" u64 attribute: xxh64 of its bytes, as a save writes
//   link PATH TARGET                 a hard link PATH to the existing object TARGET (it may make a cycle)
// Lines that do not parse or that HDF5 refuses are skipped. Contract of the readers: their result, or an
// fsdpp::Error naming the file and the object; never a crash, an overflow or an unbounded allocation.
//
// TODO(checkpoint metadata validator): another branch adds checksummed /meta; when it lands, add its validator
// here (it reads the same attributes) and seeds for its new attributes.
#include "fuzz_common.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"

#include <hdf5.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Closer {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Closer() {
    if (id >= 0) close(id);
  }
};

std::vector<std::string> split_on(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (true) {
    const auto at = text.find(sep, pos);
    out.push_back(text.substr(pos, at == std::string::npos ? std::string::npos : at - pos));
    if (at == std::string::npos) return out;
    pos = at + 1;
  }
}

bool to_i64(const std::string& s, long long& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtoll(s.c_str(), &end, 0);
  return errno == 0 && *end == '\0';
}
bool to_u64(const std::string& s, unsigned long long& v) {
  if (s.empty() || s[0] == '-') return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtoull(s.c_str(), &end, 0);
  return errno == 0 && *end == '\0';
}
bool to_f64(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return *end == '\0';
}

std::string unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Opens any object (group or dataset) by path.
hid_t open_object(hid_t file, const std::string& path) {
  if (path.empty() || H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0) return -1;
  return H5Oopen(file, path.c_str(), H5P_DEFAULT);
}

void make_groups(hid_t file, const std::string& path) {
  std::string prefix;
  for (const std::string& part : split_on(path, '/')) {
    if (part.empty()) continue;
    prefix += "/" + part;
    const htri_t there = H5Lexists(file, prefix.c_str(), H5P_DEFAULT);
    if (there < 0) return;
    if (there == 0) {
      const hid_t g = H5Gcreate2(file, prefix.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      if (g < 0) return;
      H5Gclose(g);
    }
  }
}

void write_attr(hid_t file, const std::string& path, const std::string& name, const std::string& type,
                const std::string& value) {
  const hid_t obj = open_object(file, path);
  if (obj < 0 || name.empty()) {
    if (obj >= 0) H5Oclose(obj);
    return;
  }
  Closer o{obj, H5Oclose};
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  const bool array = type.size() > 2 && type.compare(type.size() - 2, 2, "[]") == 0;
  const std::string base = array ? type.substr(0, type.size() - 2) : type;
  const std::vector<std::string> items = array ? split_on(value, base == "str" ? '|' : ',') : std::vector{value};
  if (items.size() > 256) return;
  const hsize_t n = items.size();
  Closer space{array ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_SCALAR), H5Sclose};
  if (space.id < 0) return;

  if (base == "str" || base == "vstr") {
    std::vector<std::string> strings;
    std::size_t longest = 1;
    for (const auto& s : items) strings.push_back(unescape(s)), longest = std::max(longest, strings.back().size());
    Closer t{H5Tcopy(H5T_C_S1), H5Tclose};
    if (base == "vstr") {
      if (array) return;
      H5Tset_size(t.id, H5T_VARIABLE);
      Closer a{H5Acreate2(obj, name.c_str(), t.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
      const char* p = strings[0].c_str();
      if (a.id >= 0) H5Awrite(a.id, t.id, &p);
      return;
    }
    H5Tset_size(t.id, longest);
    std::string packed(longest * strings.size(), '\0');
    for (std::size_t i = 0; i < strings.size(); ++i) strings[i].copy(&packed[i * longest], longest);
    Closer a{H5Acreate2(obj, name.c_str(), t.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    if (a.id >= 0) H5Awrite(a.id, t.id, packed.data());
    return;
  }
  if (base == "i64" || base == "i32") {
    std::vector<long long> v;
    for (const auto& s : items) {
      long long x;
      if (!to_i64(s, x)) return;
      v.push_back(x);
    }
    const hid_t file_type = base == "i64" ? H5T_STD_I64LE : H5T_STD_I32LE;
    Closer a{H5Acreate2(obj, name.c_str(), file_type, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    if (a.id >= 0) H5Awrite(a.id, H5T_NATIVE_LLONG, v.data());
  } else if (base == "u64") {
    std::vector<unsigned long long> v;
    for (const auto& s : items) {
      unsigned long long x;
      if (!to_u64(s, x)) return;
      v.push_back(x);
    }
    Closer a{H5Acreate2(obj, name.c_str(), H5T_STD_U64LE, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    if (a.id >= 0) H5Awrite(a.id, H5T_NATIVE_ULLONG, v.data());
  } else if (base == "f64") {
    std::vector<double> v;
    for (const auto& s : items) {
      double x;
      if (!to_f64(s, x)) return;
      v.push_back(x);
    }
    Closer a{H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    if (a.id >= 0) H5Awrite(a.id, H5T_NATIVE_DOUBLE, v.data());
  }
}

void write_dataset(hid_t file, const std::string& path, const std::string& dims_text) {
  std::vector<hsize_t> dims;
  hsize_t total = 1;
  for (const auto& s : split_on(dims_text, ',')) {
    unsigned long long d;
    if (!to_u64(s, d) || d > 65536) return;
    dims.push_back(d);
    total *= d;
    if (total > 65536) return;
  }
  if (dims.empty() || dims.size() > 4) return;
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_groups(file, path.substr(0, slash));
  Closer space{H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose};
  if (space.id < 0) return;
  Closer ds{H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
            H5Dclose};
  if (ds.id < 0 || total == 0) return;
  std::vector<float> values(total);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i);
  H5Dwrite(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
}

void write_checksum(hid_t file, const std::string& path) {
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0) return;
  Closer ds{H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) return;
  Closer space{H5Dget_space(ds.id), H5Sclose};
  const hssize_t n = H5Sget_simple_extent_npoints(space.id);
  if (n < 0 || n > 65536) return;
  std::vector<float> values(static_cast<std::size_t>(n));
  if (n > 0 && H5Dread(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) return;
  const unsigned long long sum = XXH64(values.data(), values.size() * sizeof(float), 0);
  write_attr(file, path, "checksum", "u64", std::to_string(sum));
}

void build(const std::string& path, const std::string& program) {
  Closer file{H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) {
    std::fprintf(stderr, "fuzz harness: cannot create %s\n", path.c_str());
    std::abort();
  }
  std::istringstream in(program);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string op, a, b, c;
    words >> op >> a;
    if (op == "group") {
      make_groups(file.id, a);
    } else if (op == "attr") {
      words >> b >> c;
      std::string rest;
      std::getline(words, rest);
      if (!rest.empty() && rest[0] == ' ') rest.erase(0, 1);
      write_attr(file.id, a, b, c, rest);
    } else if (op == "dataset") {
      words >> b;
      write_dataset(file.id, a, b);
    } else if (op == "checksum") {
      write_checksum(file.id, a);
    } else if (op == "link") {
      words >> b;
      if (!a.empty() && !b.empty() && H5Lexists(file.id, b.c_str(), H5P_DEFAULT) > 0)
        H5Lcreate_hard(file.id, b.c_str(), file.id, a.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 16 * 1024) return -1;
  static const bool quiet = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // the harness's own refused lines print nothing
    return true;
  }();
  (void)quiet;
  static fsdpp::fuzz::ScratchFile file(".h5");
  build(file.path(), std::string(reinterpret_cast<const char*>(data), size));
  try {
    (void)fsdpp::inspect_checkpoint(file.path());
  } catch (const fsdpp::Error&) {
  }
  try {
    (void)fsdpp::verify_checkpoint(file.path());
  } catch (const fsdpp::Error&) {
  }
  return 0;
}
