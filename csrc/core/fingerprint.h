// Fingerprint: what all ranks must agree on for one collective call, and
// what is derived from it: the text that names a call in an error, the
// 32-bit stamp its payload messages carry (transport.h), and the comparison
// the header check makes (Link::check_call).
#pragma once

#include <cstdint>
#include <string>

#include "core/vocabulary.h"

namespace ringcomm {

struct Fingerprint {
  uint64_t seq = 0;
  int64_t count = 0;          // total elements of the full buffer
  int64_t segment_bytes = 0;  // ranks must cut messages alike
  int32_t coll = 0, dtype = 0, op = 0, root = 0;
  int32_t rank = 0;           // who sent it (not compared)
  int32_t algo = 0;           // Algo: which algorithm runs (ranks must agree)
  int32_t pad = 0;
  // Per-rank counts (gatherv, scatterv): a hash of the list every rank
  // passes (counts_hash()); all_to_all with per-peer splits: kPerPeer (the
  // splits differ by rank; each pair's sizes are checked by its message).
  // 0: the split rule.
  uint64_t counts = 0;
  // Zero copy (algorithm zero_copy): where this rank's input and output sit
  // in its part of the shared arena, for the peers that read them there
  // (ShmWindow::peer_call); -1: not in the arena. Not compared: each rank's
  // own.
  int64_t arena_in = -1, arena_out = -1;
  // all_to_all with per-peer splits, on links without stamps (device
  // memory): the bytes of the block this fingerprint's sender sends to its
  // receiver (each peer gets its own copy), checked against the block the
  // receiver expects before the payload's receive is posted. -1 otherwise.
  // (Stamped links carry it in the message's stamp: Link::pair_stamp.)
  int64_t block_bytes = -1;
};
constexpr uint64_t kPerPeer = 1;
// A hash of a per-rank count list, never 0 or kPerPeer.
uint64_t counts_hash(const int64_t* counts, size_t n);

// "#7 all_reduce(count=..., dtype=..., op=...) [algorithm=...] with segment_bytes=..."
std::string describe(const Fingerprint& f);
// A call's stamp (transport.h): a hash of what same_call() compares.
uint32_t stamp_of(const Fingerprint& f);
// Every field but the sender's rank agrees.
bool same_call(const Fingerprint& a, const Fingerprint& b);
// The error text naming both calls (a from rank a.rank, b from rank b.rank).
std::string mismatch_text(const Fingerprint& a, const Fingerprint& b);
// Could these bytes be `peer`'s fingerprint (and not another call's payload)?
bool plausible(const Fingerprint& f, int peer);

}  // namespace ringcomm
