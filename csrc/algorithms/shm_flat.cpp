// The one-sync all-reduce and reduce in the shared-memory window ("shm_flat";
// for small buffers; what every shm algorithm shares: shm_internal.h).
//
// Every rank copies its whole input into its slot, syncs once, and reduces
// all N slots itself (all_reduce), or the root alone does (reduce):
//
//   round t (one slot of the buffer each)
//   1. rank r copies piece t of its input into its slot
//   2. sync
//   3. every rank (the root) reduces piece t of all N slots, in rank order,
//      into its output
//
// N copies read per rank instead of the direct algorithm's 2(N-1)/N, but
// one sync instead of two. The sums in rank order are those of the direct
// algorithm (shm_direct.cpp), bit for bit.
#include "algorithms/shm_internal.h"

namespace ringcomm {

using namespace shm_detail;

namespace {
// One sync per slot of the buffer ("shm_flat", small buffers): every rank
// copies its input into its slot; then every rank (all_reduce: root < 0) or
// the root alone (reduce) reduces all the slots in rank order, so both give
// the same bits. Each rank stages its own input too: `out` may be its input,
// and the sum in rank order would overwrite it before its turn. The ledger:
// a peer that reads this rank's slot is "sent" to.
void flat(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const Coll coll = Coll(fp.coll);
  const int n = w.size(), r = w.rank();
  const bool reduces_here = root < 0 || r == root;
  const size_t es = plan.elem_size();
  const size_t W = std::max<size_t>(1, w.slot_bytes() / es);
  const size_t rounds = rounds_for(plan.count(), W);
  Ledger& ledger = link.ledger();
  for (size_t t = 0; t < rounds; ++t) {
    const int par = w.next_parity();
    const size_t len = piece_len(plan.count(), t, W);
    if (len) {
      std::memcpy(w.slot(r, par), in + t * W * es, len * es);
      for (int j = 0; j < n; ++j)  // booked before the sync, as every window routine does
        if (j != r && (root < 0 || j == root)) ledger.sent(coll, w.member(j), false, len * es);
    }
    w.sync(link, fp, t == 0);
    if (!len || !reduces_here) continue;
    char* dst = out + t * W * es;
    reduce_in_rank_order(red, dst, n, len, es, [&](int j) -> const char* { return w.slot(j, par); });
    red.finalize(dst, len, n);
    for (int j = 0; j < n; ++j)
      if (j != r) ledger.received(coll, w.member(j), false, len * es);
  }
}
}  // namespace

void shm_flat_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out) {
  flat(link, plan, red, -1, in, out);
}

void shm_flat_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out) {
  flat(link, plan, red, root, in, out);
}

}  // namespace ringcomm
