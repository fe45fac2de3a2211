// Ring plan: the pure offset arithmetic of the ring collectives. No I/O, no
// transport, no threads: everything here is a function of (count, n, sizes)
// and is unit-tested on its own (tests/test_plan.py).
//
// Words used throughout csrc/ (as in Gloo and NCCL):
//   chunk   : the buffer is split into n chunks, one per rank, by the split
//             rule: chunk c holds count/n elements, plus one if c < count%n
//             (numpy.array_split). Rank r owns chunk r after reduce-scatter.
//   segment : each chunk is cut into the same number K of segments (again by
//             the split rule); a segment is one message on the wire. Giving
//             every chunk the same K lets segment k of step s be forwarded as
//             segment k of step s+1, which is what pipelines a ring step.
//   step    : one hop around the ring; a pass has n-1 steps.
#pragma once

#include <cstddef>

namespace ringcomm {

// Split `count` items into `parts` parts by the split rule: part i's size/offset.
inline size_t split_size(size_t count, size_t parts, size_t i) {
  return count / parts + (i < count % parts ? 1 : 0);
}
inline size_t split_offset(size_t count, size_t parts, size_t i) {
  size_t base = count / parts, extra = count % parts;
  return i * base + (i < extra ? i : extra);
}

class RingPlan {
 public:
  // segment_bytes: the largest message the plan may produce (>= one element).
  RingPlan(size_t count, int nranks, size_t elem_size, size_t segment_bytes);

  size_t count() const { return count_; }
  int nranks() const { return n_; }
  size_t elem_size() const { return elem_; }
  int segments() const { return k_; }

  size_t chunk_begin(int c) const { return split_offset(count_, n_, c); }
  size_t chunk_count(int c) const { return split_size(count_, n_, c); }
  // Segment k of chunk c, as an element offset into the whole buffer and a length.
  size_t seg_begin(int c, int k) const { return chunk_begin(c) + split_offset(chunk_count(c), k_, k); }
  size_t seg_count(int c, int k) const { return split_size(chunk_count(c), k_, k); }

  // The ring schedule. Reduce-scatter: at step s rank r sends chunk r-s-1 and
  // receives chunk r-s-2, so after n-1 steps it holds the full reduction of
  // chunk r. All-gather: at step s rank r sends chunk r-s and receives r-s-1.
  // In both, what a rank receives at step s is what it sends at step s+1.
  int rs_send_chunk(int rank, int step) const { return mod(rank - step - 1); }
  int rs_recv_chunk(int rank, int step) const { return mod(rank - step - 2); }
  int ag_send_chunk(int rank, int step) const { return mod(rank - step); }
  int ag_recv_chunk(int rank, int step) const { return mod(rank - step - 1); }

 private:
  int mod(int x) const { return ((x % n_) + n_) % n_; }
  size_t count_;
  int n_;
  size_t elem_;
  int k_;
};

// Segments for a whole (unchunked) buffer, as used by the pipelined broadcast.
inline int whole_buffer_segments(size_t count, size_t elem_size, size_t segment_bytes) {
  size_t per = segment_bytes / elem_size;
  if (per == 0) per = 1;
  size_t k = (count + per - 1) / per;
  return k == 0 ? 1 : int(k);
}

}  // namespace ringcomm
