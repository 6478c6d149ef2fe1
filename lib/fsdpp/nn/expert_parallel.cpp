#include "fsdpp/nn/expert_parallel.hpp"

#include "fsdpp/nn/language_model.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace fsdpp {
namespace {

constexpr int kVerdict = 4;  // per rank: rows received, rows sent, the local expert receiving most, its rows

// The rows of each block of `blocks` (staging row, received row, rows) from one layout to the other: a team per
// block, its threads over the block's floats. (A free function: CUDA's device lambdas cannot live in a private
// member function.)
void copy_blocks(const View1<const std::int64_t>& blocks, int nblocks, std::int64_t C, const View1<const float>& from,
                 const View1<float>& to, bool to_staging) {
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  Kokkos::parallel_for(
      "fsdpp::expert_parallel_permute", Policy(nblocks, Kokkos::AUTO), KOKKOS_LAMBDA(const Policy::member_type& team) {
        const std::int64_t b = team.league_rank();
        const std::int64_t staging = blocks(3 * b), received = blocks(3 * b + 1), n = blocks(3 * b + 2);
        const std::int64_t src = (to_staging ? received : staging) * C, dst = (to_staging ? staging : received) * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n * C), [&](std::int64_t i) { to(dst + i) = from(src + i); });
      });
}

}  // namespace

ExpertParallelGroup::ExpertParallelGroup(Communicator* comm, int num_experts, int width, std::int64_t capacity_rows,
                                         std::string mesh_dim)
    : ranks_(comm ? comm->size() : 1), rank_(comm ? comm->rank() : 0), num_experts_(num_experts), width_(width),
      capacity_(capacity_rows), mesh_dim_(std::move(mesh_dim)), comm_(comm) {
  FSDPP_REQUIRE(width >= 1 && capacity_rows >= 0, "expert parallelism over {}: the row width ({}) must be at least 1 "
                "and the capacity ({} rows) not negative", mesh_dim_, width, capacity_rows);
  const int L = experts_per_rank(num_experts);
  for (int q = 0; q < ranks_; ++q) {
    per_peer_counts_.push_back(sz(L));
    per_peer_displs_.push_back(sz(q) * sz(L));
  }
}

int ExpertParallelGroup::experts_per_rank(int num_experts) const {
  FSDPP_REQUIRE(num_experts >= 1 && num_experts % ranks_ == 0,
                "expert parallelism over {} ({} ranks): model.moe.num_experts ({}) must be a positive multiple of the "
                "expert-parallel ranks (mesh.ep)", mesh_dim_, ranks_, num_experts);
  return num_experts / ranks_;
}

// At the first exchange, not at construction: `fsdpp plan` builds the group on a planning mesh, where Kokkos
// never starts, and counts these bytes with buffer_bytes().
void ExpertParallelGroup::ensure_buffers() {
  if (staging_.extent(0) > 0 || capacity_ == 0) return;
  const int L = experts_per_rank(num_experts_);
  staging_ = uninitialized<float>("ep staging", sz(capacity_) * sz(width_));
  counts_in_ = View1<std::int64_t>("ep counts in", sz(ranks_) * sz(L));
  counts_in_host_ = Kokkos::create_mirror_view(counts_in_);
  counts_host_ = HostView1<std::int64_t>("ep counts", sz(num_experts_));
  verdicts_ = View1<std::int64_t>("ep verdicts", sz(ranks_) * kVerdict);
  verdicts_host_ = Kokkos::create_mirror_view(verdicts_);
}

ExpertRouting ExpertParallelGroup::make_routing(std::string label) const {
  const int L = experts_per_rank(num_experts_);
  ExpertRouting r;
  r.label = std::move(label);
  for (auto* v : {&r.send_counts, &r.send_displs, &r.recv_counts, &r.recv_displs}) v->assign(sz(ranks_), 0);
  r.rows_from.assign(sz(ranks_) * sz(L), 0);
  r.expert_rows.assign(sz(L), 0);
  return r;
}

template <class T>
void ExpertParallelGroup::all_to_all(const T* send, T* recv, const std::size_t* send_counts,
                                     const std::size_t* send_displs, const std::size_t* recv_counts,
                                     const std::size_t* recv_displs) const {
  if (!comm_) {  // one rank: its own block
    using Unmanaged = Kokkos::View<T*, Layout, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    Kokkos::deep_copy(Unmanaged(recv + recv_displs[0], recv_counts[0]),
                      Unmanaged(const_cast<T*>(send) + send_displs[0], send_counts[0]));
    return;
  }
  if (!comm_->stream_ordered()) Kokkos::fence();  // the collective reads what kernels wrote
  comm_->all_to_all_v(send, recv, AllToAllCounts{send_counts, send_displs, recv_counts, recv_displs});
}

// (a) Each peer learns how many rows of each of its local experts this rank sends: block p of `counts` (the
// experts p holds) goes to p. The send layout follows from the same counts (rows are by global expert, so the
// rows for p's experts are contiguous).
void ExpertParallelGroup::exchange_counts(ExpertRouting& r, const View1<const std::int64_t>& counts) {
  const int L = experts_per_rank(num_experts_);
  FSDPP_REQUIRE(counts.extent(0) == sz(num_experts_), "{}: dispatch needs one count per global expert ({}), got {}",
                r.label, num_experts_, counts.extent(0));
  all_to_all(counts.data(), counts_in_.data(), per_peer_counts_.data(), per_peer_displs_.data(),
             per_peer_counts_.data(), per_peer_displs_.data());
  Kokkos::deep_copy(counts_host_, counts);
  Kokkos::deep_copy(counts_in_host_, counts_in_);
  const std::size_t C = sz(width_);
  std::size_t sent = 0, received = 0;
  std::fill(r.expert_rows.begin(), r.expert_rows.end(), 0);
  for (int p = 0; p < ranks_; ++p) {
    std::int64_t to_p = 0, from_p = 0;
    for (int j = 0; j < L; ++j) {
      const std::int64_t out = counts_host_(sz(p) * sz(L) + sz(j)), in = counts_in_host_(sz(p) * sz(L) + sz(j));
      FSDPP_REQUIRE(out >= 0 && in >= 0, "{}: a negative row count for expert {} (this rank sends {}, rank {} sends "
                    "{}): the router's counts are corrupt", r.label, p * L + j, out, p, in);
      to_p += out;
      from_p += in;
      r.rows_from[sz(p) * sz(L) + sz(j)] = in;
      r.expert_rows[sz(j)] += in;
    }
    r.send_counts[sz(p)] = sz(to_p) * C;
    r.send_displs[sz(p)] = sent * C;
    r.recv_counts[sz(p)] = sz(from_p) * C;
    r.recv_displs[sz(p)] = received * C;
    sent += sz(to_p);
    received += sz(from_p);
  }
  r.sent_rows = static_cast<std::int64_t>(sent);
  r.received_rows = static_cast<std::int64_t>(received);
}

// (b) Every rank's receive (and send) against the capacity, decided on the same gathered numbers everywhere, so
// every rank raises the same error, or none does, before any row moves.
void ExpertParallelGroup::agree_on_capacity(const ExpertRouting& r) {
  const auto most = std::max_element(r.expert_rows.begin(), r.expert_rows.end());
  const std::int64_t mine[kVerdict] = {r.received_rows, r.sent_rows, first_expert() + (most - r.expert_rows.begin()),
                                       *most};
  if (comm_) {
    Kokkos::deep_copy(verdicts_host_, 0);
    for (int k = 0; k < kVerdict; ++k) verdicts_host_(sz(rank_) * kVerdict + sz(k)) = mine[k];
    Kokkos::deep_copy(verdicts_, verdicts_host_);
    if (!comm_->stream_ordered()) Kokkos::fence();
    comm_->all_gather(verdicts_.data() + sz(rank_) * kVerdict, verdicts_.data(), kVerdict);  // in place
    Kokkos::deep_copy(verdicts_host_, verdicts_);
  } else {
    for (int k = 0; k < kVerdict; ++k) verdicts_host_(sz(k)) = mine[k];
  }
  for (int q = 0; q < ranks_; ++q) {
    const std::int64_t* v = verdicts_host_.data() + sz(q) * kVerdict;
    if (v[0] > capacity_ || v[1] > capacity_)
      throw UsageError(fmt::format(
          "{}: expert-parallel rank {} of {} ({}) would receive {} rows and send {}, over the {} rows its exchange "
          "buffers hold (the most, {} rows, for expert {}). The capacity comes from the plan's worst case: size the "
          "group for more rows, or bound each expert's load (model.moe.capacity_factor)",
          r.label, q, mesh_dim_, ranks_, v[0], v[1], capacity_, v[3], v[2]));
  }
}

// The copy table between the per-source staging layout and the received order (hpp): block (q, j) holds the rows
// q sent local expert j, at `staging row` in staging and `received row` in the received order.
void ExpertParallelGroup::plan_blocks(ExpertRouting& r) const {
  const int L = experts_per_rank(num_experts_);
  if (r.blocks.extent(0) == 0) {  // once per layer, at its first dispatch
    r.blocks = View1<std::int64_t>("ep blocks " + r.label, 3 * sz(ranks_) * sz(L));
    r.blocks_host = Kokkos::create_mirror_view(r.blocks);
  }
  std::vector<std::int64_t> expert_cursor(sz(L), 0);
  std::int64_t offset = 0;
  for (int j = 0; j < L; ++j) {
    expert_cursor[sz(j)] = offset;
    offset += r.expert_rows[sz(j)];
  }
  for (int q = 0; q < ranks_; ++q) {
    std::int64_t staging_row = static_cast<std::int64_t>(r.recv_displs[sz(q)] / sz(width_));
    for (int j = 0; j < L; ++j) {
      const std::size_t b = sz(q) * sz(L) + sz(j);
      const std::int64_t n = r.rows_from[b];
      r.blocks_host(3 * b) = staging_row;
      r.blocks_host(3 * b + 1) = expert_cursor[sz(j)];
      r.blocks_host(3 * b + 2) = n;
      staging_row += n;
      expert_cursor[sz(j)] += n;
    }
  }
  Kokkos::deep_copy(r.blocks, r.blocks_host);
}

void ExpertParallelGroup::permute(const ExpertRouting& r, const View1<const float>& from, const View1<float>& to,
                                  bool to_staging) const {
  copy_blocks(r.blocks, static_cast<int>(r.rows_from.size()), width_, from, to, to_staging);
}

namespace {
void require_room(const std::string& label, const char* what, const View1<float>& into, std::int64_t rows,
                  std::size_t C) {
  FSDPP_CHECK(into.extent(0) >= sz(rows) * C, "{}: {} writes {} rows of {} floats into a buffer of {} floats", label,
              what, rows, C, into.extent(0));
}
View1<float> front(const View1<float>& v, std::int64_t rows, std::size_t C) {
  return Kokkos::subview(v, std::make_pair(std::size_t{0}, sz(rows) * C));
}
}  // namespace

View1<float> ExpertParallelGroup::exchange_rows_in(const ExpertRouting& r, const View1<const float>& rows,
                                                   const View1<float>& into) {
  const std::size_t C = sz(width_);
  FSDPP_REQUIRE(rows.extent(0) >= sz(r.sent_rows) * C, "{}: {} rows of {} floats to send, but the buffer holds {} "
                "floats", r.label, r.sent_rows, C, rows.extent(0));
  require_room(r.label, "an exchange to the experts", into, r.received_rows, C);
  all_to_all(rows.data(), staging_.data(), r.send_counts.data(), r.send_displs.data(), r.recv_counts.data(),
             r.recv_displs.data());
  permute(r, staging_, into, false);
  return front(into, r.received_rows, C);
}

View1<float> ExpertParallelGroup::dispatch(ExpertRouting& r, const View1<const float>& rows,
                                           const View1<const std::int64_t>& counts, const View1<float>& into) {
  ensure_buffers();
  exchange_counts(r, counts);
  agree_on_capacity(r);
  plan_blocks(r);
  r.dispatched = true;
  return exchange_rows_in(r, rows, into);
}

View1<float> ExpertParallelGroup::combine_backward(const ExpertRouting& r, const View1<const float>& grad_combined,
                                                   const View1<float>& into) {
  FSDPP_REQUIRE(r.dispatched, "{}: combine_backward before any dispatch: there is no routing to follow", r.label);
  return exchange_rows_in(r, grad_combined, into);
}

View1<float> ExpertParallelGroup::combine(const ExpertRouting& r, const View1<const float>& expert_out,
                                          const View1<float>& into) {
  FSDPP_REQUIRE(r.dispatched, "{}: combine before any dispatch: there is no routing to follow", r.label);
  const std::size_t C = sz(width_);
  FSDPP_REQUIRE(expert_out.extent(0) >= sz(r.received_rows) * C, "{}: combine needs the {} received rows of {} "
                "floats, but the buffer holds {} floats", r.label, r.received_rows, C, expert_out.extent(0));
  require_room(r.label, "combine", into, r.sent_rows, C);
  permute(r, expert_out, staging_, true);
  // The reverse exchange: what each peer sent comes back to it, where it came from.
  all_to_all(staging_.data(), into.data(), r.recv_counts.data(), r.recv_displs.data(), r.send_counts.data(),
             r.send_displs.data());
  return front(into, r.sent_rows, C);
}

std::vector<Module*> LanguageModel::apply_expert_parallel(std::shared_ptr<ExpertParallelGroup> ep, bool) {
  throw UsageError(fmt::format("mesh.ep ({}): {} has no mixture-of-experts layers to split; use mesh.ep 1",
                               ep ? ep->ranks() : 1, describe()));
}

std::int64_t ExpertParallelGroup::buffer_bytes() const {
  const std::int64_t L = num_experts_ / ranks_;
  return capacity_ * width_ * static_cast<std::int64_t>(sizeof(float)) +
         (ranks_ * L + ranks_ * kVerdict) * static_cast<std::int64_t>(sizeof(std::int64_t));
}

std::int64_t ExpertParallelGroup::worst_case_rows(int ranks, int experts_per_rank, std::int64_t rows_per_rank,
                                                  std::int64_t expert_capacity) {
  const std::int64_t dropless = std::int64_t{ranks} * rows_per_rank;
  if (expert_capacity <= 0) return dropless;
  return std::min(dropless, std::int64_t{ranks} * experts_per_rank * expert_capacity);
}

}  // namespace fsdpp
