// The collective algorithms. Written once, against Link (messages to ring
// neighbours) and Reducer (arithmetic); they never name a transport or a
// device. One algorithm per file; see docs in each file's opening comment.
// Each has its own arguments here; the engine reaches them through the
// table of algorithms (registry.h), whose rows wrap them in one signature
// and say where each runs, so a new algorithm is its file, its declaration
// here and its rows there.
#pragma once

#include "core/link.h"
#include "algorithms/plan.h"
#include "core/reducer.h"

#include <functional>
#include <vector>

namespace ringcomm {

// Ring reduce-scatter (reduce_scatter.cpp). `in` holds `plan.count()`
// elements and is never written. `acc` is a full-size accumulator for partial
// sums (may be `in` itself: the in-place all_reduce). Chunk `rank` of the
// reduction is left at `own` (which may point into acc). Does not finalize avg.
void ring_reduce_scatter(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* acc,
                         char* own);

// Ring all-gather (all_gather.cpp). `own` holds this rank's chunk; on return
// `out` holds all chunks in rank order. `own` may point at its place in `out`.
void ring_all_gather(Link& link, const RingPlan& plan, const char* own, char* out);

// All-reduce = reduce-scatter, then all-gather, on the same buffer (all_reduce.cpp).
void ring_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out);

// Recursive doubling all-reduce (recursive_doubling.cpp): log2 steps of
// whole buffers; for small buffers. Any number of ranks (folded).
void recursive_doubling_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out);

// Halving-doubling (halving_doubling.cpp): recursive-halving reduce-scatter +
// recursive-doubling all-gather; the halves need a power-of-two number of
// ranks (arguments as for the ring's), the all-reduce folds any number.
void halving_doubling_reduce_scatter(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* acc,
                                     char* own);
void halving_doubling_all_gather(Link& link, const RingPlan& plan, const char* own, char* out);
void halving_doubling_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out);

// Master-centric all-reduce through rank 0 (naive.cpp), for comparison.
void naive_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out);

// Broadcast pipelined along the ring root -> root+1 -> ... -> root-1 (broadcast.cpp).
void chain_broadcast(Link& link, size_t count, size_t elem_size, int root, char* buf);

// ---- rooted and personalized collectives ----------------------------------
// BlockSplit of a buffer, one per rank: per-rank counts when given (gatherv,
// scatterv, all_to_all's splits; `counts` points at n of them), else the
// split rule over `total` elements. Offsets are prefix sums, in rank order.
// `places` (n addresses, or null): each block in an array of its own (the
// root's list of arrays: torch's gather_list / scatter_list) instead of
// back to back in one buffer; at() says where block r is either way.
class BlockSplit {
 public:
  BlockSplit(size_t total, int n, const int64_t* counts, const uintptr_t* places = nullptr)
      : total_(total), n_(n), counts_(counts), places_(places) {
    if (counts_) {
      offsets_.resize(size_t(n) + 1);
      for (int r = 0; r < n; ++r) offsets_[size_t(r) + 1] = offsets_[size_t(r)] + size_t(counts_[r]);
    }
  }
  size_t count(int r) const { return counts_ ? size_t(counts_[r]) : split_size(total_, size_t(n_), size_t(r)); }
  size_t offset(int r) const { return counts_ ? offsets_[size_t(r)] : split_offset(total_, size_t(n_), size_t(r)); }
  // Block r: in `base` (the blocks back to back, es bytes per element), or at its own place.
  char* at(char* base, int r, size_t es) const {
    return places_ ? reinterpret_cast<char*>(places_[r]) : base + offset(r) * es;
  }
  const char* at(const char* base, int r, size_t es) const { return at(const_cast<char*>(base), r, es); }
  // The blocks' own addresses (null: back to back in one buffer).
  const uintptr_t* places() const { return places_; }
  size_t total() const { return n_ ? offset(n_ - 1) + count(n_ - 1) : 0; }

 private:
  size_t total_;
  int n_;
  const int64_t* counts_;
  const uintptr_t* places_;
  std::vector<size_t> offsets_;
};

// Reduce to `root` (reduce.cpp): `out` (count elements, may be `in`) is
// written on the root only; `in` is never written. Binomial tree (small
// buffers), or the ring's reduce-scatter followed by a gather of the chunks.
void binomial_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out);
void ring_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out);

// Gather to / scatter from `root` (gather_scatter.cpp), linearly. Gather:
// `in` is this rank's block; the root's `out` gets every block in rank order
// (or each at its place: blocks.at). Scatter: the root's `in` holds every
// block (or blocks.at says where); `out` gets this rank's.
void linear_gather(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out);
void linear_scatter(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out);

// All-to-all by pairwise exchange (all_to_all.cpp): block p of `in` (`send`)
// goes to rank p; block q of `out` (`recv`) comes from rank q. `exact`: the
// blocks' sizes are per-peer splits (one message per block, sent even when
// empty, so every size disagreement is caught).
void pairwise_all_to_all(Link& link, const BlockSplit& send, const BlockSplit& recv, bool exact, size_t es, const char* in,
                         char* out);

// Barrier: a zero-byte token passed n-1 hops around the ring (broadcast.cpp).
void ring_barrier(Link& link);

// ---- in the shared-memory window of one host (shm_*.cpp; link.window()) ----
// Direct reduce-scatter + all-gather in rounds of one slot ("shm"); the
// reduce-scatter alone leaves chunk `rank` at `own` (not finalized, as the
// ring's); the one-sync all-reduce for small buffers ("shm_flat"); the
// all-gather, broadcast and barrier through the slots. Arguments as the
// ring's; every rank sums in rank order.
void shm_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out);
void shm_reduce_scatter(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* own);
void shm_flat_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out);
void shm_all_gather(Link& link, const RingPlan& plan, const char* own, char* out);
void shm_broadcast(Link& link, size_t count, size_t es, int root, char* buf);
void shm_barrier(Link& link);
// The rooted and personalized collectives in the window (shm_rooted.cpp,
// shm_all_to_all.cpp): reduce
// by the direct reduce-scatter and a gather to the root; gather, scatter
// (any per-rank counts) and all_to_all (equal blocks: count / n each).
void shm_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out);
void shm_flat_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out);
void shm_gather(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out);
void shm_scatter(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out);
void shm_all_to_all(Link& link, size_t count, size_t es, const char* in, char* out);
// all_to_all with per-peer splits (blocks.at: also in arrays of their own),
// large blocks by single copy, the others through the slots; the engine runs
// it where a slot holds the table and a part per rank (shm_all_to_all_v_fits).
void shm_all_to_all_v(Link& link, const BlockSplit& send, const BlockSplit& recv, size_t es, const char* in,
                      char* out);
bool shm_all_to_all_v_fits(const ShmWindow& w);
// Zero copy ("zero_copy"): the input (all_reduce: and output) in each
// rank's part of the shared arena, at the offsets of its call's fingerprint
// (link.call().arena_in / arena_out, announced in the window); peers read
// them there.
void zero_copy_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, int64_t out_off);
void zero_copy_reduce_scatter(Link& link, const RingPlan& plan, const Reducer& red, char* own);
void zero_copy_all_gather(Link& link, const RingPlan& plan, char* out);
// Across hosts ("hierarchical"): link.window() holds this host's ranks.
// Ranks on H hosts, L on each: at(h, l) is the rank of local index l on host
// h (hosts in the order of the engine between hosts, local ranks in the
// window's order).
struct HostLayout {
  int hosts = 0, local = 0;
  std::vector<int> ranks;  // [h * local + l]
  int at(int h, int l) const { return ranks[size_t(h) * size_t(local) + size_t(l)]; }
  // Whether every local index's ranks grow from host to host: then the split
  // rule's chunks of a part between hosts are the ranks' own chunks
  // (hierarchical reduce_scatter / all_gather, shm_hierarchical.cpp).
  bool ordered() const {
    for (int l = 0; l < local; ++l)
      for (int h = 1; h < hosts; ++h)
        if (at(h, l) < at(h - 1, l)) return false;
    return true;
  }
};
// One step between hosts in flight (Across::start): wait() finishes it and
// throws its failure. A step destroyed unwaited (the host's part failed
// meanwhile) stops the engine between hosts and waits for the step to let
// go of the buffers, so nothing writes into them after the collective ends.
class AcrossStep {
 public:
  virtual ~AcrossStep() = default;
  virtual void wait() = 0;
};
// The step between hosts: coll (op sum for avg) with the ranks of equal local
// index on the other hosts, count as the collective takes it; here and now
// (across(...)), or started in the background (start), so that a pipeline
// keeps the network busy while the host works on its next piece.
struct Across {
  std::function<void(Coll, const char*, char*, size_t)> run;
  std::function<std::unique_ptr<AcrossStep>(Coll, const char*, char*, size_t)> start;
  void operator()(Coll c, const char* in, char* out, size_t n) const { run(c, in, out, n); }
};
// How many pieces the hierarchical all-reduce of `count` elements of `es`
// bytes over `local` ranks per host pipelines (1: no pipeline); the traffic's
// closed form (ringcomm/traffic.py) asks the same rule.
size_t hierarchical_pieces(size_t count, int local, size_t es);
// All-reduce: the direct reduce-scatter inside the host, across(all_reduce)
// of this rank's chunk, then the all-gather inside the host; in pieces,
// piece p's step between hosts running while the host reduces piece p + 1.
void hierarchical_all_reduce(Link& link, size_t count, size_t es, const Reducer& red, const char* in, char* out,
                             const Across& across);
// Reduce-scatter into `out` (this rank's chunk, not finalized) and all-gather
// of `own` (this rank's chunk) into `out`, through `perm` (count elements of
// scratch): shm_hierarchical.cpp says how.
void hierarchical_reduce_scatter(Link& link, const HostLayout& lay, size_t count, size_t es, const Reducer& red,
                                 const char* in, char* out, char* perm, const Across& across);
void hierarchical_all_gather(Link& link, const HostLayout& lay, size_t count, size_t es, const char* own,
                             char* out, char* perm, const Across& across);

}  // namespace ringcomm
