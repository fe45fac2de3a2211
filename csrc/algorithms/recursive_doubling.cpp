// Recursive doubling all-reduce: log2(p) steps, whole buffers.
//
// At step k every rank exchanges its whole current buffer with the rank whose
// number differs in bit k (r XOR 2^k) and adds what it got. After step k each
// rank holds the sum over a group of 2^(k+1) ranks; after log2(p) steps, the
// sum over all. Example p = 4, contributions a b c d:
//
//            step 0 (r^1)        step 1 (r^2)
//   r0:  a   <-> r1:  a+b        <-> r2:  (a+b)+(c+d)
//   r1:  b   <-> r0:  a+b        <-> r3:  (a+b)+(c+d)
//   r2:  c   <-> r3:  c+d        <-> r0:  (c+d)+(a+b)
//   r3:  d   <-> r2:  c+d        <-> r1:  (c+d)+(a+b)
//
// Every rank ends with the same bits: both partners combine the same two
// values in the same order (the lower rank's first: max(1, NaN) and
// max(NaN, 1) differ, as do NaN payloads of a sum), so every step is the same
// computation on both sides.
// Each rank sends log2(p) whole buffers, against 2(n-1)/n for the ring, but
// waits for only log2(p) messages instead of 2(n-1): the choice for small
// buffers. A number of ranks that is not a power of two is folded first
// (pairwise.h).
#include "algorithms/algorithms.h"
#include "algorithms/pairwise.h"

namespace ringcomm {

namespace {

// Fold (ranks below 2 * rem): the even rank of each pair sends its input to
// the odd one (v >= 0), which adds it and takes part in the exchanges.
void fold(Link& link, const Reducer& red, int rank, int v, const char* in, char* out, size_t count, size_t es,
          int& unit) {
  const size_t total = count * es;
  link.trace_start(Phase::fold, 0, v < 0 ? rank + 1 : -1, -1, v < 0 ? total : 0, v < 0 ? -1 : rank - 1, -1,
                   v < 0 ? 0 : total);
  if (v < 0)
    send_all(link, rank + 1, in, count, es, unit);
  else
    recv_reduce(link, red, rank - 1, in, out, count, es, 0, unit);
  link.trace_finish(v < 0 ? nullptr : out, v < 0 ? 0 : total);
}

// The log2(p) exchanges of the virtual ranks.
void exchanges(Link& link, const Reducer& red, const Fold& f, int v, const char* cur, char* out, size_t count,
               size_t es, int& unit) {
  const size_t total = count * es;
  for (int k = 0; k < f.steps(); ++k) {
    const int peer = f.real(v ^ (1 << k));
    link.trace_start(Phase::exchange, k, peer, -1, total, peer, -1, total);
    exchange_reduce(link, red, peer, cur, cur, out, count, es, k, unit);
    link.trace_finish(out, total);
    cur = out;
  }
  red.finalize(out, count, link.size());
}

// Unfold: the result goes back to the rank that sat out.
void unfold(Link& link, int rank, int v, char* out, size_t count, size_t es, int& unit) {
  const size_t total = count * es;
  link.trace_start(Phase::unfold, 0, v < 0 ? -1 : rank - 1, -1, v < 0 ? 0 : total, v < 0 ? rank + 1 : -1, -1,
                   v < 0 ? total : 0);
  if (v < 0) {
    link.drain();  // our fold send read `in`, which may be `out`
    recv_all(link, rank + 1, out, count, es, 0, unit);
  } else {
    send_all(link, rank - 1, out, count, es, unit);
  }
  link.trace_finish(v < 0 ? out : nullptr, v < 0 ? total : 0);
}

}  // namespace

void recursive_doubling_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in,
                                   char* out) {
  const int rank = link.rank();
  const size_t count = plan.count(), es = plan.elem_size(), total = count * es;
  const Fold f(link.size());
  const int v = f.virt(rank);
  int unit = 0;
  if (f.p == 1 || count == 0) {  // one rank (or nothing to add): a copy
    link.copy(out, in, total);
    red.finalize(out, count, link.size());
    link.drain();  // still checks the left neighbour's header: a rank with another count must hear of it
    return;
  }
  const bool folded = rank < 2 * f.rem;
  if (folded) fold(link, red, rank, v, in, out, count, es, unit);
  if (v >= 0) exchanges(link, red, f, v, folded ? out : in, out, count, es, unit);  // `in` is only read, at the first step
  if (folded) unfold(link, rank, v, out, count, es, unit);
  link.drain();
}

}  // namespace ringcomm
