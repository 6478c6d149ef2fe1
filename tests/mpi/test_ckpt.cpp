// Checkpoints: save at one world size or mesh, load at another (bitwise), the commit protocol, bad files,
// and the h5dump view. Every check reopens the file: parallel HDF5 can "succeed" and still lose datasets.
#include "ckpt_fixtures.hpp"
#include "mpi_test.hpp"

#include "fsdpp/ckpt/async_save.hpp"
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <unistd.h>

using namespace fsdpp;
namespace fs = std::filesystem;

using namespace fsdpp::test;

MPI_TEST_CASE("ckpt: saved at 4 ranks, loaded at 1, 2 and 3 (uneven shards) and 2x2: bitwise equal", 4) {
  const std::string dir = shared_temp_dir(test_comm, "reshard");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 2);
  const auto before = saved.gathered();
  CheckpointMeta meta;
  meta.mesh = saved.mesh->describe();
  const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(2), meta);
  CHECK(fs::path(r.path).filename() == "step_00000002.h5");
  CHECK(latest_checkpoint(dir) == r.path);
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    on_first(test_comm, n, [&](MPI_Comm group) {
      Trained loaded = build(group, {{"dp_shard", -1}}, 0);
      const LoadReport report = load_checkpoint(group, r.path, loaded.contents());
      CHECK(report.saved_world_size == 4);
      CHECK(report.progress.step == 2);
      CHECK(loaded.optimizer->steps() == 2);
      CHECK(loaded.gathered() == before);
    });
  }
  Trained hsdp = build(test_comm, {{"dp_replicate", 2}, {"dp_shard", 2}}, 0);
  load_checkpoint(test_comm, r.path, hsdp.contents());
  CHECK(hsdp.gathered() == before);
  if (test_rank == 0) fs::remove_all(dir);
}

MPI_TEST_CASE("ckpt: an HSDP 2x2 save (one replica writes) loads into full_shard at 4 ranks bitwise", 4) {
  const std::string dir = shared_temp_dir(test_comm, "hsdp");
  Trained saved = build(test_comm, {{"dp_replicate", 2}, {"dp_shard", 2}}, 2);
  const auto before = saved.gathered();
  const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(2), {});
  Trained loaded = build(test_comm, {{"dp_shard", -1}}, 0);
  load_checkpoint(test_comm, r.path, loaded.contents());
  CHECK(loaded.gathered() == before);
  if (test_rank == 0) {
    CHECK(verify_checkpoint(r.path).empty());
    fs::remove_all(dir);
  }
}

MPI_TEST_CASE("ckpt: h5dump reads whole tensors from /full, equal to the model's", 2) {
  const std::string dir = shared_temp_dir(test_comm, "h5dump");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 1);
  const std::vector<float> wpe = gather_full_parameter(saved.model->wpe, *saved.mesh);
  const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(1), {});
  if (test_rank == 0) {
    std::string listing;
    {
      FILE* pipe = popen(("h5dump -n " + r.path).c_str(), "r");
      REQUIRE(pipe);
      char line[512];
      while (fgets(line, sizeof line, pipe)) listing += line;
      pclose(pipe);
    }
    for (const char* object : {"/meta", "/train", "/model/wte.weight/shard_0", "/model/wpe.weight/shard_1",
                               "/optim/h.0.attn.c_attn.weight/exp_avg/shard_1", "/full/h.1.mlp.c_proj.weight"})
      CHECK_MESSAGE(listing.find(object) != std::string::npos, object);
    // The optimizer's hyperparameters travel with its state.
    {
      h5::Handle file = h5::open_file(r.path, MPI_COMM_NULL);
      h5::Handle optim = h5::open_group(file, "/optim", r.path);
      CHECK(h5::get_string(optim, "kind", r.path) == "AdamW");
      CHECK(h5::get_int(optim, "steps", r.path) == 1);
      CHECK(h5::get_double(optim, "beta2", r.path) == doctest::Approx(0.95));
      CHECK(h5::get_double(optim, "weight_decay", r.path) == doctest::Approx(0.1));
    }
    // wpe has 5 rows on 2 ranks (3 + 2): /full stitches them.
    std::vector<double> printed;
    FILE* pipe = popen(("h5dump -d /full/wpe.weight -y -w 0 -m %.9g " + r.path).c_str(), "r");
    REQUIRE(pipe);
    char buffer[256];
    std::string text;
    while (fgets(buffer, sizeof buffer, pipe)) text += buffer;
    pclose(pipe);
    const auto data = text.find("DATA {");
    REQUIRE(data != std::string::npos);
    std::string numbers = text.substr(data + 6);
    for (char& c : numbers)
      if (c == ',' || c == '}') c = ' ';
    std::istringstream in(numbers);
    for (double v; in >> v;) printed.push_back(v);
    REQUIRE(printed.size() == wpe.size());
    for (std::size_t i = 0; i < wpe.size(); ++i) CHECK(static_cast<float>(printed[i]) == wpe[i]);
    fs::remove_all(dir);
  }
}

MPI_TEST_CASE("ckpt: bad files and mismatched models get errors naming the file and the object", 2) {
  const std::string dir = shared_temp_dir(test_comm, "bad");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 1);
  const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(1), {});
  const std::string copy = dir + "/copy.h5";

  // A shape mismatch lists every parameter that differs, in one error.
  {
    Trained wider = build(test_comm, {{"dp_shard", -1}}, 0, ckpt_config(true, 12));
    CHECK_THROWS_WITH_AS(load_checkpoint(test_comm, r.path, wider.contents()),
                         doctest::Contains("h.0.attn.c_attn.weight: checkpoint shape [30,10], model [36,12]"), UsageError);
  }
  // strict: an untied model misses lm_head.weight; non-strict reports and skips it.
  {
    Trained untied = build(test_comm, {{"dp_shard", -1}}, 0, ckpt_config(false));
    CHECK_THROWS_WITH_AS(load_checkpoint(test_comm, r.path, untied.contents()),
                         doctest::Contains("missing from the checkpoint: lm_head.weight"), UsageError);
    LoadOptions lax;
    lax.strict = false;
    CheckpointContents weights_only = untied.contents();
    weights_only.optimizer = nullptr;
    const LoadReport report = load_checkpoint(test_comm, r.path, weights_only, lax);
    CHECK(report.missing == std::vector<std::string>{"lm_head.weight"});
  }
  // Corrupted bytes in a shard: the checksum catches them.
  if (test_rank == 0) {
    fs::copy_file(r.path, copy);
    h5::Handle file = h5::open_file(copy, MPI_COMM_NULL, true);
    h5::Handle ds = h5::open_dataset(file, "/model/h.0.mlp.c_fc.weight/shard_0", copy);
    std::vector<float> row(10);
    h5::read_rows(ds, 0, 1, 10, row.data(), "test");
    row[3] += 1.0f;
    h5::write_rows(ds, 0, 1, 10, row.data(), "test");
  }
  MPI_Barrier(test_comm);
  {
    Trained target = build(test_comm, {{"dp_shard", -1}}, 0);
    CHECK_THROWS_WITH_AS(load_checkpoint(test_comm, copy, target.contents()),
                         doctest::Contains("checksum mismatch in /model/h.0.mlp.c_fc.weight/shard_0"), UsageError);
  }
  if (test_rank == 0) {
    const auto problems = verify_checkpoint(copy);
    REQUIRE(problems.size() == 1);
    CHECK(problems[0] == "/model/h.0.mlp.c_fc.weight/shard_0: checksum mismatch (corrupted bytes)");
    // A newer format version.
    fs::remove(copy);
    fs::copy_file(r.path, copy);
    h5::Handle file = h5::open_file(copy, MPI_COMM_NULL, true);
    h5::Handle meta = h5::open_group(file, "/meta", copy);
    h5::set_attr(meta, "format_version", std::int64_t{99});
  }
  MPI_Barrier(test_comm);
  {
    Trained target = build(test_comm, {{"dp_shard", -1}}, 0);
    CHECK_THROWS_WITH_AS(load_checkpoint(test_comm, copy, target.contents()),
                         doctest::Contains(fmt::format("checkpoint format_version 99 is newer than this fsdpp reads ({})",
                                                           kCheckpointFormatVersion).c_str()), UsageError);
  }
  // A truncated file.
  if (test_rank == 0) {
    fs::remove(copy);
    fs::copy_file(r.path, copy);
    fs::resize_file(copy, fs::file_size(copy) / 2);
  }
  MPI_Barrier(test_comm);
  {
    Trained target = build(test_comm, {{"dp_shard", -1}}, 0);
    CHECK_THROWS_WITH_AS(load_checkpoint(test_comm, copy, target.contents()),
                         doctest::Contains("copy.h5': the file is missing, truncated or not HDF5"), UsageError);
  }
  MPI_Barrier(test_comm);
  if (test_rank == 0) fs::remove_all(dir);
}

MPI_TEST_CASE("ckpt: keep_last keeps the newest saves and never the one latest names", 2) {
  const std::string dir = shared_temp_dir(test_comm, "keep");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 0);
  for (int step : {1, 2, 3, 4}) save_checkpoint(test_comm, dir, saved.contents(), progress_at(step), {}, 2);
  if (test_rank == 0) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    CHECK(files == std::vector<std::string>{"latest", "step_00000003.h5", "step_00000004.h5"});
    CHECK(latest_checkpoint(dir) == dir + "/step_00000004.h5");
    fs::remove_all(dir);
  }
}

MPI_TEST_CASE("ckpt: an asynchronous save writes what a synchronous one writes, while the caller goes on", 2) {
  const std::string dir = shared_temp_dir(test_comm, "async");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 2);
  const auto before = saved.gathered();
  const SaveResult sync = save_checkpoint(test_comm, dir + "/sync", saved.contents(), progress_at(2), {});
  AsyncCheckpointer background(test_comm);
  background.start(stage_checkpoint(saved.contents(), progress_at(2), {}, test_rank), dir + "/async", 0);
  // The snapshot is a copy: changing the model now must not change what is written.
  for (Parameter* p : saved.model->parameters()) Kokkos::deep_copy(p->value(), 0.5f);
  const auto written = background.wait();
  REQUIRE(written);
  CHECK(!background.in_flight());
  for (const std::string& path : {sync.path, written->path}) {
    CAPTURE(path);
    Trained loaded = build(test_comm, {{"dp_shard", -1}}, 0);
    const LoadReport report = load_checkpoint(test_comm, path, loaded.contents());
    CHECK(report.progress.step == 2);
    CHECK(loaded.gathered() == before);
  }
  if (test_rank == 0) {
    CHECK(verify_checkpoint(written->path).empty());
    fs::remove_all(dir);
  }
}

MPI_TEST_CASE("ckpt: consolidate to whole tensors, then load them into shards by broadcast", 2) {
  const std::string dir = shared_temp_dir(test_comm, "consolidate");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 2);
  const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(2), {});
  const std::string whole = dir + "/whole.h5";
  if (test_rank == 0) consolidate_checkpoint(r.path, whole);
  MPI_Barrier(test_comm);
  // Both loads must give the same model: the same parameters, and the same loss on the next batch.
  Trained from_shards = build(test_comm, {{"dp_shard", -1}}, 0);
  load_checkpoint(test_comm, r.path, from_shards.contents());
  Trained from_whole = build(test_comm, {{"dp_shard", -1}}, 0);
  load_consolidated(test_comm, whole, from_whole.model->parameters());
  std::vector<std::vector<float>> a, b;
  for (Parameter* p : from_shards.model->parameters()) a.push_back(gather_full_parameter(*p, *from_shards.mesh));
  for (Parameter* p : from_whole.model->parameters()) b.push_back(gather_full_parameter(*p, *from_whole.mesh));
  CHECK(a == b);
  auto loss_of = [&](Trained& t) {
    std::vector<std::int32_t> in = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    View1<std::int32_t> tokens("tokens", in.size());
    Kokkos::deep_copy(tokens, HostView1<std::int32_t>(in.data(), in.size()));
    Flow flow;
    flow.B = 2, flow.T = 5, flow.tokens = tokens, flow.targets = tokens, flow.training = false;
    (*t.model)(flow);
    fsdp_group(*t.model)->reshard();
    return flow.loss;
  };
  CHECK(loss_of(from_shards) == loss_of(from_whole));
  // A model of another shape is refused with every mismatch listed.
  Trained wider = build(test_comm, {{"dp_shard", -1}}, 0, ckpt_config(true, 12));
  CHECK_THROWS_WITH_AS(load_consolidated(test_comm, whole, wider.model->parameters()),
                       doctest::Contains("wte.weight: file shape [13,10], model [13,12]"), UsageError);
  if (test_rank == 0) {
    // Plain whole tensors: h5dump reads them without fsdpp.
    FILE* pipe = popen(("h5dump -H " + whole).c_str(), "r");
    REQUIRE(pipe);
    std::string header;
    char line[512];
    while (fgets(line, sizeof line, pipe)) header += line;
    pclose(pipe);
    CHECK(header.find("DATASET \"h.0.mlp.c_fc.weight\"") != std::string::npos);
    CHECK(header.find("( 40, 10 )") != std::string::npos);
    fs::remove_all(dir);
  }
}
