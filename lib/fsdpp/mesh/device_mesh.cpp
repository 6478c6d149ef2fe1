#include "fsdpp/mesh/device_mesh.hpp"

#include "fsdpp/comm/make_communicator.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <numeric>
#include <set>

namespace fsdpp {

struct DeviceMesh::Root {
  MPI_Comm world = MPI_COMM_NULL;
  bool planning = false;  // DeviceMesh::planning: no MPI behind it
  int world_rank = 0;
  std::vector<MeshDim> dims;  // resolved sizes
  std::vector<int> coords;    // this rank's coordinate along each root dim
  ~Root() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && world != MPI_COMM_NULL) MPI_Comm_free(&world);
  }
};

struct DeviceMesh::Group {
  std::string name;
  int size = 1;
  int coord = 0;
  MPI_Comm comm = MPI_COMM_NULL;
  std::unique_ptr<Communicator> communicator;
  std::vector<int> world_ranks;
  ~Group() {
    communicator.reset();  // a communicator drains its queue, so it must go before its MPI communicator
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

namespace {

// The communicator of a planning mesh: a size and a rank, and an error for anything that would communicate.
class PlanningCommunicator final : public Communicator {
 public:
  PlanningCommunicator(int size, int rank) : Communicator(CommBackend::mpi), size_(size), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommBackend backend() const override { return CommBackend::mpi; }
  std::string describe() const override { return fmt::format("planning ({} ranks, no communication)", size_); }

 protected:
  WorkHandle start_all_gather(const void*, void*, std::size_t, DType, const CollectiveTicket&) override {
    refuse("all_gather");
  }
  WorkHandle start_reduce_scatter(const void*, void*, std::size_t, DType, ReduceScatterOptions,
                                  const CollectiveTicket&) override {
    refuse("reduce_scatter");
  }
  WorkHandle start_all_reduce(void*, std::size_t, DType, ReduceOp, const CollectiveTicket&) override {
    refuse("all_reduce");
  }
  WorkHandle start_broadcast(void*, std::size_t, DType, int, const CollectiveTicket&) override { refuse("broadcast"); }
  WorkHandle start_barrier(const CollectiveTicket&) override { refuse("barrier"); }

 private:
  [[noreturn]] static void refuse(const char* op) {
    throw Error(fmt::format("{} on a planning mesh: DeviceMesh::planning has no ranks behind it; build a mesh over "
                            "an MPI communicator to communicate", op));
  }
  int size_, rank_;
};

bool valid_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isalnum(c) || c == '_'; });
}

// Row-major linear index of `coords` restricted to the dims where `take[d]` is true.
int linear_index(const std::vector<int>& coords, const std::vector<MeshDim>& dims, const std::vector<bool>& take) {
  int index = 0;
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (take[d]) index = index * dims[d].size + coords[d];
  return index;
}

std::vector<int> unravel(int rank, const std::vector<MeshDim>& dims) {
  std::vector<int> coords(dims.size());
  for (std::size_t d = dims.size(); d-- > 0;) {
    coords[d] = rank % dims[d].size;
    rank /= dims[d].size;
  }
  return coords;
}

int ravel(const std::vector<int>& coords, const std::vector<MeshDim>& dims) {
  return linear_index(coords, dims, std::vector<bool>(dims.size(), true));
}

// Every rank must build the same mesh; a rank that disagrees would wait in a different MPI_Comm_split.
void require_same_on_all_ranks(MPI_Comm world, const std::string& shape_text) {
  const auto hash = static_cast<std::int64_t>(std::hash<std::string>{}(shape_text) >> 1);
  std::int64_t bounds[2] = {hash, -hash};
  FSDPP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, bounds, 2, MPI_INT64_T, MPI_MIN, world));
  FSDPP_REQUIRE(bounds[0] == -bounds[1],
                "ranks disagree on the mesh (this rank has {}); every rank must be given the same mesh", shape_text);
}

}  // namespace

std::vector<MeshDim> resolve_mesh_shape(std::vector<MeshDim> dims, int world_size) {
  const std::string given = format_mesh_shape(dims);
  FSDPP_REQUIRE(!dims.empty(), "the mesh has no dimensions; give at least one, e.g. {{dp_shard: -1}}");
  std::set<std::string> seen;
  int inferred = -1;
  long long known = 1;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    FSDPP_REQUIRE(valid_name(dims[d].name), "mesh {}: dimension name '{}' must be non-empty letters, digits or '_'",
                  given, dims[d].name);
    FSDPP_REQUIRE(seen.insert(dims[d].name).second, "mesh {}: dimension '{}' appears twice; names must be unique",
                  given, dims[d].name);
    if (dims[d].size == -1) {
      FSDPP_REQUIRE(inferred < 0, "mesh {}: only one dimension may be -1 (inferred), but '{}' and '{}' both are",
                    given, dims[static_cast<std::size_t>(inferred)].name, dims[d].name);
      inferred = static_cast<int>(d);
    } else {
      FSDPP_REQUIRE(dims[d].size >= 1, "mesh {}: dimension '{}' has size {}; sizes must be >= 1, or -1 to infer",
                    given, dims[d].name, dims[d].size);
      known *= dims[d].size;
    }
  }
  if (inferred >= 0) {
    FSDPP_REQUIRE(world_size % known == 0,
                  "mesh {}: cannot infer '{}': the other dimensions multiply to {}, which does not divide the {} "
                  "ranks of this job; launch a multiple of {} ranks or change the sizes",
                  given, dims[static_cast<std::size_t>(inferred)].name, known, world_size, known);
    dims[static_cast<std::size_t>(inferred)].size = static_cast<int>(world_size / known);
  } else {
    std::string product;
    for (const auto& d : dims) product += fmt::format("{}{} {}", product.empty() ? "" : " x ", d.name, d.size);
    FSDPP_REQUIRE(known == world_size,
                  "mesh {} needs {} ranks ({}) but this job has {}; launch {} ranks, change a size, or set one "
                  "size to -1 to infer it",
                  given, known, product, world_size, known);
  }
  return dims;
}

std::vector<MeshDim> parse_mesh_shape(std::string_view text) {
  std::vector<MeshDim> dims;
  std::string token;
  auto flush = [&] {
    if (token.empty()) return;
    const auto eq = token.find_first_of("=:");
    FSDPP_REQUIRE(eq != std::string::npos && eq > 0 && eq + 1 < token.size(),
                  "mesh shape '{}': expected name=size entries such as dp_replicate=2,dp_shard=-1, got '{}'", text, token);
    const std::string name = token.substr(0, eq), size = token.substr(eq + 1);
    std::size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(size, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FSDPP_REQUIRE(used == size.size(), "mesh shape '{}': size of '{}' is '{}', expected an integer (or -1)", text, name, size);
    dims.push_back({name, value});
    token.clear();
  };
  for (char c : text) {
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) flush();
    else token.push_back(c);
  }
  flush();
  FSDPP_REQUIRE(!dims.empty(), "mesh shape '{}' is empty; expected e.g. dp_shard=-1", text);
  return dims;
}

std::string format_mesh_shape(const std::vector<MeshDim>& dims) {
  std::string out = "{";
  for (std::size_t d = 0; d < dims.size(); ++d) out += fmt::format("{}{}: {}", d ? ", " : "", dims[d].name, dims[d].size);
  return out + "}";
}

DeviceMesh::DeviceMesh(MPI_Comm world, std::vector<MeshDim> dims, CommBackend backend) : backend_(backend) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm_size(world, &world_size);
  require_same_on_all_ranks(world, format_mesh_shape(dims));
  dims = resolve_mesh_shape(std::move(dims), world_size);

  root_ = std::make_shared<Root>();
  FSDPP_MPI_CHECK(MPI_Comm_dup(world, &root_->world));
  root_->world_rank = world_rank;
  root_->dims = dims;
  root_->coords = unravel(world_rank, dims);

  const std::size_t n = dims.size();
  for (std::size_t d = 0; d < n; ++d) {
    auto group = std::make_shared<Group>();
    group->name = dims[d].name;
    group->size = dims[d].size;
    group->coord = root_->coords[d];
    std::vector<bool> others(n, true);
    others[d] = false;
    const int color = linear_index(root_->coords, dims, others);
    FSDPP_MPI_CHECK(MPI_Comm_split(root_->world, color, group->coord, &group->comm));
    std::vector<int> c = root_->coords;
    for (int k = 0; k < group->size; ++k) {
      c[d] = k;
      group->world_ranks.push_back(ravel(c, dims));
    }
    dims_.push_back(group);
    root_dim_of_.push_back(static_cast<int>(d));
  }
  // Communicators after all splits, in dimension order: the same order on every rank.
  for (auto& group : dims_) {
    group->communicator = make_communicator(backend, group->comm);
    group->communicator->set_label(group->name);
  }
}

DeviceMesh DeviceMesh::planning(std::vector<MeshDim> dims, int world_size, int rank, CommBackend backend) {
  dims = resolve_mesh_shape(std::move(dims), world_size);
  FSDPP_REQUIRE(rank >= 0 && rank < world_size, "planning mesh: rank {} is outside 0..{}", rank, world_size - 1);
  DeviceMesh mesh;
  mesh.backend_ = backend;
  mesh.root_ = std::make_shared<Root>();
  mesh.root_->planning = true;
  mesh.root_->world_rank = rank;
  mesh.root_->dims = dims;
  mesh.root_->coords = unravel(rank, dims);
  for (std::size_t d = 0; d < dims.size(); ++d) {
    auto group = std::make_shared<Group>();
    group->name = dims[d].name;
    group->size = dims[d].size;
    group->coord = mesh.root_->coords[d];
    std::vector<int> c = mesh.root_->coords;
    for (int k = 0; k < group->size; ++k) {
      c[d] = k;
      group->world_ranks.push_back(ravel(c, dims));
    }
    group->communicator = std::make_unique<PlanningCommunicator>(group->size, group->coord);
    mesh.dims_.push_back(group);
    mesh.root_dim_of_.push_back(static_cast<int>(d));
  }
  return mesh;
}

bool DeviceMesh::is_planning() const { return root_ && root_->planning; }

int DeviceMesh::size() const {
  int product = 1;
  for (const auto& g : dims_) product *= g->size;
  return product;
}

int DeviceMesh::rank() const {
  int index = 0;
  for (const auto& g : dims_) index = index * g->size + g->coord;
  return index;
}

const std::string& DeviceMesh::name(int dim) const { return dims_.at(static_cast<std::size_t>(dim))->name; }
int DeviceMesh::dim_size(int dim) const { return dims_.at(static_cast<std::size_t>(dim))->size; }
int DeviceMesh::coordinate(int dim) const { return dims_.at(static_cast<std::size_t>(dim))->coord; }
MPI_Comm DeviceMesh::mpi_comm(int dim) const { return dims_.at(static_cast<std::size_t>(dim))->comm; }
Communicator& DeviceMesh::comm(int dim) const { return *dims_.at(static_cast<std::size_t>(dim))->communicator; }
std::vector<int> DeviceMesh::group_world_ranks(int dim) const { return dims_.at(static_cast<std::size_t>(dim))->world_ranks; }

int DeviceMesh::dim_index(std::string_view name) const {
  for (std::size_t d = 0; d < dims_.size(); ++d)
    if (dims_[d]->name == name) return static_cast<int>(d);
  throw UsageError(fmt::format("mesh {} has no dimension '{}'", format_mesh_shape(shape()), name));
}

std::vector<int> DeviceMesh::coordinates() const {
  std::vector<int> c;
  for (const auto& g : dims_) c.push_back(g->coord);
  return c;
}

std::vector<MeshDim> DeviceMesh::shape() const {
  std::vector<MeshDim> s;
  for (const auto& g : dims_) s.push_back({g->name, g->size});
  return s;
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& names) const {
  FSDPP_REQUIRE(!names.empty(), "mesh {}: slice needs at least one dimension name", format_mesh_shape(shape()));
  DeviceMesh sub;
  sub.root_ = root_;
  sub.backend_ = backend_;
  int previous = -1;
  for (const auto& name : names) {
    const int d = dim_index(name);
    FSDPP_REQUIRE(d > previous, "mesh {}: slice dimensions must be distinct and in mesh order; '{}' comes too late",
                  format_mesh_shape(shape()), name);
    previous = d;
    sub.dims_.push_back(dims_[static_cast<std::size_t>(d)]);
    sub.root_dim_of_.push_back(root_dim_of_[static_cast<std::size_t>(d)]);
  }
  return sub;
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& names, const std::string& new_name) const {
  FSDPP_REQUIRE(!is_planning(), "flatten: a planning mesh has no MPI communicator to split");
  const auto& root_dims = root_->dims;
  FSDPP_REQUIRE(valid_name(new_name), "flatten: new dimension name '{}' must be letters, digits or '_'", new_name);
  for (const auto& d : root_dims)
    FSDPP_REQUIRE(d.name != new_name, "flatten: '{}' already names a mesh dimension; choose another name", new_name);
  std::vector<bool> flattened(root_dims.size(), false);
  for (const auto& name : names) {
    const int d = root_dim_of_[static_cast<std::size_t>(dim_index(name))];
    FSDPP_REQUIRE(d >= 0, "flatten: '{}' is itself flattened; flatten the original dimensions instead", name);
    flattened[static_cast<std::size_t>(d)] = true;
  }
  std::vector<bool> kept(flattened.size());
  for (std::size_t d = 0; d < kept.size(); ++d) kept[d] = !flattened[d];

  auto group = std::make_shared<Group>();
  group->name = new_name;
  group->size = 1;
  for (std::size_t d = 0; d < root_dims.size(); ++d)
    if (flattened[d]) group->size *= root_dims[d].size;
  group->coord = linear_index(root_->coords, root_dims, flattened);
  FSDPP_MPI_CHECK(MPI_Comm_split(root_->world, linear_index(root_->coords, root_dims, kept), group->coord, &group->comm));
  // World ranks of the group in group order: enumerate the flattened coordinates row-major.
  for (int k = 0; k < group->size; ++k) {
    std::vector<int> c = root_->coords;
    int rest = k;
    for (std::size_t d = root_dims.size(); d-- > 0;)
      if (flattened[d]) {
        c[d] = rest % root_dims[d].size;
        rest /= root_dims[d].size;
      }
    group->world_ranks.push_back(ravel(c, root_dims));
  }
  group->communicator = make_communicator(backend_, group->comm);

  DeviceMesh flat;
  flat.root_ = root_;
  flat.backend_ = backend_;
  flat.dims_.push_back(group);
  flat.root_dim_of_.push_back(-1);
  return flat;
}

DeviceMesh DeviceMesh::split(std::string_view name, int inner_size, const std::string& outer_name,
                             const std::string& inner_name) const {
  const auto& root_dims = root_->dims;
  const int d = root_dim_of_[static_cast<std::size_t>(dim_index(name))];
  FSDPP_REQUIRE(d >= 0, "split: '{}' is a flattened dimension; split an original one", name);
  const int size = root_dims[static_cast<std::size_t>(d)].size;
  FSDPP_REQUIRE(inner_size >= 1 && size % inner_size == 0,
                "split: {} ({}) cannot be cut into groups of {} consecutive ranks; {} must divide {}", name, size,
                inner_size, inner_name, size);
  for (const auto& n : {outer_name, inner_name}) {
    FSDPP_REQUIRE(valid_name(n), "split: new dimension name '{}' must be letters, digits or '_'", n);
    for (const auto& existing : root_dims)
      FSDPP_REQUIRE(existing.name != n, "split: '{}' already names a mesh dimension; choose another name", n);
  }
  // The root mesh with dimension d cut in two: (..., outer, inner, ...), row-major as ever.
  std::vector<MeshDim> cut = root_dims;
  cut[static_cast<std::size_t>(d)] = {outer_name, size / inner_size};
  cut.insert(cut.begin() + d + 1, MeshDim{inner_name, inner_size});
  std::vector<int> coords = root_->coords;
  const int c = coords[static_cast<std::size_t>(d)];
  coords[static_cast<std::size_t>(d)] = c / inner_size;
  coords.insert(coords.begin() + d + 1, c % inner_size);

  // This mesh's dimensions, `name` replaced by the two parts; the others keep their groups (the ranks that differ
  // only in another coordinate are the same before and after the cut).
  DeviceMesh out;
  out.root_ = root_;
  out.backend_ = backend_;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (root_dim_of_[i] != d) {
      out.dims_.push_back(dims_[i]);
      out.root_dim_of_.push_back(root_dim_of_[i]);
      continue;
    }
    for (std::size_t part : {static_cast<std::size_t>(d), static_cast<std::size_t>(d) + 1}) {
      auto group = std::make_shared<Group>();
      group->name = cut[part].name;
      group->size = cut[part].size;
      group->coord = coords[part];
      std::vector<bool> others(cut.size(), true);
      others[part] = false;
      std::vector<int> k = coords;
      for (int r = 0; r < group->size; ++r) {
        k[part] = r;
        group->world_ranks.push_back(ravel(k, cut));
      }
      if (is_planning()) {
        group->communicator = std::make_unique<PlanningCommunicator>(group->size, group->coord);
      } else {
        FSDPP_MPI_CHECK(MPI_Comm_split(root_->world, linear_index(coords, cut, others), group->coord, &group->comm));
        group->communicator = make_communicator(backend_, group->comm);
        group->communicator->set_label(group->name);
      }
      out.dims_.push_back(group);
      out.root_dim_of_.push_back(-1);
    }
  }
  return out;
}

DeviceMesh DeviceMesh::merge(const std::vector<std::string>& names, const std::string& new_name) const {
  FSDPP_REQUIRE(names.size() >= 2, "merge: name two or more consecutive dimensions of mesh {}", format_mesh_shape(shape()));
  FSDPP_REQUIRE(valid_name(new_name), "merge: new dimension name '{}' must be letters, digits or '_'", new_name);
  for (const auto& g : dims_)
    FSDPP_REQUIRE(g->name != new_name, "merge: '{}' already names a mesh dimension; choose another name", new_name);
  const int first = dim_index(names.front());
  for (std::size_t i = 1; i < names.size(); ++i)
    FSDPP_REQUIRE(dim_index(names[i]) == first + static_cast<int>(i),
                  "merge: {} are not consecutive dimensions of mesh {}, in this order", fmt::join(names, ", "),
                  format_mesh_shape(shape()));
  auto group = std::make_shared<Group>();
  group->name = new_name;
  group->size = 1;
  group->coord = 0;
  // Each group is an arithmetic progression of world ranks (row-major meshes, and split's cuts keep that), so the
  // merged group's members are this rank's world rank moved along each dimension by its stride.
  std::vector<int> strides;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Group& g = *dims_[static_cast<std::size_t>(first) + i];
    strides.push_back(g.size > 1 ? g.world_ranks[1] - g.world_ranks[0] : 0);
    group->size *= g.size;
    group->coord = group->coord * g.size + g.coord;
  }
  for (int k = 0; k < group->size; ++k) {
    int world = root_->world_rank, rest = k;
    for (std::size_t i = names.size(); i-- > 0;) {
      const Group& g = *dims_[static_cast<std::size_t>(first) + i];
      world += (rest % g.size - g.coord) * strides[i];
      rest /= g.size;
    }
    group->world_ranks.push_back(world);
  }
  if (is_planning()) {
    group->communicator = std::make_unique<PlanningCommunicator>(group->size, group->coord);
  } else {
    // The group's first world rank names it: every member computes the same one.
    FSDPP_MPI_CHECK(MPI_Comm_split(root_->world, group->world_ranks.front(), group->coord, &group->comm));
    group->communicator = make_communicator(backend_, group->comm);
    group->communicator->set_label(new_name);
  }
  DeviceMesh out;
  out.root_ = root_;
  out.backend_ = backend_;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (static_cast<int>(i) == first) {
      out.dims_.push_back(group);
      out.root_dim_of_.push_back(-1);
    }
    if (static_cast<int>(i) >= first && static_cast<int>(i) < first + static_cast<int>(names.size())) continue;
    out.dims_.push_back(dims_[i]);
    out.root_dim_of_.push_back(root_dim_of_[i]);
  }
  return out;
}

std::string DeviceMesh::describe() const {
  std::string out;
  for (const auto& g : dims_) out += fmt::format("{}{}={}", out.empty() ? "" : " x ", g->name, g->size);
  return fmt::format("{} ({} ranks, {})", out, size(), comm_backend_name(backend_));
}

}  // namespace fsdpp
