// all_to_all in the shared-memory window: equal blocks through the slots,
// and per-peer splits (large blocks by single copy); what every shm
// algorithm shares, single copy included: shm_internal.h.
//
// Equal blocks (count / n each), through the slots in rounds: rank r's slot
// in n parts, part j a piece of its block for rank j; after the round's sync
// rank j copies part j of every slot. From the single-copy limit, the
// per-peer path below (its sender decides how each block goes).
//
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
//     every page it copies from the sender, which makes small pages slower
//     than the slots: bench/README.md, "The sender's pages")
//   else through the slots, piece t in round t, as the equal blocks
// The rounds after the first are sync()ed rounds of the rotation (a slot is
// written again two rounds later, after every peer has passed the round in
// between); a call of one round ends with a sync, so no peer still reads
// this rank's arrays by single copy once it returns.
#include "algorithms/shm_internal.h"

namespace ringcomm {

using namespace shm_detail;

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

namespace {

// One call of the per-peer all_to_all: this rank's table, its pieces round
// by round, and what it takes from its peers.
class AllToAllV {
 public:
  AllToAllV(Link& link, const BlockSplit& send, const BlockSplit& recv, size_t es, const char* in, char* out)
      : link_(link), w_(window_of(link)), fp_(link.call()), ledger_(link.ledger()), send_(send), recv_(recv),
        es_(es), in_(in), out_(out), n_(w_.size()), r_(w_.rank()), table_(table_bytes(w_)), part_(part_bytes(w_)),
        first_(w_.next_parity()), mine_(reinterpret_cast<uint64_t*>(w_.slot(r_, first_))), slotted_(size_t(n_), 0) {}

  void run() {
    write_table();
    put(first_, 0);
    size_t rounds = rounds_of(mine_);
    const uint64_t phase = w_.arrive(link_, fp_);  // (publishes the table and the first pieces)
    if (recv_.count(r_)) std::memmove(recv_.at(out_, r_, es_), send_.at(in_, r_, es_), recv_.count(r_) * es_);
    rounds = std::max(rounds, first_round(phase));
    for (size_t t = 1; t < rounds; ++t) {
      const int par = w_.next_parity();
      put(par, t);
      w_.sync(link_, fp_, false);
      for (int j = 0; j < n_; ++j)
        if (j != r_) take(j, par, t);
    }
    if (rounds == 1) w_.sync(link_, fp_, false);
  }

 private:
  // Whether the block for `p` (`bytes`) goes by single copy. Pages are asked
  // once for one input array (`small`: -1 unknown yet), per block for a list.
  bool by_single_copy(int p, size_t bytes, int& small) const {
    const bool single = bytes && single_copy(w_, bytes);
    if (!single || bytes >= w_.single_copy_min_4k()) return single;
    if (send_.places()) return !w_.small_pages(send_.at(in_, p, es_), bytes);
    if (small < 0) small = w_.small_pages(in_, send_.total() * es_);
    return !small;
  }

  // The table: per destination, where its block is, its bytes, how it goes.
  void write_table() {
    int small = -1;
    for (int p = 0; p < n_; ++p) {
      const size_t bytes = p == r_ ? 0 : send_.count(p) * es_;
      const bool single = by_single_copy(p, bytes, small);
      mine_[kEntry * p] = uint64_t(reinterpret_cast<uintptr_t>(send_.at(in_, p, es_)));
      mine_[kEntry * p + 1] = bytes;
      mine_[kEntry * p + 2] = single;
      if (single) ledger_.sent(Coll::all_to_all, w_.member(p), false, bytes);
    }
  }

  // Round t: this rank's piece t of each block that goes through the slots.
  void put(int par, size_t t) {
    char* parts = w_.slot(r_, par) + table_;
    for (int p = 0; p < n_; ++p) {
      const size_t len = mine_[kEntry * p + 2] ? 0 : piece_len(mine_[kEntry * p + 1], t, part_);
      if (!len) continue;
      std::memcpy(parts + size_t(p) * part_, send_.at(in_, p, es_) + t * part_, len);
      ledger_.sent(Coll::all_to_all, w_.member(p), false, len);
    }
  }

  // The rounds a table asks for (at least the first).
  size_t rounds_of(const uint64_t* tab) const {
    size_t rounds = 1;
    for (int p = 0; p < n_; ++p)
      if (!tab[kEntry * p + 2]) rounds = std::max(rounds, rounds_for(size_t(tab[kEntry * p + 1]), part_));
    return rounds;
  }

  // Round t's piece of peer j's block, if it comes through the slots.
  void take(int j, int par, size_t t) {
    const size_t len = slotted_[size_t(j)] ? piece_len(recv_.count(j) * es_, t, part_) : 0;
    if (!len) return;
    std::memcpy(recv_.at(out_, j, es_) + t * part_, w_.slot(j, par) + table_ + size_t(r_) * part_, len);
    ledger_.received(Coll::all_to_all, w_.member(j), false, len);
  }

  // The first round: each peer's table as it arrives, its size checked
  // against out_splits before a byte moves, then its block read whole
  // (single copy) or its first piece taken. The rounds the peers' tables ask for.
  size_t first_round(uint64_t phase) {
    size_t rounds = 1;
    Peers peers(n_, r_);
    while (!peers.empty()) {
      const int j = peers.take(w_.await_any(link_, fp_, phase, peers.data(), peers.size()));
      const uint64_t* tab = reinterpret_cast<const uint64_t*>(w_.slot(j, first_));
      const uint64_t* theirs = tab + kEntry * r_;
      const size_t bytes = size_t(theirs[1]), want = recv_.count(j) * es_;
      if (bytes != want) link_.throw_block_sizes(w_.member(j), bytes, want);
      rounds = std::max(rounds, rounds_of(tab));
      if (bytes) receive_first(j, theirs, bytes);
    }
    return rounds;
  }

  void receive_first(int j, const uint64_t* theirs, size_t bytes) {
    if (theirs[2]) {
      w_.read_address(j, fp_.seq, theirs[0], recv_.at(out_, j, es_), bytes);
      ledger_.received(Coll::all_to_all, w_.member(j), false, bytes);
    } else {
      slotted_[size_t(j)] = 1;
      take(j, first_, 0);
    }
  }

  Link& link_;
  ShmWindow& w_;
  const Fingerprint& fp_;
  Ledger& ledger_;
  const BlockSplit& send_;
  const BlockSplit& recv_;
  const size_t es_;
  const char* in_;
  char* out_;
  const int n_, r_;
  const size_t table_, part_;
  const int first_;
  uint64_t* mine_;
  std::vector<char> slotted_;  // the blocks this rank receives through the slots
};

}  // namespace

void shm_all_to_all_v(Link& link, const BlockSplit& send, const BlockSplit& recv, size_t es, const char* in,
                      char* out) {
  AllToAllV(link, send, recv, es, in, out).run();
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

}  // namespace ringcomm
