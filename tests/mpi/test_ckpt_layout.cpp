// Damaged checkpoint metadata (edited with the HDF5 C API, as a bad tool or a bit flip would): every edit of
// an attribute that says where data goes is a clear error on every rank within seconds, never a silent
// resume and never a hang; fsdpp ckpt verify names it. Also non-finite weights, and the mismatch message.
#include "ckpt_fixtures.hpp"
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/runtime/error.hpp"

#include <chrono>
#include <filesystem>
#include <functional>
#include <limits>

using namespace fsdpp;
using namespace fsdpp::test;
namespace fs = std::filesystem;

namespace {

using test::contains;

// Rank 0 copies `source` to `copy` and applies `edit` to the copy's open file; every rank waits.
void edited_copy(MPI_Comm comm, const std::string& source, const std::string& copy,
                 const std::function<void(hid_t file)>& edit) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    fs::remove(copy);
    fs::copy_file(source, copy);
    h5::Handle file = h5::open_file(copy, MPI_COMM_NULL, true);
    edit(file);
  }
  MPI_Barrier(comm);
}

// Loads `path` into a fresh model; returns the error every rank saw ("" if it loaded) and checks it took
// seconds, not minutes.
std::string load_error(MPI_Comm comm, const std::string& path) {
  Trained target = build(comm, {{"dp_shard", -1}}, 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    load_checkpoint(comm, path, target.contents());
  } catch (const UsageError& e) {
    error = e.what();
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  return error;
}

}  // namespace

MPI_TEST_CASE("ckpt layout: edited offsets, rows and shard counts are clear errors on every rank", 2) {
  const std::string dir = shared_temp_dir(test_comm, "layout");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 1);
  const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(1), {});
  const std::string copy = dir + "/copy.h5";
  CHECK(load_error(test_comm, r.path).empty());
  if (test_rank == 0) CHECK(verify_checkpoint(r.path).empty());

  struct Edit {
    std::string what, expected;  // `expected`: part of the error every rank must see
    std::function<void(hid_t)> apply;
  };
  const std::vector<Edit> edits = {
      {"a shard's offset", "layout_xxh64",
       [](hid_t f) { h5::set_attr(h5::open_dataset(f, "/model/wpe.weight/shard_1", "t"), "offset", std::int64_t{2}); }},
      {"a shard's rows (larger than its dataset)", "/model/h.0.mlp.c_fc.weight/shard_1: rows attribute says 900",
       [](hid_t f) { h5::set_attr(h5::open_dataset(f, "/model/h.0.mlp.c_fc.weight/shard_1", "t"), "rows", std::int64_t{900}); }},
      {"the /meta world size", "layout_xxh64",
       [](hid_t f) { h5::set_attr(h5::open_group(f, "/meta", "t"), "world_size", std::int64_t{3}); }},
      {"a tensor's shard count", "/model/wte.weight/shard_2: missing",
       [](hid_t f) { h5::set_attr(h5::open_group(f, "/model/wte.weight", "t"), "shards", std::int64_t{3}); }},
      {"a tensor's global shape", "/model/wte.weight: the shards cover 13 of its 12 rows",
       [](hid_t f) { h5::set_attr(h5::open_group(f, "/model/wte.weight", "t"), "global_shape", std::vector<std::int64_t>{12, 10}); }},
      {"the digest itself", "layout_xxh64",
       [](hid_t f) { h5::set_attr(h5::open_group(f, "/meta", "t"), "layout_xxh64", std::uint64_t{42}); }},
      {"the step", "layout_xxh64", [](hid_t f) { h5::set_attr(h5::open_group(f, "/train", "t"), "step", std::int64_t{7}); }},
  };
  for (const Edit& edit : edits) {
    CAPTURE(edit.what);
    edited_copy(test_comm, r.path, copy, edit.apply);
    const std::string error = load_error(test_comm, copy);
    CHECK(contains(error, copy + ": the checkpoint's metadata is damaged"));
    CHECK(contains(error, edit.expected));
    CHECK(contains(error, "load an earlier checkpoint"));
    if (test_rank == 0) {
      const auto problems = verify_checkpoint(copy);
      CHECK(!problems.empty());
      std::string all;
      for (const auto& p : problems) all += p + "\n";
      CHECK(contains(all, edit.expected));
    }
  }
  MPI_Barrier(test_comm);
  if (test_rank == 0) fs::remove_all(dir);
}

MPI_TEST_CASE("ckpt layout: a format_version 1 file (no digest) still loads; its structure is still checked", 2) {
  const std::string dir = shared_temp_dir(test_comm, "layout-v1");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 1);
  const auto before = saved.gathered();
  const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(1), {});
  const std::string v1 = dir + "/v1.h5", broken = dir + "/v1-broken.h5";
  const auto make_v1 = [](hid_t f) {
    h5::Handle meta = h5::open_group(f, "/meta", "t");
    H5Adelete(meta, "layout_xxh64");
    h5::set_attr(meta, "format_version", std::int64_t{1});
  };
  edited_copy(test_comm, r.path, v1, make_v1);
  {
    Trained loaded = build(test_comm, {{"dp_shard", -1}}, 0);
    load_checkpoint(test_comm, v1, loaded.contents());
    CHECK(loaded.gathered() == before);
  }
  if (test_rank == 0) CHECK(verify_checkpoint(v1).empty());
  // Without a digest an edited offset that breaks the tiling is still caught.
  edited_copy(test_comm, v1, broken, [](hid_t f) {
    h5::set_attr(h5::open_dataset(f, "/model/wpe.weight/shard_1", "t"), "offset", std::int64_t{1});
  });
  CHECK(contains(load_error(test_comm, broken), "/model/wpe.weight/shard_1: offset 1 but the shards before it end at row 3"));
  // A version 2 file stripped of its digest is refused.
  edited_copy(test_comm, r.path, broken, [](hid_t f) { H5Adelete(h5::open_group(f, "/meta", "t"), "layout_xxh64"); });
  CHECK(contains(load_error(test_comm, broken), "layout_xxh64 is missing"));
  MPI_Barrier(test_comm);
  if (test_rank == 0) fs::remove_all(dir);
}

MPI_TEST_CASE("ckpt layout: non-finite weights are refused on load and reported by verify", 2) {
  const std::string dir = shared_temp_dir(test_comm, "nonfinite");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 1);
  // wpe [5, 10] on 2 ranks: rank 1 holds rows 3-4; element [4, 6] becomes NaN.
  if (saved.model->wpe.placement()->rank == 1) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), saved.model->wpe.value());
    host(1 * 10 + 6) = std::numeric_limits<float>::quiet_NaN();
    Kokkos::deep_copy(saved.model->wpe.value(), host);
  }
  const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(1), {});
  const std::string error = load_error(test_comm, r.path);
  CHECK(contains(error, "/model/wpe.weight element 46 ([4, 6]) is nan"));
  CHECK(contains(error, "resume from an earlier checkpoint"));
  if (test_rank == 0) {
    const auto problems = verify_checkpoint(r.path);
    REQUIRE(problems.size() == 1);
    CHECK(problems[0] == "/model/wpe.weight/shard_1: element 46 ([4, 6]) is nan: non-finite value");
    fs::remove_all(dir);
  }
}

MPI_TEST_CASE("ckpt layout: a model mismatch suggests only what a user can do, no nonexistent deck key", 2) {
  const std::string dir = shared_temp_dir(test_comm, "mismatch");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 1);
  const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(1), {});
  Trained untied = build(test_comm, {{"dp_shard", -1}}, 0, ckpt_config(false));
  std::string error;
  try {
    load_checkpoint(test_comm, r.path, untied.contents());
  } catch (const UsageError& e) {
    error = e.what();
  }
  CHECK(contains(error, "missing from the checkpoint: lm_head.weight"));
  CHECK(!contains(error, "strict"));  // no deck key sets LoadOptions::strict
  CHECK(contains(error, "fsdpp ckpt inspect " + r.path));
  CHECK(contains(error, "checkpoint.resume: false"));
  MPI_Barrier(test_comm);
  if (test_rank == 0) fs::remove_all(dir);
}
