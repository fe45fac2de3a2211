// Ring all-gather.
//
// Each rank starts with its own chunk (chunk r on rank r) and the ring
// circulates them: at step s rank r sends chunk r-s to the right and receives
// chunk r-s-1 from the left, straight into its place in the output, and
// forwards it at step s+1. After n-1 steps every rank holds every chunk.
// Example n = 4 (what each rank receives):
//
//        step 0   step 1   step 2
//   r0:   D        C        B        (r0 had A)
//   r1:   A        D        C        (r1 had B)
//   r2:   B        A        D
//   r3:   C        B        A
//
// Each rank sends n-1 chunks: (n-1)/n of the full buffer. Segments are
// pipelined as in reduce_scatter.cpp.
#include <algorithm>

#include "algorithms/algorithms.h"
#include "algorithms/small_array.h"

namespace ringcomm {

void ring_all_gather(Link& link, const RingPlan& plan, const char* own, char* out) {
  const int n = plan.nranks(), rank = link.rank();
  const size_t es = plan.elem_size();
  char* own_place = out + plan.chunk_begin(rank) * es;
  if (n == 1) {
    link.copy(own_place, own, plan.chunk_count(rank) * es);
    return;
  }
  const int K = plan.segments(), steps = n - 1, units = steps * K;
  const int window = std::max(2, link.options().window);

  auto out_at = [&](int c, int k) { return out + plan.seg_begin(c, k) * es; };
  auto bytes = [&](int c, int k) { return plan.seg_count(c, k) * es; };

  // Step 0 sends our own chunk.
  for (int k = 0; k < K; ++k)
    link.send(link.right(), own + (plan.seg_begin(rank, k) - plan.chunk_begin(rank)) * es, bytes(rank, k), k);
  link.copy(own_place, own, plan.chunk_count(rank) * es);  // overlaps the sends

  SmallArray<Request*> recv(window);  // receives in flight: unit u uses entry u % window
  auto post_recv = [&](int u) {
    const int c = plan.ag_recv_chunk(rank, u / K), k = u % K;
    recv[u % window] = link.recv(link.left(), out_at(c, k), bytes(c, k), u);
  };
  for (int u = 0; u < std::min(window, units); ++u) post_recv(u);

  for (int u = 0; u < units; ++u) {
    const int step = u / K, k = u % K, c = plan.ag_recv_chunk(rank, step);
    if (k == 0) {
      const int sent = plan.ag_send_chunk(rank, step);
      link.trace_start(Phase::all_gather, step, link.right(), sent, plan.chunk_count(sent) * es, link.left(), c,
                       plan.chunk_count(c) * es);
    }
    link.wait(recv[u % window], "an all-gather segment", step, k);
    if (u + window < units) post_recv(u + window);
    if (step + 1 < steps) link.send(link.right(), out_at(c, k), bytes(c, k), u + K);
    if (k == K - 1) link.trace_finish(out_at(c, 0), plan.chunk_count(c) * es);
  }
  link.drain();
}

}  // namespace ringcomm
