// Whole-tensor export and import: `fsdpp ckpt consolidate` and loading its output into shards.
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/finite.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/ckpt/tensor_entries.hpp"
#include "fsdpp/ckpt/hf_convert.hpp"
#include "fsdpp/ckpt/hf_folder.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/version.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>

namespace fsdpp {
namespace {

std::int64_t row_size(const std::vector<std::int64_t>& shape) {
  std::int64_t r = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) r *= shape[d];
  return r;
}

std::vector<std::uint64_t> dims_of(const std::vector<std::int64_t>& shape) { return {shape.begin(), shape.end()}; }

}  // namespace

struct ConsolidatedWriter::Files {
  h5::Handle file, model;
};

ConsolidatedWriter::ConsolidatedWriter(const std::string& path, const std::string& source, std::int64_t step)
    : path_(path), files_(std::make_unique<Files>()) {
  files_->file = h5::create_file(path, MPI_COMM_NULL);
  h5::Handle meta = h5::create_group(files_->file, "/meta", path);
  h5::set_attr(meta, "format", std::string("fsdpp-consolidated"));
  h5::set_attr(meta, "format_version", std::int64_t{1});
  h5::set_attr(meta, "fsdpp_version", std::string(FSDPP_VERSION));
  h5::set_attr(meta, "source", source);
  h5::set_attr(meta, "step", step);
  files_->model = h5::create_group(files_->file, "/model", path);
}

ConsolidatedWriter::~ConsolidatedWriter() = default;

void ConsolidatedWriter::add(const std::string& name, const std::vector<std::int64_t>& shape, const float* data) {
  h5::Handle ds = h5::create_dataset_f32(files_->model, name, dims_of(shape), path_);
  h5::write_rows(ds, 0, static_cast<std::uint64_t>(shape.front()), static_cast<std::uint64_t>(row_size(shape)), data,
                 path_ + " /model/" + name);
}

void consolidate_checkpoint(const std::string& checkpoint, const std::string& out) {
  require_sound_layout(checkpoint);  // the offsets and rows below are trusted only after this
  h5::Handle in = h5::open_file(checkpoint, MPI_COMM_NULL);
  ConsolidatedWriter writer(out, checkpoint, h5::get_int(h5::open_group(in, "/train", checkpoint), "step", checkpoint + " /train"));
  h5::Handle model_in = h5::open_group(in, "/model", checkpoint);
  for (const std::string& name : h5::children(model_in)) {
    h5::Handle g = h5::open_group(model_in, name, checkpoint);
    const auto shape = h5::get_ints(g, "global_shape", checkpoint + " /model/" + name);
    const std::int64_t row = row_size(shape);
    std::vector<float> whole(static_cast<std::size_t>(shape.front() * row));
    const std::int64_t shards = h5::get_int(g, "shards", checkpoint);
    for (std::int64_t k = 0; k < shards; ++k) {
      h5::Handle ds = h5::open_dataset(g, fmt::format("shard_{}", k), checkpoint);
      const std::int64_t offset = h5::get_int(ds, "offset", checkpoint), rows = h5::get_int(ds, "rows", checkpoint);
      h5::read_rows(ds, 0, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(row), whole.data() + offset * row,
                    fmt::format("{} /model/{}/shard_{}", checkpoint, name, k));
    }
    writer.add(name, shape, whole.data());
  }
}

void load_weights(MPI_Comm comm, const std::string& path, const std::vector<Parameter*>& params,
                  const ModelConfig* model, bool one_stage) {
  if (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) {
    load_hf_weights(comm, path, params);
    return;
  }
  int folder = 0;  // rank 0's view: it is the one that reads
  root_does(comm, [&] { folder = is_model_folder(path) ? 1 : 0; });
  FSDPP_MPI_CHECK(MPI_Bcast(&folder, 1, MPI_INT, 0, comm));
  if (folder) {
    if (model) check_hf_folder_config(comm, path, *model);
    load_hf_weights(comm, path, params);
    return;
  }
  // Rank 0 tells the kind; every rank then takes the same path.
  std::string format;
  root_does(comm, [&] {
    h5::Handle file = h5::open_file(path, MPI_COMM_NULL);
    format = h5::get_string(h5::open_group(file, "/meta", path), "format", path + " /meta");
  });
  format = broadcast_string(comm, std::move(format));
  if (format == "fsdpp-consolidated") {
    load_consolidated(comm, path, params);
    return;
  }
  FSDPP_REQUIRE(format == "fsdpp-checkpoint", "{}: not an fsdpp checkpoint or consolidated file (format '{}')", path, format);
  CheckpointContents contents;
  contents.params = params;
  if (one_stage) contents.stage = comm;
  load_checkpoint(comm, path, contents);
}

void broadcast_into_shard(MPI_Comm comm, std::vector<float>& whole, Parameter& p) {
  for (std::size_t at = 0; at < whole.size(); at += INT_MAX)
    MPI_Bcast(whole.data() + at, static_cast<int>(std::min<std::size_t>(INT_MAX, whole.size() - at)), MPI_FLOAT, 0, comm);
  std::vector<float> local(static_cast<std::size_t>(p.local_numel()));
  ckpt_detail::take_local_elements(p, whole.data(), local.data());  // its rows; under tensor parallelism, its columns of them
  if (!local.empty())
    Kokkos::deep_copy(Kokkos::subview(p.value(), std::make_pair<std::size_t, std::size_t>(0, local.size())),
                      HostView1<float>(local.data(), local.size()));
}

void load_consolidated(MPI_Comm comm, const std::string& path, const std::vector<Parameter*>& params) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  h5::Handle file;
  h5::Handle model;
  std::string problems;
  if (rank == 0) {
    try {
      file = h5::open_file(path, MPI_COMM_NULL);
      model = h5::open_group(file, "/model", path);
      for (const Parameter* p : params) {
        if (!h5::exists(model, p->name())) {
          problems += "\n  missing from the file: " + p->name();
          continue;
        }
        std::vector<std::int64_t> shape;
        for (auto d : h5::dataset_dims(h5::open_dataset(model, p->name(), path))) shape.push_back(static_cast<std::int64_t>(d));
        if (shape != p->shape())
          problems += fmt::format("\n  {}: file shape [{}], model [{}]", p->name(), fmt::join(shape, ","), fmt::join(p->shape(), ","));
      }
    } catch (const std::exception& e) {
      problems = std::string("\n  ") + e.what();
    }
  }
  problems = broadcast_string(comm, std::move(problems));
  FSDPP_REQUIRE(problems.empty(), "{} does not match the model:{}\nthe weights are another model's: check model.arch "
                "and the model.* shapes of the deck against the model that wrote them", path, problems);

  for (Parameter* p : params) {
    std::vector<float> whole(static_cast<std::size_t>(p->global_numel()));
    // Rank 0 reads; every rank hears whether that worked before the broadcast (a failed read must not strand
    // the others in it).
    root_does(comm, [&] {
      h5::read_rows(h5::open_dataset(model, p->name(), path), 0, static_cast<std::uint64_t>(p->shape().empty() ? 1 : p->shape()[0]),
                    static_cast<std::uint64_t>(p->global_row_size()), whole.data(), path + " /model/" + p->name());
      if (const auto bad = first_non_finite(whole.data(), whole.size()))
        throw UsageError(fmt::format("{}: /model/{} {}: the file holds non-finite weights; refusing to start from "
                                     "them", path, p->name(), describe_non_finite(*bad, p->shape(), whole[*bad])));
    });
    broadcast_into_shard(comm, whole, *p);
  }
}

}  // namespace fsdpp
