#include "fsdpp/ckpt/h5.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <numeric>

namespace fsdpp::h5 {
namespace {

hid_t checked(hid_t id, const std::string& what) {
  FSDPP_CHECK(id >= 0, "HDF5 failed: {}", what);
  return id;
}

void checked(herr_t rc, const std::string& what, int) {
  FSDPP_CHECK(rc >= 0, "HDF5 failed: {}", what);
}

Handle plist(hid_t cls) { return Handle(checked(H5Pcreate(cls), "H5Pcreate"), Handle::Kind::plist); }

Handle file_access(MPI_Comm comm) {
  Handle fapl = plist(H5P_FILE_ACCESS);
  if (comm != MPI_COMM_NULL) {
    checked(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL), "H5Pset_fapl_mpio", 0);
    // Metadata writes through collective MPI-IO: one writer instead of every rank touching the same blocks.
    checked(H5Pset_coll_metadata_write(fapl, 1), "H5Pset_coll_metadata_write", 0);
  }
  // Lustre and NFS often lack flock; a checkpoint must not fail on that (docs/stack-notes.md §4.5).
  H5Pset_file_locking(fapl, 0, 1);
  return fapl;
}

Handle scalar_space() { return Handle(checked(H5Screate(H5S_SCALAR), "H5Screate"), Handle::Kind::dataspace); }

Handle string_type(std::size_t length) {
  Handle t(checked(H5Tcopy(H5T_C_S1), "H5Tcopy"), Handle::Kind::datatype);
  checked(H5Tset_size(t, std::max<std::size_t>(length, 1)), "H5Tset_size", 0);
  return t;
}

Handle replace_attr(hid_t object, const std::string& name, hid_t type, hid_t space) {
  if (H5Aexists(object, name.c_str()) > 0) H5Adelete(object, name.c_str());
  return Handle(checked(H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT),
                        "create attribute " + name), Handle::Kind::attribute);
}

Handle open_attr(hid_t object, const std::string& name, const std::string& what) {
  const hid_t a = H5Aopen(object, name.c_str(), H5P_DEFAULT);
  FSDPP_REQUIRE(a >= 0, "{}: attribute '{}' is missing", what, name);
  return Handle(a, Handle::Kind::attribute);
}

// An attribute read into one value must hold one value: H5Aread writes every element of the attribute, so an
// array attribute read into a scalar would write past it (a stack overflow from a crafted checkpoint, found by
// fuzzing: tests/fuzz/regressions/ckpt_meta/).
Handle open_single_attr(hid_t object, const std::string& name, const std::string& what) {
  Handle a = open_attr(object, name, what);
  Handle space(H5Aget_space(a), Handle::Kind::dataspace);
  const hssize_t n = space.get() >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
  FSDPP_REQUIRE(n == 1, "{}: attribute '{}' holds {} values where one is expected; the file is corrupt or was not "
                "written by fsdpp", what, name, n);
  return a;
}

Handle row_selection(hid_t dataset, std::uint64_t first, std::uint64_t rows, std::uint64_t row_size,
                     const std::string& what, Handle& memspace) {
  Handle filespace(checked(H5Dget_space(dataset), "H5Dget_space " + what), Handle::Kind::dataspace);
  const int ndim = H5Sget_simple_extent_ndims(filespace);
  std::vector<hsize_t> start(static_cast<std::size_t>(ndim), 0), count(static_cast<std::size_t>(ndim));
  H5Sget_simple_extent_dims(filespace, count.data(), nullptr);
  start[0] = first;
  count[0] = rows;
  if (rows > 0) checked(H5Sselect_hyperslab(filespace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
                        "select rows of " + what, 0);
  else H5Sselect_none(filespace);
  const hsize_t n = rows * row_size;
  memspace = Handle(checked(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"), Handle::Kind::dataspace);
  if (rows == 0) H5Sselect_none(memspace);
  return filespace;
}

}  // namespace

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    close();
    id_ = other.id_;
    kind_ = other.kind_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::close() {
  if (id_ < 0) return;
  switch (kind_) {
    case Kind::file: H5Fclose(id_); break;
    case Kind::group: H5Gclose(id_); break;
    case Kind::dataset: H5Dclose(id_); break;
    case Kind::dataspace: H5Sclose(id_); break;
    case Kind::attribute: H5Aclose(id_); break;
    case Kind::plist: H5Pclose(id_); break;
    case Kind::datatype: H5Tclose(id_); break;
  }
  id_ = H5I_INVALID_HID;
}

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string error_text() {
  std::vector<std::string> lines;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD,
           [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
             auto& out = *static_cast<std::vector<std::string>*>(data);
             if (out.size() < 2 && e->desc) out.emplace_back(fmt::format("{}: {}", e->func_name, e->desc));
             return 0;
           },
           &lines);
  std::string text;
  for (const auto& l : lines) text += (text.empty() ? "" : "; ") + l;
  return text.empty() ? "no HDF5 error recorded" : text;
}

void close_file(Handle& file, const std::string& path) {
  const hid_t id = file.release();
  if (id < 0) return;
  const int saved_errno = errno;
  errno = 0;
  if (H5Fclose(id) >= 0) {
    errno = saved_errno;
    return;
  }
  const int why = errno;
  throw CloseFailed(fmt::format("HDF5 could not finish writing '{}' (closing it failed: {}{}); HDF5 cannot recover "
                                "from a failed close, so the job stops now; the previous checkpoint and 'latest' "
                                "are untouched; free space or fix the file system, then resume", path, error_text(),
                                why ? fmt::format("; system: {}", std::strerror(why)) : std::string()));
}

Handle create_file(const std::string& path, MPI_Comm comm) {
  silence_errors();
  Handle fapl = file_access(comm);
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  FSDPP_REQUIRE(f >= 0, "cannot create checkpoint file '{}': check that checkpoint.dir exists and is writable", path);
  return Handle(f, Handle::Kind::file);
}

Handle open_file(const std::string& path, MPI_Comm comm, bool writable) {
  silence_errors();
  Handle fapl = file_access(comm);
  const hid_t f = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl);
  FSDPP_REQUIRE(f >= 0, "cannot open checkpoint '{}': the file is missing, truncated or not HDF5", path);
  return Handle(f, Handle::Kind::file);
}

// Objects carry no modification times: the same contents then make the same bytes (seed files, reproducibility).
Handle untimed(hid_t cls) {
  Handle p = plist(cls);
  H5Pset_obj_track_times(p, 0);
  return p;
}

Handle create_group(hid_t parent, const std::string& name, const std::string& file) {
  Handle gcpl = untimed(H5P_GROUP_CREATE);
  return Handle(checked(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT),
                        fmt::format("{}: create group {}", file, name)), Handle::Kind::group);
}

Handle open_group(hid_t parent, const std::string& name, const std::string& file) {
  const hid_t g = H5Gopen2(parent, name.c_str(), H5P_DEFAULT);
  FSDPP_REQUIRE(g >= 0, "{}: group '{}' is missing", file, name);
  return Handle(g, Handle::Kind::group);
}

bool exists(hid_t parent, const std::string& path) { return H5Lexists(parent, path.c_str(), H5P_DEFAULT) > 0; }

std::vector<std::string> children(hid_t group) {
  std::vector<std::string> names;
  // H5Literate and H5L_info_t name the 1.10 API and its 1.12+ successor alike.
  H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, nullptr,
              [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
                static_cast<std::vector<std::string>*>(data)->emplace_back(name);
                return 0;
              },
              &names);
  return names;
}

std::string object_key(hid_t object) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  checked(H5Oget_info3(object, &info, H5O_INFO_BASIC), "H5Oget_info3", 0);
  return std::string(reinterpret_cast<const char*>(&info.token), sizeof info.token);
#else
  H5O_info_t info;
  checked(H5Oget_info2(object, &info, H5O_INFO_BASIC), "H5Oget_info2", 0);
  return std::string(reinterpret_cast<const char*>(&info.addr), sizeof info.addr);
#endif
}

Handle create_dataset_f32(hid_t parent, const std::string& name, const std::vector<std::uint64_t>& dims,
                          const std::string& file) {
  std::vector<hsize_t> d(dims.begin(), dims.end());
  Handle space(checked(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr), "H5Screate_simple"),
               Handle::Kind::dataspace);
  Handle dcpl = untimed(H5P_DATASET_CREATE);
  // Allocated now and never filled: creation stays a metadata-only collective, each writer fills its own.
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  return Handle(checked(H5Dcreate2(parent, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                        fmt::format("{}: create dataset {}", file, name)), Handle::Kind::dataset);
}

Handle open_dataset(hid_t parent, const std::string& name, const std::string& file) {
  const hid_t d = H5Dopen2(parent, name.c_str(), H5P_DEFAULT);
  FSDPP_REQUIRE(d >= 0, "{}: dataset '{}' is missing", file, name);
  return Handle(d, Handle::Kind::dataset);
}

std::vector<std::uint64_t> dataset_dims(hid_t dataset) {
  Handle space(checked(H5Dget_space(dataset), "H5Dget_space"), Handle::Kind::dataspace);
  std::vector<hsize_t> d(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, d.data(), nullptr);
  return {d.begin(), d.end()};
}

std::uint64_t storage_bytes(hid_t dataset) { return static_cast<std::uint64_t>(H5Dget_storage_size(dataset)); }

std::uint64_t file_offset(hid_t dataset) {
  const haddr_t at = H5Dget_offset(dataset);
  FSDPP_CHECK(at != HADDR_UNDEF, "HDF5: dataset has no contiguous allocated storage");
  return static_cast<std::uint64_t>(at);
}

void write_rows(hid_t dataset, std::uint64_t first, std::uint64_t rows, std::uint64_t row_size, const float* data,
                const std::string& what) {
  Handle memspace;
  Handle filespace = row_selection(dataset, first, rows, row_size, what, memspace);
  checked(H5Dwrite(dataset, H5T_NATIVE_FLOAT, memspace, filespace, H5P_DEFAULT, data), "write " + what, 0);
}

void read_rows(hid_t dataset, std::uint64_t first, std::uint64_t rows, std::uint64_t row_size, float* data,
               const std::string& what) {
  Handle memspace;
  Handle filespace = row_selection(dataset, first, rows, row_size, what, memspace);
  FSDPP_REQUIRE(H5Dread(dataset, H5T_NATIVE_FLOAT, memspace, filespace, H5P_DEFAULT, data) >= 0,
                "{}: reading failed (is the file truncated or corrupted?)", what);
}

void set_attr(hid_t object, const std::string& name, const std::string& value) {
  Handle type = string_type(value.size());
  Handle space = scalar_space();
  Handle a = replace_attr(object, name, type, space);
  checked(H5Awrite(a, type, value.empty() ? "" : value.data()), "write attribute " + name, 0);
}

#define FSDPP_H5_SCALAR_ATTR(T, FILE_TYPE, MEM_TYPE)                                                  \
  void set_attr(hid_t object, const std::string& name, T value) {                                     \
    Handle space = scalar_space();                                                                     \
    Handle a = replace_attr(object, name, FILE_TYPE, space);                                           \
    checked(H5Awrite(a, MEM_TYPE, &value), "write attribute " + name, 0);                             \
  }
FSDPP_H5_SCALAR_ATTR(std::int64_t, H5T_STD_I64LE, H5T_NATIVE_INT64)
FSDPP_H5_SCALAR_ATTR(std::uint64_t, H5T_STD_U64LE, H5T_NATIVE_UINT64)
FSDPP_H5_SCALAR_ATTR(double, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE)
#undef FSDPP_H5_SCALAR_ATTR

void set_attr(hid_t object, const std::string& name, const std::vector<std::int64_t>& value) {
  const hsize_t n = value.size();
  Handle space(checked(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"), Handle::Kind::dataspace);
  Handle a = replace_attr(object, name, H5T_STD_I64LE, space);
  checked(H5Awrite(a, H5T_NATIVE_INT64, value.data()), "write attribute " + name, 0);
}

std::string get_string(hid_t object, const std::string& name, const std::string& what) {
  Handle a = open_single_attr(object, name, what);
  Handle type(H5Aget_type(a), Handle::Kind::datatype);
  FSDPP_REQUIRE(type.get() >= 0 && H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) == 0,
                "{}: attribute '{}' is not a fixed-length string; the file is corrupt or was not written by fsdpp",
                what, name);
  std::string value(H5Tget_size(type), '\0');
  Handle mem = string_type(value.size());
  FSDPP_REQUIRE(H5Aread(a, mem, value.data()) >= 0, "{}: cannot read attribute '{}'", what, name);
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

#define FSDPP_H5_GET(T, NAME, MEM_TYPE)                                                               \
  T NAME(hid_t object, const std::string& name, const std::string& what) {                            \
    Handle a = open_single_attr(object, name, what);                                                   \
    T value{};                                                                                         \
    FSDPP_REQUIRE(H5Aread(a, MEM_TYPE, &value) >= 0, "{}: cannot read attribute '{}'", what, name);    \
    return value;                                                                                      \
  }
FSDPP_H5_GET(std::int64_t, get_int, H5T_NATIVE_INT64)
FSDPP_H5_GET(std::uint64_t, get_uint, H5T_NATIVE_UINT64)
FSDPP_H5_GET(double, get_double, H5T_NATIVE_DOUBLE)
#undef FSDPP_H5_GET

std::vector<std::int64_t> get_ints(hid_t object, const std::string& name, const std::string& what) {
  Handle a = open_attr(object, name, what);
  Handle space(H5Aget_space(a), Handle::Kind::dataspace);
  std::vector<std::int64_t> value(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
  FSDPP_REQUIRE(H5Aread(a, H5T_NATIVE_INT64, value.data()) >= 0, "{}: cannot read attribute '{}'", what, name);
  return value;
}

bool has_attr(hid_t object, const std::string& name) { return H5Aexists(object, name.c_str()) > 0; }

std::vector<std::pair<std::string, std::string>> numeric_attrs_as_text(hid_t object, const std::string& what) {
  std::vector<std::string> names;
  const auto collect = [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
  };
  hsize_t index = 0;
  checked(H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, &index, collect, &names), "H5Aiterate2");
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& name : names) {
    Handle attr(checked(H5Aopen(object, name.c_str(), H5P_DEFAULT), "H5Aopen"), Handle::Kind::attribute);
    Handle type(checked(H5Aget_type(attr), "H5Aget_type"), Handle::Kind::datatype);
    const H5T_class_t kind = H5Tget_class(type);
    if (kind == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_NONE)
      out.emplace_back(name, fmt::format("{}", get_uint(object, name, what)));
    else if (kind == H5T_INTEGER)
      out.emplace_back(name, fmt::format("{}", get_int(object, name, what)));
    else if (kind == H5T_FLOAT)
      out.emplace_back(name, fmt::format("{:.17g}", get_double(object, name, what)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void create_virtual_rows(hid_t parent, const std::string& name, const std::vector<std::uint64_t>& dims,
                         const std::vector<std::string>& sources, const std::vector<std::uint64_t>& offsets,
                         const std::vector<std::uint64_t>& rows, const std::string& file) {
  std::vector<hsize_t> d(dims.begin(), dims.end());
  Handle vspace(checked(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr), "H5Screate_simple"),
                Handle::Kind::dataspace);
  Handle dcpl = plist(H5P_DATASET_CREATE);
  for (std::size_t i = 0; i < sources.size(); ++i) {
    if (rows[i] == 0) continue;  // empty trailing shards map nothing
    std::vector<hsize_t> start(d.size(), 0), count(d);
    start[0] = offsets[i];
    count[0] = rows[i];
    checked(H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
            "select virtual rows", 0);
    Handle src(checked(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), "H5Screate_simple"),
               Handle::Kind::dataspace);
    checked(H5Pset_virtual(dcpl, vspace, ".", sources[i].c_str(), src), "H5Pset_virtual " + sources[i], 0);
  }
  H5Sselect_all(vspace);
  Handle ds(checked(H5Dcreate2(parent, name.c_str(), H5T_IEEE_F32LE, vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                    fmt::format("{}: create virtual dataset {}", file, name)), Handle::Kind::dataset);
}

}  // namespace fsdpp::h5
