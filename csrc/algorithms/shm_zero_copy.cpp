// Zero copy in the shared-memory window ("zero_copy"): the arrays live in
// the shared arena (what every shm algorithm shares: shm_internal.h).
//
// Every rank's input (and all_reduce's output) sits in its part of the
// arena, and peers read it there: no staging copy.
//
// Each rank's arrays may sit anywhere in its part: a peer reads their
// offsets from the call it announced (ShmWindow::peer_call).
//
//   sync                     every input is ready
//   reduce chunk r from every rank's input, in rank order, in pieces of one
//   slot (in cache; a rank's own chunk r is read by it alone, so the result
//   may overwrite it)        -> all_reduce: chunk r of its output; reduce_scatter: `own`
//   sync                     (all_reduce) every chunk is reduced
//   copy chunk j of rank j's output (all_gather: its input), every j != r
//   sync                     no peer reads this rank's arrays any more: the
//                            caller may write them again
#include "algorithms/shm_internal.h"

namespace ringcomm {

using namespace shm_detail;

namespace {

// Where each rank's input (or output) of this call sits in its part of the arena.
std::vector<int64_t> peer_offsets(ShmWindow& w, const Fingerprint& fp, bool out) {
  std::vector<int64_t> off(size_t(w.size()));
  for (int j = 0; j < w.size(); ++j) {
    const Fingerprint f = j == w.rank() ? fp : w.peer_call(j, fp);
    off[size_t(j)] = out ? f.arena_out : f.arena_in;
  }
  return off;
}

void zc_reduce_chunk(Link& link, ShmWindow& w, const RingPlan& plan, const Reducer& red,
                     const std::vector<int64_t>& in_off, char* dst, bool finalize) {
  const Coll coll = Coll(link.call().coll);
  const int n = w.size(), r = w.rank();
  const size_t es = plan.elem_size();
  const size_t total = plan.chunk_count(r), first = plan.chunk_begin(r);
  const size_t W = std::max<size_t>(1, w.slot_bytes() / es);
  char* acc = w.slot(r, w.next_parity());
  for (size_t done = 0; done < total; done += W) {
    const size_t len = std::min(W, total - done);
    auto src = [&](int j) { return w.arena(j) + size_t(in_off[size_t(j)]) + (first + done) * es; };
    reduce_in_rank_order(red, acc, n, len, es, src);
    if (finalize) red.finalize(acc, len, n);
    std::memcpy(dst + done * es, acc, len * es);
  }
  Ledger& ledger = link.ledger();
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    if (total) ledger.received(coll, w.member(j), false, total * es);  // chunk r of j's input
    if (plan.chunk_count(j)) ledger.sent(coll, w.member(j), false, plan.chunk_count(j) * es);  // j reads ours
  }
}

}  // namespace

void zero_copy_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, int64_t out_off) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  const size_t es = plan.elem_size();
  w.sync(link, fp, true);
  const std::vector<int64_t> ins = peer_offsets(w, fp, false), outs = peer_offsets(w, fp, true);
  char* out = w.arena(r) + size_t(out_off);
  zc_reduce_chunk(link, w, plan, red, ins, out + plan.chunk_begin(r) * es, true);
  w.sync(link, fp, false);
  Ledger& ledger = link.ledger();
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    const size_t len = plan.chunk_count(j), at = plan.chunk_begin(j) * es;
    if (len) {
      std::memcpy(out + at, w.arena(j) + size_t(outs[size_t(j)]) + at, len * es);
      ledger.received(Coll::all_reduce, w.member(j), false, len * es);
    }
    if (plan.chunk_count(r)) ledger.sent(Coll::all_reduce, w.member(j), false, plan.chunk_count(r) * es);
  }
  w.sync(link, fp, false);
}

void zero_copy_reduce_scatter(Link& link, const RingPlan& plan, const Reducer& red, char* own) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  w.sync(link, fp, true);
  zc_reduce_chunk(link, w, plan, red, peer_offsets(w, fp, false), own, false);
  w.sync(link, fp, false);
}

void zero_copy_all_gather(Link& link, const RingPlan& plan, char* out) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  const size_t es = plan.elem_size();
  w.sync(link, fp, true);
  const std::vector<int64_t> ins = peer_offsets(w, fp, false);
  Ledger& ledger = link.ledger();
  for (int j = 0; j < n; ++j) {
    const size_t len = plan.chunk_count(j);
    if (!len) continue;
    char* dst = out + plan.chunk_begin(j) * es;
    const char* src = w.arena(j) + size_t(ins[size_t(j)]);
    if (dst != src) std::memmove(dst, src, len * es);
    if (j == r) {
      for (int k = 0; k < n; ++k)
        if (k != r) ledger.sent(Coll::all_gather, w.member(k), false, len * es);
    } else {
      ledger.received(Coll::all_gather, w.member(j), false, len * es);
    }
  }
  w.sync(link, fp, false);
}

}  // namespace ringcomm
