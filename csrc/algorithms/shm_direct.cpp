// Direct reduce-scatter, all-reduce and all-gather in the shared-memory
// window of one host ("shm"; the window and what every shm algorithm
// shares: shm_internal.h).
//
// Direct all-reduce (Open MPI's xhc/XBRC, DeepSpeed's shm.cpp): the
// reduce-scatter and the all-gather each in one step, not N-1.
//
//   round t, piece of chunk j = elements [begin_j + tP, +P) of the buffer
//   1. rank r copies its pieces of every other chunk j into its slot, part j
//   2. sync
//   3. rank r reduces piece r from every rank, in rank order 0..N-1 (its
//      own from its input, the others from their slots), into part r of its
//      slot (that part was free)
//   4. sync                                              (all-reduce only)
//   5. rank r copies every part j of rank j's slot into its output
//
// The reduce-scatter stops after step 3 (the piece to this rank's chunk);
// reduce (shm_rooted.cpp) runs steps 4-5 on the root alone.
//
// All-gather through the slots: each round, every rank copies a piece of
// its chunk into its whole slot, syncs, and copies every peer's piece out.
// From the window's single-copy limit (shm_internal.h), each rank reads the
// chunks straight from its peers' arrays instead (sc_all_gather).
#include "algorithms/shm_internal.h"

namespace ringcomm {

using namespace shm_detail;

namespace {

// One call of the direct algorithm: its steps, round by round.
template <class Plan>
class Direct {
 public:
  Direct(Link& link, const Plan& plan, const Reducer& red, const char* in)
      : link_(link), w_(window_of(link)), fp_(link.call()), coll_(Coll(fp_.coll)), ledger_(link.ledger()),
        plan_(plan), red_(red), in_(in), n_(w_.size()), r_(w_.rank()), es_(plan.elem_size()),
        P_(piece_elems(w_, es_)) {}

  void run(Then then, char* out, int root) {
    size_t longest = 0;
    for (int j = 0; j < n_; ++j) longest = std::max(longest, plan_.chunk_count(j));
    const size_t rounds = rounds_for(longest, P_);
    for (size_t t = 0; t < rounds; ++t) {
      const int par = w_.next_parity();
      char* mine = w_.slot(r_, par);
      stage(mine, t);             // 1.
      w_.sync(link_, fp_, t == 0);  // 2.
      char* acc = part(mine, r_);
      const size_t len = reduce_own(acc, par, t);  // 3.
      if (then == Then::keep) {
        if (len) std::memcpy(out + t * P_ * es_, acc, len * es_);
        continue;
      }
      if (len) red_.finalize(acc, len, n_);
      w_.sync(link_, fp_, false);  // 4.
      gather_pieces(acc, par, t, then == Then::gather_all, root, out);  // 5.
    }
  }

 private:
  char* part(char* slot, int j) const { return slot + size_t(j) * P_ * es_; }
  size_t piece(int j, size_t t) const { return piece_len(plan_.chunk_count(j), t, P_); }
  size_t at(int j, size_t t) const { return (plan_.chunk_begin(j) + t * P_) * es_; }

  // 1. Stage what the others reduce: this rank's piece of every other chunk.
  void stage(char* mine, size_t t) {
    for (int j = 0; j < n_; ++j) {
      const size_t len = piece(j, t);
      if (j == r_ || !len) continue;
      std::memcpy(part(mine, j), in_ + at(j, t), len * es_);
      ledger_.sent(coll_, w_.member(j), false, len * es_);
    }
  }

  // 3. Reduce piece r, in rank order, into `acc`; its length.
  size_t reduce_own(char* acc, int par, size_t t) {
    const size_t len = piece(r_, t);
    if (!len) return 0;
    const size_t from = at(r_, t);
    auto src = [&](int j) -> const char* { return j == r_ ? in_ + from : part(w_.slot(j, par), r_); };
    reduce_in_rank_order(red_, acc, n_, len, es_, src);
    for (int j = 0; j < n_; ++j)
      if (j != r_) ledger_.received(coll_, w_.member(j), false, len * es_);
    return len;
  }

  // 5. Gather the reduced pieces: every rank (all) or the root alone.
  void gather_pieces(const char* acc, int par, size_t t, bool all, int root, char* out) {
    const bool gathers = all || r_ == root;
    for (int j = 0; j < n_; ++j) {
      const size_t lj = piece(j, t);
      if (!lj) continue;
      if (gathers) std::memcpy(out + at(j, t), j == r_ ? acc : part(w_.slot(j, par), j), lj * es_);
      if (j == r_) {
        for (int k = 0; k < n_; ++k)
          if (k != r_ && (all || k == root)) ledger_.sent(coll_, w_.member(k), false, lj * es_);
      } else if (gathers) {
        ledger_.received(coll_, w_.member(j), false, lj * es_);
      }
    }
  }

  Link& link_;
  ShmWindow& w_;
  const Fingerprint& fp_;
  const Coll coll_;
  Ledger& ledger_;
  const Plan& plan_;
  const Reducer& red_;
  const char* in_;
  const int n_, r_;
  const size_t es_, P_;
};

// Single copy has the kernel pin every page it copies out of a peer's
// array; from 4 KiB pages that can cost all_gather more than the slots'
// second copy, where one core reads what another just wrote quickly (on
// the machine measured, in a minority of launches: bench/handoff.py, so the
// built-in limit for such blocks is the single-copy limit itself and this
// runs only where tune or the variable set a higher one). Not gather or
// scatter: there the root alone copies every block out of (into) the
// slots, round after round, each a sync of all ranks; measured, that was
// mixed (gather) or level and slower (scatter) at N = 4. Whose pages matter (every rank's input) only their
// owner can ask, so every rank says what it found and waits for all (one
// sync): after it all decide alike. Only for blocks under the window's
// 4 KiB limit, between processes.
bool slots_for_small_pages(Link& link, size_t block_bytes, const void* mine, size_t bytes) {
  ShmWindow& w = window_of(link);
  if (!w.watches_processes() || block_bytes >= w.single_copy_min_4k()) return false;
  const Fingerprint& fp = link.call();
  w.publish_pages(fp.seq, w.small_pages(mine, bytes));
  w.sync(link, fp, true);
  bool small = false;
  for (int j = 0; j < w.size(); ++j)  // every rank's word: one whose limits differ raises here, on every rank
    if (w.peer_small_pages(j, fp.seq)) small = true;
  return small;
}

void sc_all_gather(Link& link, const RingPlan& plan, const char* own, char* out) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const Coll coll = Coll(fp.coll);
  const int n = w.size(), r = w.rank();
  const size_t es = plan.elem_size();
  Ledger& ledger = link.ledger();
  w.publish(fp.seq, own, nullptr);
  for (int j = 0; j < n; ++j)
    if (j != r && plan.chunk_count(r)) ledger.sent(coll, w.member(j), false, plan.chunk_count(r) * es);
  const uint64_t phase = w.arrive(link, fp);
  char* own_out = out + plan.chunk_begin(r) * es;  // (while the peers read it: not before they arrived)
  if (own != own_out && plan.chunk_count(r)) std::memmove(own_out, own, plan.chunk_count(r) * es);
  Peers peers(n, r);
  while (!peers.empty()) {
    const int j = peers.take(w.await_any(link, fp, phase, peers.data(), peers.size()));
    const size_t bytes = plan.chunk_count(j) * es;
    if (!bytes) continue;
    w.read_peer(j, fp.seq, 0, j, out + plan.chunk_begin(j) * es, bytes);
    ledger.received(coll, w.member(j), false, bytes);
  }
  w.sync(link, fp, false);
}

}  // namespace

namespace shm_detail {

template <class Plan>
void direct(Link& link, const Plan& plan, const Reducer& red, const char* in, Then then, char* out, int root) {
  Direct<Plan>(link, plan, red, in).run(then, out, root);
}

template <class Plan>
void gather(Link& link, const Plan& plan, const char* own, char* out) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const Coll coll = Coll(fp.coll);  // (all_reduce's when the hierarchical one gathers)
  const int n = w.size(), r = w.rank();
  const size_t es = plan.elem_size();
  const size_t W = std::max<size_t>(1, w.slot_bytes() / es);
  size_t longest = 0;
  for (int j = 0; j < n; ++j) longest = std::max(longest, plan.chunk_count(j));
  const size_t rounds = rounds_for(longest, W);
  Ledger& ledger = link.ledger();
  char* own_out = out + plan.chunk_begin(r) * es;
  if (own != own_out && plan.chunk_count(r)) std::memmove(own_out, own, plan.chunk_count(r) * es);
  // The slot at own_out's page offset: readers copy into the same place of
  // their `out` (ShmWindow::align_slots_to).
  w.align_slots_to(own_out);
  for (size_t t = 0; t < rounds; ++t) {
    const int par = w.next_parity();
    const size_t len = piece_len(plan.chunk_count(r), t, W);
    if (len) std::memcpy(w.slot(r, par), own_out + t * W * es, len * es);
    if (len)
      for (int j = 0; j < n; ++j)
        if (j != r) ledger.sent(coll, w.member(j), false, len * es);
    w.sync(link, fp, t == 0);
    for (int j = 0; j < n; ++j) {
      const size_t lj = piece_len(plan.chunk_count(j), t, W);
      if (j == r || !lj) continue;
      std::memcpy(out + (plan.chunk_begin(j) + t * W) * es, w.slot(j, par), lj * es);
      ledger.received(coll, w.member(j), false, lj * es);
    }
  }
}

template void direct<RingPlan>(Link&, const RingPlan&, const Reducer&, const char*, Then, char*, int);
template void direct<Parts>(Link&, const Parts&, const Reducer&, const char*, Then, char*, int);
template void gather<RingPlan>(Link&, const RingPlan&, const char*, char*);
template void gather<Parts>(Link&, const Parts&, const char*, char*);

}  // namespace shm_detail

void shm_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out) {
  direct(link, plan, red, in, Then::gather_all, out);
}

void shm_reduce_scatter(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* own) {
  direct(link, plan, red, in, Then::keep, own);
}

void shm_all_gather(Link& link, const RingPlan& plan, const char* own, char* out) {
  ShmWindow& w = window_of(link);
  const size_t block = plan.count() / size_t(w.size()) * plan.elem_size();
  if (single_copy(w, block) &&
      !slots_for_small_pages(link, block, own, plan.chunk_count(w.rank()) * plan.elem_size()))
    return sc_all_gather(link, plan, own, out);
  gather(link, plan, own, out);
}

}  // namespace ringcomm
