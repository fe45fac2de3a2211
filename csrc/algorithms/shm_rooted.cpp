// The rooted collectives in the shared-memory window: broadcast (+ barrier),
// reduce, gather and scatter (what every shm algorithm shares, single copy
// included: shm_internal.h).
//
// Through the slots in rounds, as the all-gather: a rank copies what it gives
// into its slot, and after the round's sync whoever needs it copies it out.
// No rank waits for another's reads: a slot is written again two rounds
// later, after a sync that its readers reach only once they are done.
//
//   broadcast   the root's buffer through its whole slot, piece by piece;
//               every leaf copies it out
//   reduce      the direct reduce-scatter, then the root alone gathers the
//               reduced pieces (all_reduce's sums, bit for bit: shm_direct.cpp);
//               or, small, every rank's input to the root, which reduces them
//               all ("shm_flat": shm_flat.cpp); from the single-copy limit, no
//               slots between the ranks (sc_reduce, below)
//   gather      every rank's block through its whole slot, piece by piece;
//               the root copies them out (per-rank counts: the same list on
//               every rank, so every rank counts the same rounds)
//   scatter     the root's slot in n parts, part j a piece of block j
//
// From the single-copy limit gather and scatter move their blocks straight
// between the root's arrays and the leaves' (sc_gather, sc_scatter).
// The ledger books what the linear algorithms send and receive: the same
// bytes per peer (a peer reading this rank's slot is "sent").
//
// reduce by single copy (when the direct algorithm's chunks would reach the
// window's single-copy limit): rank r reduces part r (ReduceParts: the
// root's larger). It reads that part of every peer's input straight from
// the peer's array (process_vm_readv) into its own slot, a piece at a
// time, reduces it in rank order (each element's sum the same bits as the
// direct algorithm's and all_reduce's), and writes it into the root's
// output (process_vm_writev; the root: into its own). Through the slots
// every round hands cache lines one core just wrote to another, which is
// slow on the machines measured (bench/README.md, "The slots' handoff").
// Every rank publishes its input (the root also its output), arrives, and
// reads once all have arrived (a piece needs every peer's); the closing
// sync means no peer reads this rank's input or writes its output any more.
//   rank r: received part r from every peer (its reads), sent part j to
//   every peer j (their reads of ours); a leaf sent its part to the root
//   (its write), the root received each leaf's part (their writes); booked
//   per piece as the direct algorithm's rounds. A root that failed may
//   return to its caller, who may free its output: no leaf's write lands
//   after that (ShmWindow::write_into, as gather's).
#include "algorithms/shm_internal.h"

namespace ringcomm {

using namespace shm_detail;

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

namespace {

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

// The parts of sc_reduce, in rank order: the root's larger, as it writes
// nothing into a peer. Each rank's time is about its part times (n-1)
// reads (process_vm_readv: pinning and copying, R per byte) and reductions
// (about 0.4 R), plus one write for a leaf (process_vm_writev: about R), so
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

}  // namespace ringcomm
