// Master-centric all-reduce: the scheme of the first DataParallel, kept as a
// real algorithm so its cost can be measured on the same ledger as the ring.
//
//   gather : every rank r > 0 sends its whole buffer to rank 0;
//            rank 0 adds them up, one rank after the other;
//   scatter: rank 0 sends the whole result back to every rank.
//
// Rank 0 receives (n-1) buffers and sends (n-1) buffers: its traffic grows
// with n, while every other rank moves one buffer each way. Compare the ring
// (all_reduce.cpp), where every rank sends 2(n-1)/n of a buffer.
#include <algorithm>

#include "algorithms/algorithms.h"

namespace ringcomm {

void naive_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out) {
  const int n = link.size(), rank = link.rank();
  const size_t es = plan.elem_size(), count = plan.count(), total = count * es;
  if (out != in) link.copy(out, in, total);  // on a device: enqueued, in order
  if (n == 1) {
    red.finalize(out, count, n);
    return;
  }
  // Whole buffers move in segments of at most segment_bytes, like the ring's.
  const int K = whole_buffer_segments(count, es, link.options().segment_bytes);
  auto seg_at = [&](char* base, int k) { return base + split_offset(count, K, k) * es; };
  auto seg_bytes = [&](int k) { return split_size(count, K, k) * es; };
  auto seg_count = [&](int k) { return split_size(count, K, k); };

  if (rank == 0) {
    char* slot = link.scratch(0, split_size(count, K, 0) * es);
    for (int src = 1; src < n; ++src) {
      link.trace_start(Phase::gather, src - 1, -1, -1, 0, src, src, total);
      for (int k = 0; k < K; ++k) {
        Request* r = link.recv(src, slot, seg_bytes(k));
        link.wait(r, "its buffer for the master-centric gather", src - 1, k);
        red.reduce(seg_at(out, k), seg_at(out, k), slot, seg_count(k));
      }
      link.trace_finish(out, total);
    }
    red.finalize(out, count, n);
    for (int dst = 1; dst < n; ++dst) {
      link.trace_start(Phase::scatter, dst - 1, dst, 0, total, -1, -1, 0);
      for (int k = 0; k < K; ++k) link.send(dst, seg_at(out, k), seg_bytes(k));
      link.drain();
      link.trace_finish(nullptr, 0);
    }
  } else {
    link.trace_start(Phase::gather, 0, 0, rank, total, -1, -1, 0);
    for (int k = 0; k < K; ++k) link.send(0, seg_at(out, k), seg_bytes(k));
    link.drain();  // `out` is overwritten by the result next
    link.trace_finish(nullptr, 0);
    link.trace_start(Phase::scatter, 0, -1, -1, 0, 0, 0, total);
    for (int k = 0; k < K; ++k) {
      Request* r = link.recv(0, seg_at(out, k), seg_bytes(k));
      link.wait(r, "the result of the master-centric reduction", 0, k);
    }
    link.trace_finish(out, total);
  }
  link.drain();
}

}  // namespace ringcomm
