// Halving-doubling (Rabenseifner): reduce-scatter by recursive halving, then
// all-gather by recursive doubling, on p = 2^m ranks.
//
// The buffer is cut into p blocks by the split rule (plan.h). Reduce-scatter:
// at step k a rank pairs with the rank 2^(m-1-k) away, keeps the half of its
// current range that holds its own block, sends the other half, and adds the
// partner's copy of the half it keeps. The range halves at every step, so
// after m steps rank v holds the full sum of block v. Example p = 4, blocks
// A B C D, contributions 0..3 (digits: whose contributions are in):
//
//          step 0 (v^2): keep half    step 1 (v^1): keep block
//   r0:    AB (sends CD to r2) -> A02   A0123
//   r1:    AB (sends CD to r3) -> B13   B0123
//   r2:    CD (sends AB to r0) -> C02   C0123
//   r3:    CD (sends AB to r1) -> D13   D0123
//
// The all-gather runs the same pairs in reverse order (distance 1, 2, ...),
// each rank sending everything it holds and doubling it. Each half sends
// (p-1)/p of the buffer, like the ring, but in log2(p) steps instead of p-1:
// the choice for medium buffers. With a number of ranks that is not a power
// of two the all-reduce folds first (pairwise.h); reduce-scatter and
// all-gather on their own need a power of two, where block v is exactly
// rank v's chunk under the split rule.
#include <algorithm>

#include "algorithms/algorithms.h"
#include "algorithms/pairwise.h"

namespace ringcomm {

namespace {
struct Blocks {  // p blocks of `count` elements by the split rule
  size_t count, es;
  int p;
  size_t begin(int b) const { return split_offset(count, p, b); }
  size_t elems(int lo, int hi) const { return begin(hi) - begin(lo); }  // blocks [lo, hi)
};
}  // namespace

// Virtual rank v of p: reduce-scatter `in` into `acc` (full size; may be
// `in` only when... never: in is never written), block v's sum left at `own`.
static void halving(Link& link, const Fold& f, int v, const Reducer& red, const Blocks& B, const char* in, char* acc,
                    char* own, int& unit) {
  const size_t es = B.es;
  int lo = 0, hi = f.p;
  const char* cur = in;  // where our partial sums of [lo, hi) live: `in` until the first step
  for (int k = 0; k < f.steps(); ++k) {
    const int half = (hi - lo) / 2, mask = f.p >> (k + 1);
    const int peer = f.real(v ^ mask);
    int keep_lo = lo, keep_hi = lo + half, send_lo = lo + half, send_hi = hi;
    if (v & mask) std::swap(keep_lo, send_lo), std::swap(keep_hi, send_hi);
    const bool last = k + 1 == f.steps();
    char* dst = last ? own : acc + B.begin(keep_lo) * es;
    link.trace_start(Phase::reduce_scatter, k, peer, send_lo, B.elems(send_lo, send_hi) * es, peer, keep_lo,
                     B.elems(keep_lo, keep_hi) * es);
    // The send and the receive of an exchange share their units (segment j
    // of each in unit base + j): a grouped transport (NCCL) then issues the
    // pair together on both partners. With the receives numbered after the
    // sends, every partner's first group held sends only, and the emulated
    // NCCL path returned wrong sums (N = 2) or deadlocked (N = 3).
    int sent = unit;
    send_all(link, peer, cur + B.begin(send_lo) * es, B.elems(send_lo, send_hi), es, sent);
    recv_reduce(link, red, peer, cur + B.begin(keep_lo) * es, dst, B.elems(keep_lo, keep_hi), es, k, unit);
    unit = std::max(unit, sent);
    link.trace_finish(dst, B.elems(keep_lo, keep_hi) * es);
    cur = acc;  // sends of this step read the other half: disjoint from what the next step writes
    lo = keep_lo, hi = keep_hi;
  }
}

// Virtual rank v of p: block v is in place in `out`; gather all blocks.
static void doubling(Link& link, const Fold& f, int v, const Blocks& B, char* out, int& unit) {
  const size_t es = B.es;
  for (int k = 0; k < f.steps(); ++k) {
    const int size = 1 << k, peer_v = v ^ size, peer = f.real(peer_v);
    const int mine = v & ~(size - 1), theirs = peer_v & ~(size - 1);
    link.trace_start(Phase::all_gather, k, peer, mine, B.elems(mine, mine + size) * es, peer, theirs,
                     B.elems(theirs, theirs + size) * es);
    int sent = unit;  // shared units, as in halving()
    send_all(link, peer, out + B.begin(mine) * es, B.elems(mine, mine + size), es, sent);
    recv_all(link, peer, out + B.begin(theirs) * es, B.elems(theirs, theirs + size), es, k, unit);
    unit = std::max(unit, sent);
    link.trace_finish(out + B.begin(theirs) * es, B.elems(theirs, theirs + size) * es);
  }
}

void halving_doubling_reduce_scatter(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* acc,
                                     char* own) {
  const Fold f(link.size());  // a power of two here (Engine::choose_algorithm)
  const Blocks B{plan.count(), plan.elem_size(), f.p};
  int unit = 0;
  if (f.p == 1) return link.copy(own, in, plan.count() * plan.elem_size());
  halving(link, f, link.rank(), red, B, in, acc, own, unit);
  link.drain();
}

void halving_doubling_all_gather(Link& link, const RingPlan& plan, const char* own, char* out) {
  const Fold f(link.size());
  const Blocks B{plan.count(), plan.elem_size(), f.p};
  int unit = 0;
  link.copy(out + B.begin(link.rank()) * B.es, own, B.elems(link.rank(), link.rank() + 1) * B.es);
  doubling(link, f, link.rank(), B, out, unit);
  link.drain();
}

void halving_doubling_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out) {
  const int rank = link.rank();
  const size_t count = plan.count(), es = plan.elem_size();
  const Fold f(link.size());
  const int v = f.virt(rank);
  const Blocks B{count, es, f.p};
  int unit = 0;
  if (f.p == 1 || count == 0) {
    link.copy(out, in, count * es);
    red.finalize(out, count, link.size());
    link.drain();  // still checks the left neighbour's header
    return;
  }
  const char* src = in;
  if (rank < 2 * f.rem) {  // fold (pairwise.h)
    link.trace_start(Phase::fold, 0, v < 0 ? rank + 1 : -1, -1, v < 0 ? count * es : 0, v < 0 ? -1 : rank - 1, -1,
                     v < 0 ? 0 : count * es);
    if (v < 0)
      send_all(link, rank + 1, in, count, es, unit);
    else
      recv_reduce(link, red, rank - 1, in, out, count, es, 0, unit);
    link.trace_finish(v < 0 ? nullptr : out, v < 0 ? 0 : count * es);
    src = out;
  }
  if (v >= 0) {
    // `out` is the accumulator; in place (src == out) each step reads the
    // half it sends and writes the half it keeps, which never overlap.
    char* own = out + B.begin(v) * es;
    halving(link, f, v, red, B, src, out, own, unit);
    red.finalize(own, B.elems(v, v + 1), link.size());
    link.drain();  // halving sends read parts of `out` that the doubling receives into
    doubling(link, f, v, B, out, unit);
  }
  if (rank < 2 * f.rem) {  // unfold
    link.trace_start(Phase::unfold, 0, v < 0 ? -1 : rank - 1, -1, v < 0 ? 0 : count * es, v < 0 ? rank + 1 : -1, -1,
                     v < 0 ? count * es : 0);
    if (v < 0) {
      link.drain();  // our fold send read `in`, which may be `out`
      recv_all(link, rank + 1, out, count, es, 0, unit);
    } else {
      send_all(link, rank - 1, out, count, es, unit);
    }
    link.trace_finish(v < 0 ? out : nullptr, v < 0 ? count * es : 0);
  }
  link.drain();
}

}  // namespace ringcomm
