#include "core/fingerprint.h"

#include <cstdio>

namespace ringcomm {

std::string describe(const Fingerprint& f) {
  char buf[240];
  Coll c = Coll(f.coll);
  if (coll_is_p2p(c)) {  // engine/p2p.cpp's fingerprint of an op: root = the peer (-1: any), algo = the tag
    const bool send = c == Coll::send;
    std::string peer = f.root >= 0 ? "rank " + std::to_string(f.root) : std::string("any rank");
    std::snprintf(buf, sizeof buf, "%s(count=%lld, dtype=%s, %s %s, tag %d)", coll_name(c), (long long)f.count,
                  dtype_name(DType(f.dtype)), send ? "to" : "from", peer.c_str(), f.algo);
    return buf;
  }
  // What the call's fingerprint holds, by the collective's traits (vocabulary.h):
  // the count (not all_to_all's per-peer total, each rank's own), the dtype
  // (not barrier's), the op of one that reduces, the root of a rooted one.
  std::string args;
  if (c != Coll::barrier) {
    if (f.counts != kPerPeer) args += "count=" + std::to_string((long long)f.count) + ", ";
    args += std::string("dtype=") + dtype_name(DType(f.dtype));
    if (coll_reduces(c)) args += std::string(", op=") + op_name(Op(f.op));
    if (coll_has_root(c)) args += ", root=" + std::to_string(f.root);
  }
  std::snprintf(buf, sizeof buf, "#%llu %s(%s)", (unsigned long long)f.seq, coll_name(c), args.c_str());
  std::string s = buf;
  if (f.counts == kPerPeer) {
    s += " with per-peer splits";
  } else if (f.counts) {
    char h[48];
    std::snprintf(h, sizeof h, " with per-rank counts (hash %016llx)", (unsigned long long)f.counts);
    s += h;
  }
  if (f.algo != 0) s += std::string(" [algorithm=") + algo_name(Algo(f.algo)) + "]";

  if (c != Coll::barrier) s += " with segment_bytes=" + std::to_string(f.segment_bytes);
  return s;
}

namespace {
// A word at a time: xor in, multiply, fold the high half down. Each step is
// a bijection of h, so inputs that differ in one word always differ here.
// (The byte-wise FNV-1a this replaced took ~0.1 us per stamp, and the
// shared-memory path stamps a call two or three times in a ~1 us call.)
uint64_t mix_words(const int64_t* v, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= uint64_t(v[i]);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h;
}
}  // namespace

// A hash of what same_call() compares.
uint32_t stamp_of(const Fingerprint& f) {
  const int64_t v[] = {int64_t(f.seq), f.count, f.segment_bytes, f.coll, f.dtype, f.op, f.root, f.algo,
                       int64_t(f.counts)};
  uint64_t h = mix_words(v, sizeof v / sizeof v[0]);
  h ^= h >> 33;  // a finalizer (MurmurHash3's), so every input bit reaches the 32 kept
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return uint32_t(h);
}

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return a.seq == b.seq && a.count == b.count && a.coll == b.coll && a.dtype == b.dtype &&
         a.op == b.op && a.root == b.root && a.segment_bytes == b.segment_bytes && a.algo == b.algo &&
         a.counts == b.counts;
}

std::string mismatch_text(const Fingerprint& a, const Fingerprint& b) {
  return "ranks disagree on a collective call: rank " + std::to_string(a.rank) + " called " + describe(a) +
         " but rank " + std::to_string(b.rank) + " called " + describe(b) +
         " (every rank must issue the same collectives, in the same order, with the same count, dtype, op, root and per-rank counts)";
}

uint64_t counts_hash(const int64_t* counts, size_t n) {
  const uint64_t h = mix_words(counts, n) ^ n;
  return h <= kPerPeer ? h + 2 : h;
}

bool plausible(const Fingerprint& f, int peer) {
  return f.rank == peer && f.coll >= 0 && f.coll < int32_t(Coll::kCount) && f.dtype >= 0 &&
         f.dtype < int32_t(DType::kCount) && f.algo >= 0 && f.algo < int32_t(Algo::kCount) && f.count >= 0;
}

}  // namespace ringcomm
