// The collective algorithms. Written once, against Link (messages to ring
// neighbours) and Reducer (arithmetic); they never name a transport or a
// device. One algorithm per file; see docs in each file's opening comment.
#pragma once

#include "core/link.h"
#include "algorithms/plan.h"
#include "core/reducer.h"

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

// Barrier: a zero-byte token passed n-1 hops around the ring (broadcast.cpp).
void ring_barrier(Link& link);

}  // namespace ringcomm
