// Reduce: the reduction of every rank's buffer, on one rank (the root).
// Two algorithms; Engine::choose_algorithm picks by size (the limit comes
// from the cost model, ringcomm/tuning/selection.py reduce_limit).
//
// Binomial tree (`binomial_reduce`, small buffers). Ranks are renumbered
// relative to the root, v = (rank - root) mod n. At step k (m = 2^k) a rank
// whose bit k is set sends its partial result to v - m and is done; a rank
// below m's multiple receives from v + m (when that exists) and combines.
// After ceil(log2 n) steps the root (v = 0) holds everything. n = 6:
//
//        v:  0    1    2    3    4    5
//   step 0:  0 <- 1    2 <- 3    4 <- 5        m = 1
//   step 1:  0 <------ 2                       m = 2   (4 has no v+2 = 6)
//   step 2:  0 <---------------- 4             m = 4
//
//   | step | sends (and is done) | receives from v + m and combines |
//   |------|---------------------|----------------------------------|
//   | 0    | v odd               | v even, v + 1 < n                |
//   | 1    | v = 2 mod 4         | v = 0 mod 4, v + 2 < n           |
//   | k    | v = 2^k mod 2^(k+1) | v = 0 mod 2^(k+1), v + 2^k < n   |
//
// Every rank but the root sends its whole buffer once; a rank receives one
// whole buffer per child (the root: ceil(log2 n) of them). Few steps, many
// bytes on the root: the choice for small buffers.
//
// Ring reduce-scatter, then a gather (`ring_reduce`, large buffers:
// Rabenseifner's reduce with the ring's reduce-scatter). The ring
// reduce-scatter (reduce_scatter.cpp) leaves chunk r of the reduction on
// rank r; then every rank but the root sends that chunk to the root:
//
//   | phase          | rank r sends                     | the root receives        |
//   |----------------|----------------------------------|--------------------------|
//   | reduce-scatter | n-1 chunks to r+1 (as the ring)  | n-1 chunks from root-1   |
//   | gather         | chunk r to the root (r != root)  | chunk q from each q      |
//
// Each rank sends about (n-1)/n + 1/n of the buffer, the root receives
// about 2(n-1)/n of it: no rank moves more than about twice the buffer.
// avg: each chunk's owner divides its complete chunk once (Reducer::finalize).
#include "algorithms/algorithms.h"
#include "algorithms/pairwise.h"

namespace ringcomm {

void binomial_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out) {
  const int n = link.size(), rank = link.rank();
  const size_t count = plan.count(), es = plan.elem_size(), total = count * es;
  const int v = (rank - root + n) % n;
  const int K = whole_buffer_segments(count, es, link.options().segment_bytes);
  // The partial result: the root's output, else scratch (the input is never written).
  char* acc = rank == root ? out : link.scratch(1, total);
  const char* cur = in;  // what this rank holds so far (its input until a child's part arrives)
  int step = 0;
  for (int m = 1; m < n; m <<= 1, ++step) {
    int unit = step * K;  // both partners number this step's messages alike (grouped transports)
    if (v & m) {  // send the partial result to the parent and stop
      const int parent = (v - m + root) % n;
      link.trace_start(Phase::tree, step, parent, -1, total, -1, -1, 0);
      send_all(link, parent, cur, count, es, unit);
      link.trace_finish(nullptr, 0);
      break;
    }
    if (v + m < n) {  // a child: combine its partial result
      const int child = (v + m + root) % n;
      link.trace_start(Phase::tree, step, -1, -1, 0, child, -1, total);
      recv_reduce(link, red, child, cur, acc, count, es, step, unit);
      link.trace_finish(acc, total);
      cur = acc;
    }
  }
  if (rank == root) {
    if (cur != out) link.copy(out, cur, total);  // no child (n == 1)
    red.finalize(out, count, n);
  }
  link.drain();  // checks the left neighbour's header too, when nothing came from it
}

void ring_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out) {
  const int n = link.size(), rank = link.rank();
  const size_t es = plan.elem_size();
  // The accumulator: the root's output (in place or not: the ring allows
  // acc == in), else scratch.
  char* acc = rank == root ? out : link.scratch(1, plan.count() * es);
  char* own = acc + plan.chunk_begin(rank) * es;
  ring_reduce_scatter(link, plan, red, in, acc, own);
  red.finalize(own, plan.chunk_count(rank), n);
  const int gather_unit = 1 << 24;  // after every unit of the reduce-scatter
  if (rank != root) {
    int unit = gather_unit;
    link.trace_start(Phase::gather, 0, root, rank, plan.chunk_count(rank) * es, -1, -1, 0);
    send_all(link, root, own, plan.chunk_count(rank), es, unit);
    link.drain();
    link.trace_finish(nullptr, 0);
    return;
  }
  for (int hop = 1; hop < n; ++hop) {
    const int q = (root + hop) % n;
    int unit = gather_unit;
    const size_t bytes = plan.chunk_count(q) * es;
    link.trace_start(Phase::gather, hop - 1, -1, -1, 0, q, q, bytes);
    recv_all(link, q, acc + plan.chunk_begin(q) * es, plan.chunk_count(q), es, hop - 1, unit);
    link.trace_finish(acc + plan.chunk_begin(q) * es, bytes);
  }
  link.drain();
}

}  // namespace ringcomm
