// Shared-memory collectives for the ranks of one host (core/shm_window.h).
//
// No messages: each rank writes into its own staging slot, every rank
// sync()s, then each reads what it needs straight from its peers' slots.
// Work goes in rounds of at most one slot per rank, so partial results stay
// in the last-level cache; the slot of a round's parity is reused two
// rounds later (the window's rotation).
//
// Direct all-reduce ("shm"; Open MPI's xhc/XBRC, DeepSpeed's shm.cpp): the
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
// Every rank sums in the same order (0..N-1), so the reduce-scatter gives
// the same bits as the all-reduce's chunk (ZeRO's sums equal DDP's), and
// the one-sync "shm_flat" below agrees with both.
//
// One-sync all-reduce ("shm_flat"; for small buffers): every rank copies its
// whole input into its slot, syncs once, and reduces all N slots itself.
// N copies read per rank instead of 2(N-1)/N, but one sync instead of two.
//
// The ledger books, per peer, what this rank's peers read from its slot
// (sent) and what it reads from theirs (received), one message per piece:
// the ring's claim of 2(N-1)/N of the buffer per rank is checked per peer
// here too.
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "algorithms/algorithms.h"

namespace ringcomm {

namespace {

// Elements of one chunk's piece per round: the slot holds one piece per rank,
// each a whole number of cache lines where the slot allows.
size_t piece_elems(const ShmWindow& w, size_t es) {
  size_t part = w.slot_bytes() / size_t(w.size());
  if (part >= 64) part = part / 64 * 64;
  return std::max<size_t>(1, part / es);
}

size_t piece_len(size_t chunk, size_t t, size_t P) { return chunk > t * P ? std::min(P, chunk - t * P) : 0; }

size_t rounds_for(size_t longest, size_t P) { return std::max<size_t>(1, (longest + P - 1) / P); }

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

ShmWindow& window_of(Link& link) {
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

// The direct algorithm, round by round. `out` may be this rank's chunk of
// `in` (keep) or `in` itself (gather_*): each piece is read before it is
// written. `Plan`: a RingPlan, or the hierarchical paths' Parts (below).
template <class Plan>
void direct(Link& link, const Plan& plan, const Reducer& red, const char* in, Then then, char* out,
            int root = -1) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const Coll coll = Coll(fp.coll);
  const int n = w.size(), r = w.rank();
  const size_t es = plan.elem_size();
  const size_t P = piece_elems(w, es);
  size_t longest = 0;
  for (int j = 0; j < n; ++j) longest = std::max(longest, plan.chunk_count(j));
  const size_t rounds = rounds_for(longest, P);
  Ledger& ledger = link.ledger();
  for (size_t t = 0; t < rounds; ++t) {
    const int par = w.next_parity();
    char* mine = w.slot(r, par);
    for (int j = 0; j < n; ++j) {  // 1. stage what the others reduce
      const size_t len = piece_len(plan.chunk_count(j), t, P);
      if (j == r || !len) continue;
      std::memcpy(mine + size_t(j) * P * es, in + (plan.chunk_begin(j) + t * P) * es, len * es);
      ledger.sent(coll, w.member(j), false, len * es);
    }
    w.sync(link, fp, t == 0);  // 2.
    const size_t len = piece_len(plan.chunk_count(r), t, P);
    char* acc = mine + size_t(r) * P * es;
    if (len) {  // 3. reduce piece r, in rank order
      const size_t at = (plan.chunk_begin(r) + t * P) * es;
      auto src = [&](int j) -> const char* { return j == r ? in + at : w.slot(j, par) + size_t(r) * P * es; };
      reduce_in_rank_order(red, acc, n, len, es, src);
      for (int j = 0; j < n; ++j)
        if (j != r) ledger.received(coll, w.member(j), false, len * es);
    }
    if (then == Then::keep) {
      if (len) std::memcpy(out + t * P * es, acc, len * es);
      continue;
    }
    if (len) red.finalize(acc, len, n);
    w.sync(link, fp, false);  // 4.
    const bool all = then == Then::gather_all, gathers = all || r == root;
    for (int j = 0; j < n; ++j) {  // 5. gather the reduced pieces
      const size_t lj = piece_len(plan.chunk_count(j), t, P);
      if (!lj) continue;
      if (gathers) {
        const char* from = j == r ? acc : w.slot(j, par) + size_t(j) * P * es;
        std::memcpy(out + (plan.chunk_begin(j) + t * P) * es, from, lj * es);
      }
      if (j == r) {
        for (int k = 0; k < n; ++k)
          if (k != r && (all || k == root)) ledger.sent(coll, w.member(k), false, lj * es);
      } else if (gathers) {
        ledger.received(coll, w.member(j), false, lj * es);
      }
    }
  }
}

}  // namespace

void shm_all_reduce(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* out) {
  direct(link, plan, red, in, Then::gather_all, out);
}

void shm_reduce_scatter(Link& link, const RingPlan& plan, const Reducer& red, const char* in, char* own) {
  direct(link, plan, red, in, Then::keep, own);
}

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

namespace {

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

}  // namespace

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
namespace {

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
bool single_copy(const ShmWindow& w, size_t block_bytes) {
  return w.size() > 1 && block_bytes >= w.single_copy_min();
}

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

// gather the other way round: the root publishes its output (or its
// blocks' table: torch's gather_list) and the leaves write their blocks into
// it (process_vm_writev), all at once, while the root copies its own.
void sc_gather(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  Ledger& ledger = link.ledger();
  if (r == root) {
    w.publish(fp.seq, out, blocks.places());
    for (int j = 0; j < n; ++j)
      if (j != r && blocks.count(j)) ledger.received(Coll::gather, w.member(j), false, blocks.count(j) * es);
  } else if (blocks.count(r)) {
    ledger.sent(Coll::gather, w.member(root), false, blocks.count(r) * es);
  }
  const uint64_t phase = w.arrive(link, fp);
  if (r == root && blocks.count(r)) {  // (in place: x is already its block of out)
    char* dst = blocks.at(out, r, es);
    if (dst != in) std::memmove(dst, in, blocks.count(r) * es);
  }
  if (r != root) {
    w.await_any(link, fp, phase, &root, 1);
    if (blocks.count(r)) w.write_peer(link, fp, root, blocks.offset(r) * es, r, in, blocks.count(r) * es);
  }
  w.sync(link, fp, false);  // every block is in the root's output
}

// The leaves read their blocks from the root's input, or, when the root's
// blocks sit in arrays of their own (torch's scatter_list), from those: the
// root publishes their table and each leaf reads its entry first.
void sc_scatter(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  Ledger& ledger = link.ledger();
  if (r == root) {
    w.publish(fp.seq, in, blocks.places());
    for (int j = 0; j < n; ++j)
      if (j != r && blocks.count(j)) ledger.sent(Coll::scatter, w.member(j), false, blocks.count(j) * es);
  }
  const uint64_t phase = w.arrive(link, fp);
  if (r == root && blocks.count(r)) {  // (while the leaves read; in place: out is already its block of x)
    const char* src = blocks.at(in, r, es);
    if (src != out) std::memmove(out, src, blocks.count(r) * es);
  }
  if (r != root) {
    w.await_any(link, fp, phase, &root, 1);
    if (blocks.count(r)) {
      // (a leaf's blocks are the split rule's or the counts every rank passed: the root's offsets)
      w.read_peer(root, fp.seq, blocks.offset(r) * es, r, out, blocks.count(r) * es);
      ledger.received(Coll::scatter, w.member(root), false, blocks.count(r) * es);
    }
  }
  w.sync(link, fp, false);
}

}  // namespace

// all_to_all with per-peer splits, and equal blocks from the single-copy
// limit. Each rank knows only what it sends to whom and what it receives
// from whom, so no rank could count the call's rounds from its own splits.
// The first round tells them: each rank writes into its slot a table, per
// destination, of where its block is (in its own process), how many bytes
// it has and how it goes, and beside it, in the slot's part for each
// destination, the first piece of each block that goes through the slots
// (one part per destination, in cache lines). A reader compares the size in
// the table with the one it expects (out_splits) before a byte moves (they
// differ: MismatchError naming both; the sender hears of it through the
// window). Every rank reads every table (n^2 words), so every rank knows
// the longest block through the slots and counts the same rounds: no extra
// exchange. How a block goes, the sender decides:
//   from the window's single-copy limit, its reader reads it straight from
//     the sender's array in the first round (single copy), unless it lies
//     in 4 KiB pages and is under the limit for those (the kernel pins
//     every page it copies from the sender: bench/README.md, "The sender's
//     pages", N = 2, 1 MiB: 88.7 us by single copy from 4 KiB pages, 71.3
//     through the slots, 59.4 from huge pages)
//   else through the slots, piece t in round t, as the equal blocks
// The rounds after the first are sync()ed rounds of the rotation (a slot is
// written again two rounds later, after every peer has passed the round in
// between); a call of one round ends with a sync, so no peer still reads
// this rank's arrays by single copy once it returns.
namespace {
constexpr int kEntry = 3;  // table words per destination: address, bytes, by single copy

size_t table_bytes(const ShmWindow& w) { return round_up(size_t(w.size()) * kEntry * sizeof(uint64_t), 64); }

// A round's piece of one block: what the slot holds per destination after
// the table, in cache lines.
size_t part_bytes(const ShmWindow& w) {
  const size_t table = table_bytes(w);
  return w.slot_bytes() > table ? (w.slot_bytes() - table) / size_t(w.size()) / 64 * 64 : 0;
}
}  // namespace

bool shm_all_to_all_v_fits(const ShmWindow& w) { return part_bytes(w) > 0; }

void shm_all_to_all_v(Link& link, const BlockSplit& send, const BlockSplit& recv, size_t es, const char* in,
                      char* out) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  Ledger& ledger = link.ledger();
  const size_t table = table_bytes(w), part = part_bytes(w);
  const int first = w.next_parity();
  auto* mine = reinterpret_cast<uint64_t*>(w.slot(r, first));
  // The table. Pages are asked once for one input array, per block for a list.
  int small = -1;  // one array's: unknown yet
  for (int p = 0; p < n; ++p) {
    const size_t bytes = p == r ? 0 : send.count(p) * es;
    const char* at = send.at(in, p, es);
    bool single = bytes && single_copy(w, bytes);
    if (single && bytes < w.single_copy_min_4k()) {
      if (send.places()) {
        single = !w.small_pages(at, bytes);
      } else {
        if (small < 0) small = w.small_pages(in, send.total() * es);
        single = !small;
      }
    }
    mine[kEntry * p] = uint64_t(reinterpret_cast<uintptr_t>(at));
    mine[kEntry * p + 1] = bytes;
    mine[kEntry * p + 2] = single;
    if (single) ledger.sent(Coll::all_to_all, w.member(p), false, bytes);
  }
  // Round t: this rank's piece t of each block that goes through the slots.
  auto put = [&](int par, size_t t) {
    char* parts = w.slot(r, par) + table;
    for (int p = 0; p < n; ++p) {
      const size_t len = mine[kEntry * p + 2] ? 0 : piece_len(mine[kEntry * p + 1], t, part);
      if (!len) continue;
      std::memcpy(parts + size_t(p) * part, send.at(in, p, es) + t * part, len);
      ledger.sent(Coll::all_to_all, w.member(p), false, len);
    }
  };
  // The rounds a table asks for (at least the first).
  auto rounds_of = [&](const uint64_t* tab) {
    size_t rounds = 1;
    for (int p = 0; p < n; ++p)
      if (!tab[kEntry * p + 2]) rounds = std::max(rounds, rounds_for(size_t(tab[kEntry * p + 1]), part));
    return rounds;
  };
  std::vector<char> slotted(size_t(n), 0);  // the blocks this rank receives through the slots
  auto take = [&](int j, int par, size_t t) {
    const size_t len = slotted[size_t(j)] ? piece_len(recv.count(j) * es, t, part) : 0;
    if (!len) return;
    std::memcpy(recv.at(out, j, es) + t * part, w.slot(j, par) + table + size_t(r) * part, len);
    ledger.received(Coll::all_to_all, w.member(j), false, len);
  };

  put(first, 0);
  size_t rounds = rounds_of(mine);
  const uint64_t phase = w.arrive(link, fp);  // (publishes the table and the first pieces)
  if (recv.count(r)) std::memmove(recv.at(out, r, es), send.at(in, r, es), recv.count(r) * es);
  Peers peers(n, r);
  while (!peers.empty()) {
    const int j = peers.take(w.await_any(link, fp, phase, peers.data(), peers.size()));
    const uint64_t* theirs = reinterpret_cast<const uint64_t*>(w.slot(j, first)) + kEntry * r;
    const size_t bytes = size_t(theirs[1]), want = recv.count(j) * es;
    if (bytes != want) link.throw_block_sizes(w.member(j), bytes, want);
    rounds = std::max(rounds, rounds_of(reinterpret_cast<const uint64_t*>(w.slot(j, first))));
    if (!bytes) continue;
    if (theirs[2]) {
      w.read_address(j, fp.seq, theirs[0], recv.at(out, j, es), bytes);
      ledger.received(Coll::all_to_all, w.member(j), false, bytes);
    } else {
      slotted[size_t(j)] = 1;
      take(j, first, 0);
    }
  }
  for (size_t t = 1; t < rounds; ++t) {
    const int par = w.next_parity();
    put(par, t);
    w.sync(link, fp, false);
    for (int j = 0; j < n; ++j)
      if (j != r) take(j, par, t);
  }
  if (rounds == 1) w.sync(link, fp, false);
}

void shm_all_gather(Link& link, const RingPlan& plan, const char* own, char* out) {
  ShmWindow& w = window_of(link);
  const size_t block = plan.count() / size_t(w.size()) * plan.elem_size();
  if (single_copy(w, block) &&
      !slots_for_small_pages(link, block, own, plan.chunk_count(w.rank()) * plan.elem_size()))
    return sc_all_gather(link, plan, own, out);
  gather(link, plan, own, out);
}

void shm_broadcast(Link& link, size_t count, size_t es, int root, char* buf) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  const size_t W = std::max<size_t>(1, w.slot_bytes() / es);
  const size_t rounds = rounds_for(count, W);
  Ledger& ledger = link.ledger();
  for (size_t t = 0; t < rounds; ++t) {
    const int par = w.next_parity();
    const size_t len = piece_len(count, t, W);
    if (r == root && len) {
      std::memcpy(w.slot(r, par), buf + t * W * es, len * es);
      for (int j = 0; j < n; ++j)
        if (j != r) ledger.sent(Coll::broadcast, w.member(j), false, len * es);
    }
    w.sync(link, fp, t == 0);
    if (r != root && len) {
      std::memcpy(buf + t * W * es, w.slot(root, par), len * es);
      ledger.received(Coll::broadcast, w.member(root), false, len * es);
    }
  }
}

void shm_barrier(Link& link) { window_of(link).sync(link, link.call(), true); }

// ---- the rooted and personalized collectives ------------------------------
// Through the slots in rounds, as the all-gather: a rank copies what it gives
// into its slot, and after the round's sync whoever needs it copies it out.
// No rank waits for another's reads: a slot is written again two rounds
// later, after a sync that its readers reach only once they are done.
//
//   reduce      the direct reduce-scatter, then the root alone gathers the
//               reduced pieces (all_reduce's sums, bit for bit); or, small,
//               every rank's input to the root, which reduces them all
//               ("shm_flat", shm_flat all_reduce's sums); from the
//               single-copy limit, no slots between the ranks (sc_reduce)
//   gather      every rank's block through its whole slot, piece by piece;
//               the root copies them out (per-rank counts: the same list on
//               every rank, so every rank counts the same rounds)
//   scatter     the root's slot in n parts, part j a piece of block j
//   all_to_all  (equal blocks) rank r's slot in n parts, part j a piece of
//               its block for rank j; rank j copies part j of every slot
// The ledger books what the linear and pairwise algorithms send and receive:
// the same bytes per peer (a peer reading this rank's slot is "sent").
// reduce by single copy (when the direct algorithm's chunks would reach the
// window's single-copy limit): rank r reduces part r (ReduceParts: the
// root's larger). It reads that part of every peer's input straight from
// the peer's array (process_vm_readv) into its own slot, a piece at a
// time, reduces it in rank order (each element's sum the same bits as the
// direct algorithm's and all_reduce's), and writes it into the root's
// output (process_vm_writev; the root: into its own). Through the slots
// every round hands cache lines one core just wrote to another, which on
// the machine measured took 3-4x longer in most launches than in the
// others (bench/README.md, "The slots' handoff"). N = 2, float32 sum, one
// launch each, us, slots / single copy / MPI_Reduce: 1 MiB 423-670 /
// 150-172 / 187-205, 4 MiB 1440-2707 / 514-671 / 606-875. Every rank
// publishes its input (the root also its output), arrives, and reads once
// all have arrived (a piece needs every peer's); the closing sync means no
// peer reads this rank's input or writes its output any more.
//   rank r: received part r from every peer (its reads), sent part j to
//   every peer j (their reads of ours); a leaf sent its part to the root
//   (its write), the root received each leaf's part (their writes); booked
//   per piece as the direct algorithm's rounds. A root that failed may
//   return to its caller, who may free its output: no leaf's write lands
//   after that (ShmWindow::write_into, as gather's).
namespace {

// The parts of sc_reduce, in rank order: the root's larger, as it writes
// nothing into a peer. Each rank's time is about its part times (n-1)
// reads (process_vm_readv: pinning and copying, R per byte) and reductions
// (about 0.4 R), plus one write for a leaf (process_vm_writev: about R;
// N = 2, 512 KiB parts, us: read 76-107, reduce 28-35, write 78-104), so
// parts in the ratio root : leaf = 1.4(n-1) + 1 : 1.4(n-1) end together
// (N = 2: 63 % for the root). The same on every rank: from count, n, root.
class ReduceParts {
 public:
  ReduceParts(size_t count, int n, int root) : count_(size_t(n)), begin_(size_t(n)) {
    const uint64_t leaf = 7 * uint64_t(n - 1), mine = leaf + 5;  // (x5: 1.4 = 7 / 5)
    const size_t at_root = n == 1 ? count : size_t((unsigned __int128)count * mine / (mine + leaf * uint64_t(n - 1)));
    size_t at = 0;
    for (int j = 0, k = 0; j < n; ++j) {
      count_[size_t(j)] = j == root ? at_root : split_size(count - at_root, n - 1, k++);
      begin_[size_t(j)] = at;
      at += count_[size_t(j)];
    }
  }
  size_t chunk_count(int j) const { return count_[size_t(j)]; }
  size_t chunk_begin(int j) const { return begin_[size_t(j)]; }

 private:
  std::vector<size_t> count_, begin_;
};

void sc_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out) {
  ShmWindow& w = window_of(link);
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  const size_t es = plan.elem_size();
  const size_t P = piece_elems(w, es);
  Ledger& ledger = link.ledger();
  const ReduceParts parts(plan.count(), n, root);
  w.publish(fp.seq, in, nullptr, r == root ? out : nullptr);
  const uint64_t phase = w.arrive(link, fp);
  Peers peers(n, r);
  while (!peers.empty()) peers.take(w.await_any(link, fp, phase, peers.data(), peers.size()));
  char* scratch = w.slot(r, w.next_parity());  // (ours alone: no peer reads it)
  // The root reduces straight into its output unless that is its input (a
  // piece of the sum would overwrite a source of a later rank's term).
  const bool direct_out = r == root && out != in;
  size_t longest = 0;
  for (int j = 0; j < n; ++j) longest = std::max(longest, parts.chunk_count(j));
  for (size_t t = 0, rounds = rounds_for(longest, P); t < rounds; ++t) {
    for (int j = 0; j < n; ++j) {  // the ledger, per piece as the direct algorithm's
      const size_t lj = piece_len(parts.chunk_count(j), t, P);
      if (j == r || !lj) continue;
      ledger.sent(Coll::reduce, w.member(j), false, lj * es);  // j reads it from our input
      if (r == root) ledger.received(Coll::reduce, w.member(j), false, lj * es);  // j writes its sum
    }
    const size_t len = piece_len(parts.chunk_count(r), t, P), at = (parts.chunk_begin(r) + t * P) * es;
    if (!len) continue;
    w.check_running(link, fp, "reduced its part");  // (no wait between the syncs sees an abort)
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      w.read_peer(j, fp.seq, at, 0, scratch + size_t(j) * P * es, len * es);
      ledger.received(Coll::reduce, w.member(j), false, len * es);
    }
    char* acc = direct_out ? out + at : scratch + size_t(r) * P * es;
    auto src = [&](int j) -> const char* { return j == r ? in + at : scratch + size_t(j) * P * es; };
    reduce_in_rank_order(red, acc, n, len, es, src);
    red.finalize(acc, len, n);
    if (r != root) {
      w.write_output(link, fp, root, at, acc, len * es);
      ledger.sent(Coll::reduce, w.member(root), false, len * es);
    } else if (!direct_out) {
      std::memcpy(out + at, acc, len * es);
    }
  }
  w.sync(link, fp, false);
}

}  // namespace

void shm_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out) {
  ShmWindow& w = window_of(link);
  if (single_copy(w, plan.chunk_count(0) * plan.elem_size()))  // (the largest chunk: alike on every rank)
    return sc_reduce(link, plan, red, root, in, out);
  direct(link, plan, red, in, Then::gather_root, out, root);
}

void shm_flat_reduce(Link& link, const RingPlan& plan, const Reducer& red, int root, const char* in, char* out) {
  flat(link, plan, red, root, in, out);
}

void shm_gather(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out) {
  ShmWindow& w = window_of(link);
  if (single_copy(w, blocks.total() / size_t(w.size()) * es)) return sc_gather(link, blocks, es, root, in, out);
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  const size_t W = std::max<size_t>(1, w.slot_bytes() / es);
  size_t longest = 0;
  for (int j = 0; j < n; ++j) longest = std::max(longest, blocks.count(j));
  const size_t rounds = rounds_for(longest, W);
  Ledger& ledger = link.ledger();
  if (r == root && blocks.count(r)) {  // (in place: x is already its block of out)
    char* dst = blocks.at(out, r, es);
    if (dst != in) std::memmove(dst, in, blocks.count(r) * es);
  }
  for (size_t t = 0; t < rounds; ++t) {
    const int par = w.next_parity();
    const size_t len = piece_len(blocks.count(r), t, W);
    if (r != root && len) {
      std::memcpy(w.slot(r, par), in + t * W * es, len * es);
      ledger.sent(Coll::gather, w.member(root), false, len * es);
    }
    w.sync(link, fp, t == 0);
    if (r != root) continue;
    for (int j = 0; j < n; ++j) {
      const size_t lj = piece_len(blocks.count(j), t, W);
      if (j == r || !lj) continue;
      std::memcpy(blocks.at(out, j, es) + t * W * es, w.slot(j, par), lj * es);
      ledger.received(Coll::gather, w.member(j), false, lj * es);
    }
  }
}

void shm_scatter(Link& link, const BlockSplit& blocks, size_t es, int root, const char* in, char* out) {
  ShmWindow& w = window_of(link);
  if (single_copy(w, blocks.total() / size_t(w.size()) * es)) return sc_scatter(link, blocks, es, root, in, out);
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  const size_t P = piece_elems(w, es);
  size_t longest = 0;
  for (int j = 0; j < n; ++j) longest = std::max(longest, blocks.count(j));
  const size_t rounds = rounds_for(longest, P);
  Ledger& ledger = link.ledger();
  if (r == root && blocks.count(r)) {  // (in place: out is already its block of x)
    const char* src = blocks.at(in, r, es);
    if (src != out) std::memmove(out, src, blocks.count(r) * es);
  }
  for (size_t t = 0; t < rounds; ++t) {
    const int par = w.next_parity();
    if (r == root)
      for (int j = 0; j < n; ++j) {
        const size_t lj = piece_len(blocks.count(j), t, P);
        if (j == r || !lj) continue;
        std::memcpy(w.slot(r, par) + size_t(j) * P * es, blocks.at(in, j, es) + t * P * es, lj * es);
        ledger.sent(Coll::scatter, w.member(j), false, lj * es);
      }
    w.sync(link, fp, t == 0);
    const size_t len = piece_len(blocks.count(r), t, P);
    if (r != root && len) {
      std::memcpy(out + t * P * es, w.slot(root, par) + size_t(r) * P * es, len * es);
      ledger.received(Coll::scatter, w.member(root), false, len * es);
    }
  }
}

void shm_all_to_all(Link& link, size_t count, size_t es, const char* in, char* out) {
  ShmWindow& w = window_of(link);
  // From the limit the sender's pages decide (shm_all_to_all_v), where a
  // slot holds its table (else the rounds below: a slot of under 88 bytes
  // per rank, thousands of ranks or a tiny RINGCOMM_SHM_SLOT).
  if (single_copy(w, count / size_t(w.size()) * es) && shm_all_to_all_v_fits(w)) {
    const BlockSplit blocks(count, w.size(), nullptr, nullptr);
    return shm_all_to_all_v(link, blocks, blocks, es, in, out);
  }
  const Fingerprint& fp = link.call();
  const int n = w.size(), r = w.rank();
  const size_t B = count / size_t(n);  // equal blocks (the engine runs this only then)
  const size_t P = piece_elems(w, es);
  const size_t rounds = rounds_for(B, P);
  Ledger& ledger = link.ledger();
  if (B) std::memcpy(out + size_t(r) * B * es, in + size_t(r) * B * es, B * es);
  for (size_t t = 0; t < rounds; ++t) {
    const int par = w.next_parity();
    const size_t len = piece_len(B, t, P);
    if (len)
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        std::memcpy(w.slot(r, par) + size_t(j) * P * es, in + (size_t(j) * B + t * P) * es, len * es);
        ledger.sent(Coll::all_to_all, w.member(j), false, len * es);
      }
    w.sync(link, fp, t == 0);
    if (len)
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        std::memcpy(out + (size_t(j) * B + t * P) * es, w.slot(j, par) + size_t(r) * P * es, len * es);
        ledger.received(Coll::all_to_all, w.member(j), false, len * es);
      }
  }
}

// ---- zero copy: the arrays live in the shared arena ----------------------
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

// ---- across hosts: hierarchical collectives -------------------------------
// The window holds this host's L ranks; `across` runs a collective among the
// ranks of every host with this rank's local index (one per host), over the
// inter-host transport.
//
// All-reduce:
//   1. reduce-scatter inside the host (the direct one): local rank l holds
//      chunk l (of L) summed over the host
//   2. across(all_reduce, chunk l): every host's sums of chunk l, each local
//      rank its own slice at once
//   3. all-gather inside the host
// Only 1/L of the buffer leaves each rank for other hosts.
void hierarchical_all_reduce(Link& link, size_t count, size_t es, const Reducer& red, const char* in, char* out,
                             const Across& across) {
  ShmWindow& w = window_of(link);
  RingPlan local(count, w.size(), es, link.options().segment_bytes);
  char* own = out + local.chunk_begin(w.rank()) * es;
  direct(link, local, red, in, Then::keep, own);
  across(Coll::all_reduce, own, own, local.chunk_count(w.rank()));
  red.finalize(own, local.chunk_count(w.rank()), link.size());
  shm_all_gather(link, local, own, out);
}

// Reduce-scatter and all-gather: rank g's result is chunk g of the N = H x L
// chunks (the split rule), so local rank l's share inside the host is not
// one contiguous chunk but the chunks of the ranks it meets between hosts
// (local index l on every host). Both work on a copy of the buffer permuted
// so that this share, "part" l, is contiguous, in the order of the hosts:
//
//   reduce-scatter: permute in -> direct reduce-scatter of the parts inside
//     the host -> across(reduce_scatter, part l): this rank's chunk
//   all-gather: across(all_gather, chunk): part l -> all-gather of the parts
//     inside the host -> permute back into out
//
// Between hosts, rank h's chunk of part l must be chunk g(h, l): the split
// rule of part l's size over H gives it when g(h, l) grows with h for every
// l (HostLayout::ordered; the engine runs these only then). One extra pass
// over the buffer each, against the inter-host transfer that dominates.
namespace {

// Chunks of any sizes, in the shape direct() and gather() read.
struct Parts {
  std::vector<size_t> begin, count;
  size_t es;
  size_t chunk_begin(int j) const { return begin[size_t(j)]; }
  size_t chunk_count(int j) const { return count[size_t(j)]; }
  size_t elem_size() const { return es; }
};

// Part l = the chunks of g(0, l), g(1, l), ..., in that order.
Parts parts_of(const HostLayout& lay, const RingPlan& global) {
  Parts p{std::vector<size_t>(size_t(lay.local)), std::vector<size_t>(size_t(lay.local)), global.elem_size()};
  size_t at = 0;
  for (int l = 0; l < lay.local; ++l) {
    p.begin[size_t(l)] = at;
    for (int h = 0; h < lay.hosts; ++h) at += global.chunk_count(lay.at(h, l));
    p.count[size_t(l)] = at - p.begin[size_t(l)];
  }
  return p;
}

// Copy every chunk from its place in `buf` to its place in `perm` (`into`),
// or back.
void permute(const HostLayout& lay, const RingPlan& global, const Parts& parts, char* buf, char* perm, bool into) {
  const size_t es = global.elem_size();
  for (int l = 0; l < lay.local; ++l) {
    size_t at = parts.chunk_begin(l);
    for (int h = 0; h < lay.hosts; ++h) {
      const int g = lay.at(h, l);
      const size_t n = global.chunk_count(g);
      char* b = buf + global.chunk_begin(g) * es;
      if (!n) continue;  // (an empty buffer's address may be null)
      if (into) std::memcpy(perm + at * es, b, n * es);
      else std::memcpy(b, perm + at * es, n * es);
      at += n;
    }
  }
}

}  // namespace

void hierarchical_reduce_scatter(Link& link, const HostLayout& lay, size_t count, size_t es, const Reducer& red,
                                 const char* in, char* out, char* perm, const Across& across) {
  ShmWindow& w = window_of(link);
  const RingPlan global(count, link.size(), es, link.options().segment_bytes);
  const Parts parts = parts_of(lay, global);
  permute(lay, global, parts, const_cast<char*>(in), perm, true);  // (reads `in` only)
  char* mine = perm + parts.chunk_begin(w.rank()) * es;
  direct(link, parts, red, perm, Then::keep, mine);
  across(Coll::reduce_scatter, mine, out, parts.chunk_count(w.rank()));
}

void hierarchical_all_gather(Link& link, const HostLayout& lay, size_t count, size_t es, const char* own,
                             char* out, char* perm, const Across& across) {
  ShmWindow& w = window_of(link);
  const RingPlan global(count, link.size(), es, link.options().segment_bytes);
  const Parts parts = parts_of(lay, global);
  char* mine = perm + parts.chunk_begin(w.rank()) * es;
  across(Coll::all_gather, own, mine, parts.chunk_count(w.rank()));
  gather(link, parts, mine, perm);
  permute(lay, global, parts, out, perm, false);
}

}  // namespace ringcomm
