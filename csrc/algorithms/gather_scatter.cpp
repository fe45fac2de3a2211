// Gather and scatter through the root, linearly.
//
// Gather: every rank q != root sends its block (counts[q] elements) to the
// root, which receives them straight into their places in its output, one
// rank after the other (root+1, root+2, ...), each block cut into segments of
// at most segment_bytes. Scatter is the same drawing with the arrows
// reversed: the root sends block q to rank q.
//
//        gather                         scatter
//   r1 ──b1──┐                     ┌──b1──> r1
//   r2 ──b2──┼──> root: b0 b1 b2 b3   root ──┼──b2──> r2
//   r3 ──b3──┘                     └──b3──> r3
//
//   | step | the root                               | rank q = root + step + 1 |
//   |------|----------------------------------------|--------------------------|
//   | s    | receives (gather) / sends (scatter) b_q | sends / receives b_q     |
//
// Why linear and not a binomial tree: a tree moves each block through
// log2 n hops (an inner rank forwards its whole subtree), so the bytes sent
// in total grow to about (n/2) log2 n blocks, while here every block moves
// once, straight to where it belongs; the root's link carries the n-1 blocks
// either way. The tree only saves steps (log2 n against n-1), which pays for
// tiny blocks on many ranks: not worth a second algorithm yet (the cost
// model's alpha at 2-8 ranks is a few microseconds). Per-rank counts
// (gatherv, scatterv) come free: the blocks never mix.
#include "algorithms/algorithms.h"
#include "algorithms/pairwise.h"

namespace ringcomm {

void linear_gather(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out) {
  const int n = link.size(), rank = link.rank();
  if (rank != root) {
    int unit = 0;
    const size_t bytes = blocks.count(rank) * es;
    link.trace_start(Phase::gather, (rank - root - 1 + n) % n, root, rank, bytes, -1, -1, 0);
    send_all(link, root, in, blocks.count(rank), es, unit);
    link.drain();
    link.trace_finish(nullptr, 0);
    return;
  }
  link.copy(blocks.at(out, root, es), in, blocks.count(root) * es);
  for (int step = 0; step < n - 1; ++step) {
    const int q = (root + step + 1) % n;
    int unit = 0;
    char* at = blocks.at(out, q, es);
    link.trace_start(Phase::gather, step, -1, -1, 0, q, q, blocks.count(q) * es);
    recv_all(link, q, at, blocks.count(q), es, step, unit);
    link.trace_finish(at, blocks.count(q) * es);
  }
  link.drain();
}

void linear_scatter(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out) {
  const int n = link.size(), rank = link.rank();
  if (rank != root) {
    int unit = 0;
    const size_t bytes = blocks.count(rank) * es;
    link.trace_start(Phase::scatter, (rank - root - 1 + n) % n, -1, -1, 0, root, rank, bytes);
    recv_all(link, root, out, blocks.count(rank), es, 0, unit);
    link.trace_finish(out, bytes);
    link.drain();
    return;
  }
  for (int step = 0; step < n - 1; ++step) {
    const int q = (root + step + 1) % n;
    int unit = 0;
    link.trace_start(Phase::scatter, step, q, q, blocks.count(q) * es, -1, -1, 0);
    send_all(link, q, blocks.at(in, q, es), blocks.count(q), es, unit);
    link.trace_finish(nullptr, 0);
  }
  link.copy(out, blocks.at(in, root, es), blocks.count(root) * es);
  link.drain();
}

}  // namespace ringcomm
