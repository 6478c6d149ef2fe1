#pragma once
// Expert parallelism (mesh.ep): the E routed experts of a mixture-of-experts layer are split over the ep ranks of
// one group, E / ep consecutive experts each (rank r holds global experts [r * E/ep, (r+1) * E/ep)). A token row
// routed to an expert travels to that expert's rank and its output travels back (GShard; torchtitan's
// expert_parallel), in two all-to-all exchanges per layer and direction:
//
//   dispatch: this rank's rows, already permuted by GLOBAL expert (rows of expert 0, then of expert 1, ...;
//             counts[E] of them per expert), go to their experts' ranks. First the counts are exchanged (an
//             all_to_all_v of E/ep int64 per peer), so every rank knows how many rows each peer sends each of its
//             local experts; then every rank checks its receive against the capacity it was built with and the
//             ranks agree on the verdict (an all_gather of what each received) BEFORE any row moves, so an
//             overflow raises the same UsageError on every rank instead of a hang or an overrun; then the
//             (rows, C) floats move (all_to_all_v), arriving per source rank, and one copy kernel lays them out
//             in the received order:
//                 received order = (local expert j, source rank q, the rows q sent j in q's order)
//             i.e. each local expert's rows contiguous (what a grouped GEMM over the local experts wants), the
//             source ranks ascending inside an expert. The order depends only on the routing, never on timing,
//             which reproducible mode needs.
//   combine:  the reverse: rows in the received order (the experts' outputs) go back to their home ranks, which
//             get them in the order they dispatched them (by global expert, as given to dispatch).
//   backward: dispatch's backward is a combine of the gradients of the received rows, combine's backward a
//             dispatch of the gradients of the combined rows, both with the routing of the forward dispatch
//             (kept in the layer's ExpertRouting): dispatch_backward and combine_backward.
//
// No allocation per step: the group's one staging buffer (the rows per source rank, as the all-to-all moves
// them) is sized from the capacity (the worst case, rows received per rank: worst_case_rows) and allocated at the
// first dispatch, a layer's copy table at its first dispatch; the rows land in buffers the layer owns (`into`),
// which it keeps for its backward, so one group serves every layer. A group of one rank (ep 1, no communicator)
// exchanges by copying; the layers skip the exchange altogether without a group.
#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// One layer's routing across the group, from its last dispatch: what combine and the backward exchanges reuse.
// Make one per MoE layer with ExpertParallelGroup::make_routing (arrays sized once).
struct ExpertRouting {
  std::string label;                  // the layer ("h.3.mlp"), for errors
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;  // floats per peer (ranks)
  std::vector<std::int64_t> rows_from;  // (ranks x experts_per_rank): rows peer q sends local expert j, at q*L+j
  std::vector<std::int64_t> expert_rows;  // (experts_per_rank): rows each local expert received, in all
  std::int64_t sent_rows = 0;           // rows this rank dispatched
  std::int64_t received_rows = 0;       // rows its local experts received
  View1<std::int64_t> blocks;           // (3 x ranks x L) device copy table: staging row, received row, rows
  HostView1<std::int64_t> blocks_host;
  bool dispatched = false;
};

class ExpertParallelGroup {
 public:
  // `comm`: the ep dimension's group (its size is ranks); null: one rank, the exchanges are local copies. `num_experts` E (a multiple of ranks), `width` C (the
  // floats of a row), `capacity_rows`: the most rows this rank's experts may receive in one dispatch, summed
  // over its local experts and the source ranks, and the most it may send. `mesh_dim`: the mesh dimension's name.
  ExpertParallelGroup(Communicator* comm, int num_experts, int width, std::int64_t capacity_rows,
                      std::string mesh_dim = "ep");

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  bool active() const { return ranks_ > 1; }
  int num_experts() const { return num_experts_; }
  int width() const { return width_; }
  std::int64_t capacity_rows() const { return capacity_; }
  const std::string& mesh_dim() const { return mesh_dim_; }
  // Experts each rank holds: E / ranks; UsageError when ranks does not divide E.
  int experts_per_rank(int num_experts) const;
  int first_expert() const { return rank_ * experts_per_rank(num_experts_); }  // this rank's first global expert

  ExpertRouting make_routing(std::string label) const;

  // Collective over the group. `rows` (sent_rows, C) by global expert, `counts` (E, on the device) rows per
  // global expert. Writes the (received_rows, C) rows in the received order (above) to the front of `into`
  // (capacity rows) and returns that part; routing.expert_rows says where each local expert's rows are.
  // UsageError on every rank when some rank's receive exceeds the capacity.
  View1<float> dispatch(ExpertRouting& routing, const View1<const float>& rows, const View1<const std::int64_t>& counts,
                        const View1<float>& into);
  // Collective: `expert_out` (received_rows, C) in the received order back home, into the front of `into`
  // (sent_rows, C) in the order dispatch was given the rows; returns that part.
  View1<float> combine(const ExpertRouting& routing, const View1<const float>& expert_out, const View1<float>& into);
  // Backward: gradients (received_rows, C) of dispatch's result -> gradients (sent_rows, C) of its input.
  View1<float> dispatch_backward(const ExpertRouting& routing, const View1<const float>& grad_received,
                                 const View1<float>& into) {
    return combine(routing, grad_received, into);
  }
  // Backward: gradients (sent_rows, C) of combine's result -> gradients (received_rows, C) of expert_out.
  View1<float> combine_backward(const ExpertRouting& routing, const View1<const float>& grad_combined,
                                const View1<float>& into);
  // The group's own buffers, in bytes, allocated at its first dispatch (what the planner adds for it).
  std::int64_t buffer_bytes() const;
  // Rows this rank's experts may receive at most from a dispatch of `rows_per_rank` (token, choice) pairs per
  // rank: every rank's pairs, dropless; under a capacity of `expert_capacity` rows per expert and source rank,
  // no more than that per local expert and source. The one formula the layers and the planner size with.
  static std::int64_t worst_case_rows(int ranks, int experts_per_rank, std::int64_t rows_per_rank,
                                      std::int64_t expert_capacity = 0);

 private:
  void ensure_buffers();
  void exchange_counts(ExpertRouting& routing, const View1<const std::int64_t>& counts);
  void agree_on_capacity(const ExpertRouting& routing);
  void plan_blocks(ExpertRouting& routing) const;
  // Rows in the received order -> per source rank (to_staging) or the reverse, by the routing's block table.
  void permute(const ExpertRouting& routing, const View1<const float>& from, const View1<float>& to,
               bool to_staging) const;
  View1<float> exchange_rows_in(const ExpertRouting& routing, const View1<const float>& rows, const View1<float>& into);
  // all_to_all_v of floats or int64s over the group (a copy of the one block on one rank).
  template <class T>
  void all_to_all(const T* send, T* recv, const std::size_t* send_counts, const std::size_t* send_displs,
                  const std::size_t* recv_counts, const std::size_t* recv_displs) const;

  int ranks_ = 1, rank_ = 0;
  int num_experts_ = 0, width_ = 0;
  std::int64_t capacity_ = 0;
  std::string mesh_dim_ = "ep";
  Communicator* comm_ = nullptr;
  View1<float> staging_;                          // (capacity, C): rows per source rank
  View1<std::int64_t> counts_in_;                 // (ranks x L): rows each peer sends each local expert
  HostView1<std::int64_t> counts_host_, counts_in_host_;
  View1<std::int64_t> verdicts_;                  // (ranks x 4): what each rank received, for the capacity check
  HostView1<std::int64_t> verdicts_host_;
  std::vector<std::size_t> per_peer_counts_, per_peer_displs_;  // L and q * L: the counts exchange's layout
};

}  // namespace fsdpp
