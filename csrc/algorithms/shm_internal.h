// What the shared-memory algorithms share (shm_*.cpp; private to them).
//
// The window (core/shm_window.h): no messages. Each rank writes into its own
// staging slot, every rank sync()s, then each reads what it needs straight
// from its peers' slots. Work goes in rounds of at most one slot per rank,
// so partial results stay in the last-level cache; the slot of a round's
// parity is reused two rounds later (the window's rotation).
//
// One file per algorithm family:
//   shm_direct.cpp      reduce-scatter / all-reduce / all-gather in rounds of
//                       a slot ("shm"), all-gather by single copy
//   shm_flat.cpp        the one-sync all-reduce and reduce ("shm_flat")
//   shm_rooted.cpp      broadcast (+ barrier), reduce, gather, scatter
//   shm_all_to_all.cpp  all_to_all: equal blocks and per-peer splits
//   shm_zero_copy.cpp   the arrays in the shared arena ("zero_copy")
//   shm_hierarchical.cpp  across hosts: shm inside, a transport between
//
// Every rank sums in the same order (0..N-1: reduce_in_rank_order), so the
// direct reduce-scatter gives the same bits as the all-reduce's chunk
// (ZeRO's sums equal DDP's), and the one-sync "shm_flat" agrees with both.
//
// The ledger books, per peer, what this rank's peers read from its slot
// (sent) and what it reads from theirs (received), one message per piece:
// the ring's claim of 2(N-1)/N of the buffer per rank is checked per peer
// here too.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"

namespace ringcomm {
namespace shm_detail {

// Elements of one chunk's piece per round: the slot holds one piece per rank,
// each a whole number of cache lines where the slot allows.
inline size_t piece_elems(const ShmWindow& w, size_t es) {
  size_t part = w.slot_bytes() / size_t(w.size());
  if (part >= 64) part = part / 64 * 64;
  return std::max<size_t>(1, part / es);
}

inline size_t piece_len(size_t chunk, size_t t, size_t P) { return chunk > t * P ? std::min(P, chunk - t * P) : 0; }

inline size_t rounds_for(size_t longest, size_t P) { return std::max<size_t>(1, (longest + P - 1) / P); }

// dst = src(0) op src(1) op ... op src(n-1), always in rank order: what makes
// every shm algorithm's sums the same bits (dst may be one of the sources
// only if it is src(0), or src(1) when n == 2: elementwise, read first).
template <class Src>
void reduce_in_rank_order(const Reducer& red, char* dst, int n, size_t len, size_t es, Src src) {
  if (n == 1) {
    if (dst != src(0)) std::memcpy(dst, src(0), len * es);
    return;
  }
  red.reduce(dst, src(0), src(1), len);
  for (int j = 2; j < n; ++j) red.reduce(dst, dst, src(j), len);
}

inline ShmWindow& window_of(Link& link) {
  ShmWindow* w = link.window();
  if (!w) throw_invalid("no shared-memory window on this communicator");
  return *w;
}

// What direct() does after its reduce-scatter half. Said, not inferred from
// null pointers: an empty torch tensor's address is 0, and a rank that took
// another branch than its peers would sync a different number of times.
enum class Then {
  keep,         // reduce_scatter: the reduced piece to `out` (this rank's chunk)
  gather_all,   // all_reduce: steps 4-5, every rank gathers into `out` (count elements)
  gather_root,  // reduce: steps 4-5, the root alone gathers into `out` (unused elsewhere)
};

// Chunks of any sizes, in the shape direct() and gather() read (the
// hierarchical paths' parts of a permuted buffer; a RingPlan is the other).
struct Parts {
  std::vector<size_t> begin, count;
  size_t es;
  size_t chunk_begin(int j) const { return begin[size_t(j)]; }
  size_t chunk_count(int j) const { return count[size_t(j)]; }
  size_t elem_size() const { return es; }
};

// The direct algorithm, round by round (shm_direct.cpp, instantiated there
// for RingPlan and Parts). `out` may be this rank's chunk of `in` (keep) or
// `in` itself (gather_*): each piece is read before it is written.
template <class Plan>
void direct(Link& link, const Plan& plan, const Reducer& red, const char* in, Then then, char* out, int root = -1);

// The all-gather through the slots (shm_direct.cpp, for RingPlan and Parts):
// `own` holds this rank's chunk, `out` gets every chunk.
template <class Plan>
void gather(Link& link, const Plan& plan, const char* own, char* out);

// ---- single copy: large blocks straight from the peers' arrays ------------
// all_gather, scatter, all_to_all and gather move blocks without changing
// them: above the window's single-copy limit each rank reads the blocks it
// needs straight from its peers' arrays (ShmWindow::read_peer:
// process_vm_readv, as Open MPI's smsc/cma) instead of every byte being
// copied into a slot and out again; gather's leaves write theirs into the
// root's output instead (process_vm_writev), all at once: read by the root,
// the root alone would copy everything (N = 2, 4 MiB: 375-402 us, against
// 272 through the slots, where the leaves copy in while it copies out).
// Not broadcast: its leaves
// would each read the root's whole buffer out of its pages, where the
// slots' rounds stay in cache (N = 4 on 2 cores, 1 MiB: 303 us single copy,
// 163 through the slots; bench/README.md).
//
//   publish  where this rank's input (or its blocks' table) is
//   arrive   its arrays are ready and published
//   read     each block this rank needs, from the peer that holds it, as
//            soon as that peer has arrived (its call checked: the same);
//            a rank that needs no peer's data (scatter's root) waits for none
//   sync     no peer reads this rank's arrays any more: the caller may
//            write them again. (Leaves that left here at once, needing no
//            one, measured no faster: 4 ranks on 2 cores, 1 MiB, within the
//            noise; and a rank could then run ahead of the words that
//            check the calls, ShmWindow::arrive.)
//
// Every rank decides alike: from the call's size (the same on every rank)
// and the window's limit (the same on every rank, attach's); below the
// limit for 4 KiB pages, all_gather also from what every rank said of its
// pages before a sync (slots_for_small_pages). all_to_all's
// sender decides per block and says so (shm_all_to_all_v).

// The peers a rank still has to read from, staggered (rank r starts with
// r + 1, so no rank is read by all at once); each is taken as it arrives
// (ShmWindow::await_any), so a rank reads from the peers already there
// while the others are still on their way (with more ranks than cores:
// not yet scheduled).
class Peers {
 public:
  Peers(int n, int r) {
    for (int k = 1; k < n; ++k) p_.push_back((r + k) % n);
  }
  bool empty() const { return p_.empty(); }
  const int* data() const { return p_.data(); }
  int size() const { return int(p_.size()); }
  // Remove and return the peer at index i, keeping the others' order.
  int take(int i) {
    const int j = p_[size_t(i)];
    p_.erase(p_.begin() + i);
    return j;
  }

 private:
  std::vector<int> p_;
};

// `block_bytes`: what one rank reads from one peer (the same on every rank).
inline bool single_copy(const ShmWindow& w, size_t block_bytes) {
  return w.size() > 1 && block_bytes >= w.single_copy_min();
}

}  // namespace shm_detail
}  // namespace ringcomm
