#pragma once
// A thin RAII layer over the HDF5 C API, for checkpoints. Rules of parallel HDF5 that shape it
// (docs/stack-notes.md §4): every metadata operation (create a group, a dataset or an attribute, write an attribute)
// is collective: all ranks of the file's communicator make the same calls with the same values, in the same
// order. Raw data reads and writes may be independent. HDF5's own error printing is off; failures become
// fsdpp errors naming the file and the object.
#include "fsdpp/runtime/error.hpp"

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp::h5 {

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
 public:
  enum class Kind { file, group, dataset, dataspace, attribute, plist, datatype };
  Handle() = default;
  Handle(hid_t id, Kind kind) : id_(id), kind_(kind) {}
  Handle(Handle&& other) noexcept : id_(other.id_), kind_(other.kind_) { other.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { close(); }
  void close();
  hid_t release() {  // gives up ownership without closing
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: passed straight to the C API

 private:
  hid_t id_ = H5I_INVALID_HID;
  Kind kind_ = Kind::file;
};

void silence_errors();  // once per process: fsdpp reports HDF5 failures itself

// A file whose H5Fclose failed (it could not write its metadata: a full disk, an I/O error). HDF5 cannot
// recover from that: the file stays half-closed inside the library and crashes HDF5's own shutdown at
// MPI_Finalize. The error is therefore not a UsageError: the job stops at once (MPI_Abort), without finalize.
class CloseFailed : public Error {
 public:
  using Error::Error;
};

// Closes a file and checks the result (a Handle's destructor cannot report failure). Collective for a file
// opened in parallel. Throws CloseFailed naming the path and HDF5's innermost reason.
void close_file(Handle& file, const std::string& path);

// HDF5's innermost error descriptions of the last failed call, e.g. "file write failed: ... errno = 28".
std::string error_text();

// Files. `comm` = MPI_COMM_NULL opens serially (one rank, e.g. rank 0 adding the virtual datasets).
Handle create_file(const std::string& path, MPI_Comm comm);
Handle open_file(const std::string& path, MPI_Comm comm, bool writable = false);

Handle create_group(hid_t parent, const std::string& name, const std::string& file);
Handle open_group(hid_t parent, const std::string& name, const std::string& file);
bool exists(hid_t parent, const std::string& path);
std::vector<std::string> children(hid_t group);  // link names, in creation order where known
// The same bytes for every path to one object (hard links): to walk a file's groups without looping.
std::string object_key(hid_t object);

// A contiguous f32 dataset of `dims`, allocated at creation, never filled (its writer fills it).
Handle create_dataset_f32(hid_t parent, const std::string& name, const std::vector<std::uint64_t>& dims,
                          const std::string& file);
Handle open_dataset(hid_t parent, const std::string& name, const std::string& file);
std::vector<std::uint64_t> dataset_dims(hid_t dataset);
std::uint64_t storage_bytes(hid_t dataset);  // bytes the dataset's data takes in the file (0: none allocated)
// Byte offset of a contiguous, allocated dataset's data in its file (raw writes may go there directly).
std::uint64_t file_offset(hid_t dataset);

// Reads or writes rows [first, first + rows) of a dataset whose rows hold `row_size` f32 each. Independent.
void write_rows(hid_t dataset, std::uint64_t first, std::uint64_t rows, std::uint64_t row_size, const float* data,
                const std::string& what);
void read_rows(hid_t dataset, std::uint64_t first, std::uint64_t rows, std::uint64_t row_size, float* data,
               const std::string& what);

// Attributes on any object (collective when the file is parallel).
void set_attr(hid_t object, const std::string& name, const std::string& value);
void set_attr(hid_t object, const std::string& name, std::int64_t value);
void set_attr(hid_t object, const std::string& name, std::uint64_t value);
void set_attr(hid_t object, const std::string& name, double value);
void set_attr(hid_t object, const std::string& name, const std::vector<std::int64_t>& value);
std::string get_string(hid_t object, const std::string& name, const std::string& what);
std::int64_t get_int(hid_t object, const std::string& name, const std::string& what);
std::uint64_t get_uint(hid_t object, const std::string& name, const std::string& what);
double get_double(hid_t object, const std::string& name, const std::string& what);
std::vector<std::int64_t> get_ints(hid_t object, const std::string& name, const std::string& what);
bool has_attr(hid_t object, const std::string& name);
// Every scalar numeric attribute of `object` as (name, text), sorted by name: integers as "{}", floats as
// "{:.17g}" (the text a layout digest covers). Other attributes are left out.
std::vector<std::pair<std::string, std::string>> numeric_attrs_as_text(hid_t object, const std::string& what);

// A virtual dataset `name` of `dims` made of row blocks: sources[i] (a dataset path in the same file) fills
// rows [offsets[i], offsets[i] + rows[i]). h5dump reads it as one tensor.
void create_virtual_rows(hid_t parent, const std::string& name, const std::vector<std::uint64_t>& dims,
                         const std::vector<std::string>& sources, const std::vector<std::uint64_t>& offsets,
                         const std::vector<std::uint64_t>& rows, const std::string& file);

}  // namespace fsdpp::h5
