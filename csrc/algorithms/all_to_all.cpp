// All-to-all by pairwise exchange: rank r's block p goes to rank p, and
// rank r's output holds, in rank order, the block each rank sent it.
//
// n-1 steps; at step k every rank sends one block and receives one. On a
// power of two the partner is r XOR k both ways (a true exchange); else the
// block goes to (r + k) mod n and comes from (r - k) mod n. n = 4, block
// "q>p" = rank q's block for rank p:
//
//   | step | partner | r0 gets | r1 gets | r2 gets | r3 gets |
//   |------|---------|---------|---------|---------|---------|
//   | -    | itself  | 0>0     | 1>1     | 2>2     | 3>3     |  (a local copy)
//   | 1    | r XOR 1 | 1>0     | 0>1     | 3>2     | 2>3     |
//   | 2    | r XOR 2 | 2>0     | 3>1     | 0>2     | 1>3     |
//   | 3    | r XOR 3 | 3>0     | 2>1     | 1>2     | 0>3     |
//
// Each rank sends and receives n-1 blocks: (n-1)/n of its buffer with equal
// blocks, to every peer once.
//
// Equal blocks (count / n each, the same on every rank) travel as one
// message per block too where messages carry stamps and a block fits one
// (the engine passes exact; fewer rendezvous than segments), else they are
// cut into segments like every whole-buffer message. Per-peer splits are known only
// to their sender (send) and receiver (recv_splits): each block then travels
// as one message, sent even when empty (Link::send_exact), whose size is
// part of its stamp (or, on a device, of the sender's fingerprint), so a
// disagreement, an empty block included, is a MismatchError naming both
// sizes and no byte lands past a block (a receive never matches a larger
// message). The block a rank sends itself must fit (ringcomm/door.py).
// With splits, blocks may also sit in arrays of their own (BlockSplit::at:
// torch's list form), never staged through one buffer.
#include "algorithms/algorithms.h"
#include "algorithms/pairwise.h"

namespace ringcomm {

void pairwise_all_to_all(Link& link, const BlockSplit& send, const BlockSplit& recv, bool exact, size_t es, const char* in,
                         char* out) {
  const int n = link.size(), rank = link.rank();
  const bool pow2 = (n & (n - 1)) == 0;
  link.copy(recv.at(out, rank, es), send.at(in, rank, es), send.count(rank) * es);
  // Equal blocks: the same segments for every block (for the unit numbers).
  const int K = exact ? 1 : whole_buffer_segments(send.count(rank), es, link.options().segment_bytes);
  for (int k = 1; k < n; ++k) {
    const int to = pow2 ? rank ^ k : (rank + k) % n;
    const int from = pow2 ? rank ^ k : (rank - k + n) % n;
    const size_t out_bytes = send.count(to) * es, in_bytes = recv.count(from) * es;
    char* at = recv.at(out, from, es);
    link.trace_start(Phase::all_to_all, k - 1, to, to, out_bytes, from, rank, in_bytes);
    if (exact) {
      // One unit per step: a grouped transport (NCCL) issues the pair together.
      link.send_exact(to, send.at(in, to, es), out_bytes, k - 1);
      link.wait(link.recv_exact(from, at, in_bytes, k - 1), "its all_to_all block", k - 1, 0);
    } else {
      int unit = (k - 1) * K;
      send_all(link, to, send.at(in, to, es), send.count(to), es, unit);
      unit = (k - 1) * K;
      recv_all(link, from, at, recv.count(from), es, k - 1, unit);
    }
    link.trace_finish(at, in_bytes);
  }
  link.drain();
}

}  // namespace ringcomm
