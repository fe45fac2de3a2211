// All-reduce = reduce-scatter, then all-gather, on the same buffer.
//
// After the reduce-scatter (reduce_scatter.cpp) rank r holds the complete
// reduction of chunk r; the all-gather (all_gather.cpp) then hands every
// chunk to every rank. Each half sends (n-1)/n of the buffer per rank, so
// the all-reduce sends 2(n-1)/n: for large n, about twice the buffer,
// independent of n. For avg, the sum is divided by n once, on the owner,
// between the halves, so each element is divided exactly once.
#include "algorithms/algorithms.h"

namespace ringcomm {

void ring_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out) {
  const int rank = link.rank();
  char* own = out + plan.chunk_begin(rank) * plan.elem_size();
  // Out of place, `out` doubles as the accumulator, so `in` is never written.
  ring_reduce_scatter(link, plan, red, in, out, own);
  red.finalize(own, plan.chunk_count(rank), plan.nranks());
  ring_all_gather(link, plan, own, out);
}

}  // namespace ringcomm
