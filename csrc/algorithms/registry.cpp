// The table of algorithms (registry.h): the rows, and the thin wrappers that
// give every algorithm of algorithms.h the one signature the engine calls.
#include "algorithms/registry.h"

namespace ringcomm {

// scan and exscan (algorithms/scan.cpp): only the table calls them.
void scan_linear(const AlgoCall& c);
void exscan_linear(const AlgoCall& c);
void scan_doubling(const AlgoCall& c);
void exscan_doubling(const AlgoCall& c);
void scan_linear_bytes(int n, int r, size_t count, size_t es, size_t seg, int64_t* sent, int64_t* received);
void scan_doubling_bytes(int n, int r, size_t count, size_t es, size_t seg, int64_t* sent, int64_t* received);
// Auto's crossover for scan and exscan: recursive doubling's ceil(log2 n)
// whole-buffer steps up to this size, the pipeline's n - 1 + K segment
// steps above it (it moves the buffer once per rank, doubling log2 n times).
constexpr size_t kScanDoublingMax = size_t(64) << 10;

namespace {

// ---- the wrappers: AlgoCall -> the algorithm's own arguments ----
void ar_ring(const AlgoCall& c) { ring_all_reduce(c.link, c.plan(), *c.red, c.in, c.out); }
void ar_naive(const AlgoCall& c) { naive_all_reduce(c.link, c.plan(), *c.red, c.in, c.out); }
void ar_rd(const AlgoCall& c) { recursive_doubling_all_reduce(c.link, c.plan(), *c.red, c.in, c.out); }
void ar_hd(const AlgoCall& c) { halving_doubling_all_reduce(c.link, c.plan(), *c.red, c.in, c.out); }
void ar_shm(const AlgoCall& c) { shm_all_reduce(c.link, c.plan(), *c.red, c.in, c.out); }
void ar_shm_flat(const AlgoCall& c) { shm_flat_all_reduce(c.link, c.plan(), *c.red, c.in, c.out); }
void ar_zero_copy(const AlgoCall& c) { zero_copy_all_reduce(c.link, c.plan(), *c.red, c.arena_out); }
void ar_hier(const AlgoCall& c) { hierarchical_all_reduce(c.link, c.count, c.es, *c.red, c.in, c.out, *c.across); }

// reduce_scatter: partial sums of the chunks this rank passes on need a home
// that is neither the caller's input (never written) nor its chunk-sized
// output: the link's work scratch. (Sums only: the engine divides avg.)
char* work_buffer(const AlgoCall& c) { return c.link.scratch(1, c.count * c.es); }
void rs_ring(const AlgoCall& c) { ring_reduce_scatter(c.link, c.plan(), *c.red, c.in, work_buffer(c), c.out); }
void rs_hd(const AlgoCall& c) {
  halving_doubling_reduce_scatter(c.link, c.plan(), *c.red, c.in, work_buffer(c), c.out);
}
void rs_shm(const AlgoCall& c) { shm_reduce_scatter(c.link, c.plan(), *c.red, c.in, c.out); }
void rs_zero_copy(const AlgoCall& c) { zero_copy_reduce_scatter(c.link, c.plan(), *c.red, c.out); }
void rs_hier(const AlgoCall& c) {
  hierarchical_reduce_scatter(c.link, *c.layout, c.count, c.es, *c.red, c.in, c.out, work_buffer(c), *c.across);
}

void ag_ring(const AlgoCall& c) { ring_all_gather(c.link, c.plan(), c.in, c.out); }
void ag_hd(const AlgoCall& c) { halving_doubling_all_gather(c.link, c.plan(), c.in, c.out); }
void ag_shm(const AlgoCall& c) { shm_all_gather(c.link, c.plan(), c.in, c.out); }
void ag_zero_copy(const AlgoCall& c) { zero_copy_all_gather(c.link, c.plan(), c.out); }
void ag_hier(const AlgoCall& c) {
  hierarchical_all_gather(c.link, *c.layout, c.count, c.es, c.in, c.out, work_buffer(c), *c.across);
}

void bc_ring(const AlgoCall& c) { chain_broadcast(c.link, c.count, c.es, c.root, c.out); }
void bc_shm(const AlgoCall& c) { shm_broadcast(c.link, c.count, c.es, c.root, c.out); }
void barrier_ring(const AlgoCall& c) { ring_barrier(c.link); }
void barrier_shm(const AlgoCall& c) { shm_barrier(c.link); }

void red_ring(const AlgoCall& c) { ring_reduce(c.link, c.plan(), *c.red, c.root, c.in, c.out); }
void red_binomial(const AlgoCall& c) { binomial_reduce(c.link, c.plan(), *c.red, c.root, c.in, c.out); }
void red_shm(const AlgoCall& c) { shm_reduce(c.link, c.plan(), *c.red, c.root, c.in, c.out); }
void red_shm_flat(const AlgoCall& c) { shm_flat_reduce(c.link, c.plan(), *c.red, c.root, c.in, c.out); }

// gather's blocks may go to places of their own (the root's output list), scatter's come from them.
BlockSplit blocks(const AlgoCall& c, const uintptr_t* places) {
  return BlockSplit(c.count, c.link.size(), c.counts, places);
}
void gather_linear(const AlgoCall& c) { linear_gather(c.link, blocks(c, c.out_places), c.es, c.root, c.in, c.out); }
void gather_shm(const AlgoCall& c) { shm_gather(c.link, blocks(c, c.out_places), c.es, c.root, c.in, c.out); }
void scatter_linear(const AlgoCall& c) { linear_scatter(c.link, blocks(c, c.in_places), c.es, c.root, c.in, c.out); }
void scatter_shm(const AlgoCall& c) { shm_scatter(c.link, blocks(c, c.in_places), c.es, c.root, c.in, c.out); }

void a2a_pairwise(const AlgoCall& c) {
  const bool splits = c.counts != nullptr;
  const BlockSplit send(c.count, c.link.size(), c.counts, c.in_places);
  const BlockSplit recv(c.count, c.link.size(), c.out_counts, c.out_places);
  // Equal blocks too go as one message per block where messages carry
  // stamps (host memory) and a block fits one: segments would only add
  // rendezvous. Unstamped (device) transports keep the segments, whose
  // sizes the call's fingerprint fixes.
  const bool exact = splits || (c.link.stamped() && c.count / size_t(c.link.size()) * c.es <=
                                                        c.link.shared_transport()->p2p_max_bytes());
  pairwise_all_to_all(c.link, send, recv, exact, c.es, c.in, c.out);
}
void a2a_shm(const AlgoCall& c) {
  if (!c.counts) return shm_all_to_all(c.link, c.count, c.es, c.in, c.out);
  const BlockSplit send(c.count, c.link.size(), c.counts, c.in_places);
  const BlockSplit recv(c.count, c.link.size(), c.out_counts, c.out_places);
  shm_all_to_all_v(c.link, send, recv, c.es, c.in, c.out);
}

// ---- the table ----
constexpr AlgoPath M = AlgoPath::messages, W = AlgoPath::window, H = AlgoPath::hosts;
constexpr uint32_t none = kNeedNothing;

// coll, algo, path, needs, auto_ok, finalize_avg, pair_header, run, traffic closed form
const AlgoRow kRows[] = {
    {Coll::all_reduce, Algo::ring, M, none, true, false, false, ar_ring, "ring"},
    {Coll::all_reduce, Algo::naive, M, none, false, false, false, ar_naive, "naive"},
    {Coll::all_reduce, Algo::recursive_doubling, M, none, true, false, true, ar_rd, "pairwise"},
    {Coll::all_reduce, Algo::halving_doubling, M, none, true, false, true, ar_hd, "pairwise"},
    {Coll::all_reduce, Algo::shm, W, none, true, false, false, ar_shm, "shared"},
    {Coll::all_reduce, Algo::shm_flat, W, none, true, false, false, ar_shm_flat, "shared"},
    {Coll::all_reduce, Algo::zero_copy, W, kNeedArena, true, false, false, ar_zero_copy, "shared"},
    {Coll::all_reduce, Algo::hierarchical, H, none, true, false, false, ar_hier, "hierarchical"},

    {Coll::reduce_scatter, Algo::ring, M, none, true, true, false, rs_ring, "ring"},
    {Coll::reduce_scatter, Algo::halving_doubling, M, kNeedPow2, false, true, true, rs_hd, "pairwise"},
    {Coll::reduce_scatter, Algo::shm, W, none, true, true, false, rs_shm, "shared"},
    {Coll::reduce_scatter, Algo::zero_copy, W, kNeedArena, true, true, false, rs_zero_copy, "shared"},
    {Coll::reduce_scatter, Algo::hierarchical, H, kNeedOrderedHosts, true, true, false, rs_hier, "hierarchical"},

    {Coll::all_gather, Algo::ring, M, none, true, false, false, ag_ring, "ring"},
    {Coll::all_gather, Algo::halving_doubling, M, kNeedPow2, false, false, true, ag_hd, "pairwise"},
    {Coll::all_gather, Algo::shm, W, none, true, false, false, ag_shm, "shared"},
    {Coll::all_gather, Algo::zero_copy, W, kNeedArena, true, false, false, ag_zero_copy, "shared"},
    {Coll::all_gather, Algo::hierarchical, H, kNeedOrderedHosts, true, false, false, ag_hier, "hierarchical"},

    {Coll::broadcast, Algo::ring, M, none, true, false, false, bc_ring, "ring"},
    {Coll::broadcast, Algo::shm, W, none, true, false, false, bc_shm, "shared"},

    {Coll::barrier, Algo::ring, M, none, true, false, false, barrier_ring, "ring"},
    {Coll::barrier, Algo::shm, W, none, true, false, false, barrier_shm, "shared"},

    {Coll::reduce, Algo::ring, M, none, true, false, false, red_ring, "reduce"},
    {Coll::reduce, Algo::binomial, M, none, true, false, false, red_binomial, "reduce"},
    {Coll::reduce, Algo::shm, W, none, true, false, false, red_shm, "reduce"},
    {Coll::reduce, Algo::shm_flat, W, none, true, false, false, red_shm_flat, "reduce"},

    {Coll::gather, Algo::linear, M, none, true, false, false, gather_linear, "gather"},
    {Coll::gather, Algo::shm, W, none, true, false, false, gather_shm, "gather"},

    {Coll::scatter, Algo::linear, M, none, true, false, false, scatter_linear, "scatter"},
    {Coll::scatter, Algo::shm, W, none, true, false, false, scatter_shm, "scatter"},

    {Coll::all_to_all, Algo::pairwise, M, none, true, false, false, a2a_pairwise, "all_to_all"},
    {Coll::all_to_all, Algo::shm, W, kNeedSlotTable, true, false, false, a2a_shm, "all_to_all"},

    // (avg: scan.cpp divides by r + 1 itself; exscan refuses avg)
    {Coll::scan, Algo::recursive_doubling, M, none, true, false, false, scan_doubling, "native", kScanDoublingMax,
     scan_doubling_bytes},
    {Coll::scan, Algo::linear, M, none, true, false, false, scan_linear, "native", SIZE_MAX, scan_linear_bytes},
    {Coll::exscan, Algo::recursive_doubling, M, none, true, false, false, exscan_doubling, "native",
     kScanDoublingMax, scan_doubling_bytes},
    {Coll::exscan, Algo::linear, M, none, true, false, false, exscan_linear, "native", SIZE_MAX, scan_linear_bytes},
};
constexpr size_t kNumRows = sizeof kRows / sizeof kRows[0];

// (coll, algo) -> row: built once, read without locks after (a function-local static).
struct Index {
  const AlgoRow* at[size_t(Coll::kCount)][size_t(Algo::kCount)] = {};
  AlgoPath path[size_t(Algo::kCount)] = {};
  Index() {
    for (const AlgoRow& r : kRows) {
      at[size_t(r.coll)][size_t(r.algo)] = &r;
      path[size_t(r.algo)] = r.path;
    }
  }
};
const Index& index() {
  static const Index idx;
  return idx;
}

}  // namespace

const AlgoRow* find_algorithm(Coll coll, Algo algo) {
  if (int(coll) < 0 || coll >= Coll::kCount || int(algo) < 0 || algo >= Algo::kCount) return nullptr;
  return index().at[size_t(coll)][size_t(algo)];
}

const AlgoRow* algorithm_rows(size_t* n) {
  *n = kNumRows;
  return kRows;
}

AlgoPath algorithm_path(Algo algo) {
  return int(algo) < 0 || algo >= Algo::kCount ? AlgoPath::messages : index().path[size_t(algo)];
}

const char* path_name(AlgoPath p) {
  static const char* names[] = {"messages", "window", "hosts"};
  return names[size_t(p)];
}

const char* need_name(uint32_t bit) {
  switch (bit) {
    case kNeedOrderedHosts: return "ordered_hosts";
    case kNeedArena: return "arena";
    case kNeedSlotTable: return "slot_table";
    case kNeedPow2: return "pow2";
    default: return "?";
  }
}

}  // namespace ringcomm
