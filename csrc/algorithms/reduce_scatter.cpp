// Ring reduce-scatter.
//
// The buffer is cut into n chunks (plan.h), and the ranks sit on a ring where
// rank r sends only to r+1 and receives only from r-1. In each of the n-1
// steps every rank sends one chunk to the right and receives one from the
// left, adds its own contribution to what arrived, and forwards that partial
// sum at the next step. Chunk c starts at rank c+1 and travels n-1 hops,
// collecting one contribution per hop, so it is complete when it reaches
// rank c. Example n = 4, chunks A B C D (rank r ends with chunk r):
//
//        step 0        step 1          step 2
//   r0:  send D  ->    send C+D   ->   send B+C+D     -> r1 ends with B (all 4)
//   r1:  send A  ->    send D+A   ->   send C+D+A     -> r2 ends with C
//   r2:  send B  ->    send A+B   ->   send D+A+B     -> r3 ends with D
//   r3:  send C  ->    send B+C   ->   send A+B+C     -> r0 ends with A
//
// (rank r sends chunk r-s-1 at step s and receives chunk r-s-2.) Each rank
// sends n-1 chunks, (n-1)/n of the buffer, whatever n is: this is why the
// ring is bandwidth-optimal.
//
// Pipelining: every chunk is cut into K segments. As soon as segment k of
// step s has arrived and been reduced, it is sent on as segment k of step
// s+1, while later segments are still on the wire; `window` receives are
// kept in flight, so reduction overlaps transfer.
#include <algorithm>

#include "algorithms/algorithms.h"
#include "algorithms/small_array.h"

namespace ringcomm {

void ring_reduce_scatter(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* acc,
                         char* own) {
  const int n = plan.nranks(), rank = link.rank();
  const size_t es = plan.elem_size();
  if (n == 1) {  // the single chunk is the whole buffer, already "reduced"
    link.copy(own, in, plan.count() * es);
    return;
  }
  const int K = plan.segments(), steps = n - 1, units = steps * K;
  const int window = std::max(2, link.options().window);

  auto in_at = [&](int c, int k) { return in + plan.seg_begin(c, k) * es; };
  auto acc_at = [&](int c, int k) {  // where the partial result of (chunk c, segment k) lives
    size_t off = plan.seg_begin(c, k);
    return c == rank ? own + (off - plan.chunk_begin(rank)) * es : acc + off * es;
  };
  auto bytes = [&](int c, int k) { return plan.seg_count(c, k) * es; };

  // A segment is received straight into the accumulator, except where the
  // accumulator is the input itself (in-place all_reduce): there our own
  // contribution must survive until it is added, so it lands in a slot.
  // Slots hold the largest segment. A slot is read together with the
  // segment it is added to, so it starts at that segment's address modulo
  // 16 (on a 256-byte-aligned stride): a device reduction then shares one
  // misalignment across its pointers and vectorizes (vector_split.h).
  const size_t slot_bytes = round_up(plan.seg_count(0, 0) * es + 16, 256);
  char* slots = nullptr;
  // Receives in flight: at most `window`, so unit u uses entry u % window.
  SmallArray<Request*> recv(window);
  SmallArray<const char*> arrived(window);
  auto post_recv = [&](int u) {
    const int step = u / K, k = u % K, c = plan.rs_recv_chunk(rank, step);
    char* dst = acc_at(c, k);
    if (dst == in_at(c, k)) {
      // (u % window < units: fewer units than the window need fewer slots,
      // which matters with a GPU's 64 MiB segments, config.py)
      if (!slots) slots = link.scratch(0, size_t(std::min(window, units)) * slot_bytes);
      dst = slots + size_t(u % window) * slot_bytes + reinterpret_cast<uintptr_t>(in_at(c, k)) % 16;
    }
    arrived[u % window] = dst;
    recv[u % window] = link.recv(link.left(), dst, bytes(c, k), u);
  };

  // Step 0 sends our own contribution, straight from the input.
  const int first = plan.rs_send_chunk(rank, 0);
  for (int k = 0; k < K; ++k) link.send(link.right(), in_at(first, k), bytes(first, k), k);
  for (int u = 0; u < std::min(window, units); ++u) post_recv(u);

  for (int u = 0; u < units; ++u) {
    const int step = u / K, k = u % K, c = plan.rs_recv_chunk(rank, step);
    if (k == 0) {
      const int sent = plan.rs_send_chunk(rank, step);
      link.trace_start(Phase::reduce_scatter, step, link.right(), sent, plan.chunk_count(sent) * es, link.left(), c,
                       plan.chunk_count(c) * es);
    }
    link.wait(recv[u % window], "a reduce-scatter segment", step, k);
    red.reduce(acc_at(c, k), in_at(c, k), arrived[u % window], plan.seg_count(c, k));
    if (u + window < units) post_recv(u + window);  // reuses the slot just consumed
    // What arrived at step s is what we send at step s+1 (plan.h).
    if (step + 1 < steps) link.send(link.right(), acc_at(c, k), bytes(c, k), u + K);
    if (k == K - 1) link.trace_finish(acc_at(c, 0), plan.chunk_count(c) * es);  // the partial result it holds
  }
  link.drain();  // our sends read acc; the caller may overwrite it next
}

}  // namespace ringcomm
