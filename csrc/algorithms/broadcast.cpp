// Broadcast and barrier over the same ring.
//
// Broadcast: the root's buffer is cut into segments that flow along the chain
// root -> root+1 -> ... -> root-1; each rank forwards segment k as soon as it
// has arrived, so all hops work at once on different segments and the time
// is about one buffer transfer plus n-2 segment transfers. Every rank but
// root-1 sends the whole buffer once.
//
// Barrier: the header exchange that opens every collective (link.h) is the
// first hop of a token; n-2 more zero-byte hops follow, each sent only after
// the previous one arrived. The k-th arrival proves ranks r-1..r-1-k entered,
// so after n-1 arrivals every rank knows all ranks entered.
#include <algorithm>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/small_array.h"

namespace ringcomm {

void chain_broadcast(Link& link, size_t count, size_t elem_size, int root, char* buf) {
  const int n = link.size(), rank = link.rank();
  if (n == 1) return;
  const int K = whole_buffer_segments(count, elem_size, link.options().segment_bytes);
  const int hop = (rank - root + n) % n;  // distance from the root along the chain
  auto at = [&](int k) { return buf + split_offset(count, K, k) * elem_size; };
  auto bytes = [&](int k) { return split_size(count, K, k) * elem_size; };

  const size_t total = count * elem_size;
  link.trace_start(Phase::broadcast, hop, hop < n - 1 ? link.right() : -1, -1, hop < n - 1 ? total : 0,
                   hop > 0 ? link.left() : -1, -1, hop > 0 ? total : 0);
  if (hop == 0) {
    for (int k = 0; k < K; ++k) link.send(link.right(), at(k), bytes(k), k);
  } else {
    const int window = std::max(2, link.options().window);
    SmallArray<Request*> recv(window);  // receives in flight: segment k uses entry k % window
    for (int k = 0; k < std::min(window, K); ++k) recv[k] = link.recv(link.left(), at(k), bytes(k), k);
    for (int k = 0; k < K; ++k) {
      link.wait(recv[k % window], "a broadcast segment", hop - 1, k);
      if (k + window < K)
        recv[(k + window) % window] = link.recv(link.left(), at(k + window), bytes(k + window), k + window);
      if (hop < n - 1) link.send(link.right(), at(k), bytes(k), k);
    }
  }
  link.drain();
  link.trace_finish(buf, total);
}

void ring_barrier(Link& link) {
  link.await_header();  // hop 0: the left neighbour has entered
  for (int hop = 1; hop < link.size() - 1; ++hop) {
    link.send_token(link.right());
    link.wait(link.recv_token(link.left()), "the barrier token", hop, 0);
  }
  link.drain();
}

}  // namespace ringcomm
