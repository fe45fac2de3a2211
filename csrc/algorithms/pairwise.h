// Pairwise steps: the building blocks of the algorithms in which a rank
// talks to one partner at a time (recursive doubling, halving-doubling), and
// the fold that lets them run on a number of ranks that is not a power of two.
//
// Fold (n = p + rem, p the largest power of two <= n): among the first 2*rem
// ranks, each even rank hands its whole buffer to the odd rank after it and
// sits out; the odd one adds it to its own and stands in for both. The p
// ranks that remain are renumbered 0..p-1 ("virtual ranks") and run the
// power-of-two algorithm; at the end each odd rank hands the result back.
//
//   n = 6, p = 4, rem = 2:   real  0  1  2  3  4  5
//                            fold  +->1  +->3  .  .
//                            virt     0     1  2  3
//
// This costs two extra steps of a whole buffer on 2*rem ranks, which is why
// the cost model prefers the ring for large buffers there.
#pragma once

#include <algorithm>
#include <vector>

#include "core/link.h"
#include "algorithms/plan.h"
#include "core/reducer.h"
#include "algorithms/small_array.h"

namespace ringcomm {

struct Fold {
  int n, p, rem;
  explicit Fold(int n_) : n(n_), p(1), rem(0) {
    while (p * 2 <= n) p *= 2;
    rem = n - p;
  }
  // This rank's virtual rank, or -1 if it sits out (an even rank < 2*rem).
  int virt(int r) const { return r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem; }
  int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  int steps() const {
    int s = 0;
    while ((1 << s) < p) ++s;
    return s;
  }
};

// Whole-buffer messages are cut into segments of at most segment_bytes, like
// the ring's; both sides cut the same count alike. `unit` numbers the
// messages (transport.h) and is advanced past those of the call.

// Send `count` elements from `src` to `peer` (completion: Link::drain).
void send_all(Link& link, int peer, const char* src, size_t count, size_t es, int& unit);
// Receive `count` elements from `peer` into `dst`, and wait for them.
void recv_all(Link& link, int peer, char* dst, size_t count, size_t es, int step, int& unit);
// Receive `count` elements from `peer` (into scratch slots, a segment at a
// time) and store dst = a op theirs as they arrive (operands in rank order:
// the lower rank's first, so two partners compute the same bits). If `sent` is given, its
// segment k is waited for before dst's segment k is written (dst may then
// be the buffer those sends read: an in-place exchange).
void recv_reduce(Link& link, const Reducer& red, int peer, const char* a, char* dst, size_t count, size_t es,
                 int step, int& unit, SmallArray<Request*>* sent = nullptr);
// Both at once with one partner: send `count` from `src`, dst = a op theirs.
void exchange_reduce(Link& link, const Reducer& red, int peer, const char* src, const char* a, char* dst,
                     size_t count, size_t es, int step, int& unit);

}  // namespace ringcomm
