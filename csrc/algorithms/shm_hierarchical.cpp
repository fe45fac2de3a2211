// Across hosts ("hierarchical"): the shared-memory window inside each host,
// the inter-host transport between them (what every shm algorithm shares:
// shm_internal.h).
//
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
// Only 1/L of the buffer leaves each rank for other hosts. A large buffer
// goes in P pieces (piece p: the p-th P-th of every chunk), pipelined: piece
// p's step between hosts runs in the background while the host reduces
// piece p + 1 and gathers piece p - 1, so the network, which bounds the
// whole, never waits for the host's memory (nor the first piece's bytes for
// the last one's reduction). Each element moves as it would unpipelined.
//
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
#include "algorithms/shm_internal.h"

namespace ringcomm {

using namespace shm_detail;

namespace {

// Pieces of at least this many bytes of a chunk, at most kMaxPieces: enough
// to hide the host's reduce and gather (a few percent of the time on a
// 1 Gbit/s link) behind the network, few enough that each piece's step
// between hosts stays long against its latency.
constexpr size_t kPieceBytes = size_t(2) << 20;
constexpr size_t kMaxPieces = 8;

// Piece p of P: the p-th P-th of every local rank's chunk.
Parts piece_of(const RingPlan& local, size_t p, size_t P) {
  const int L = local.nranks();
  Parts parts{std::vector<size_t>(size_t(L)), std::vector<size_t>(size_t(L)), local.elem_size()};
  for (int l = 0; l < L; ++l) {
    const size_t c = local.chunk_count(l), from = c * p / P, to = c * (p + 1) / P;
    parts.begin[size_t(l)] = local.chunk_begin(l) + from;
    parts.count[size_t(l)] = to - from;
  }
  return parts;
}

}  // namespace

size_t hierarchical_pieces(size_t count, int local, size_t es) {
  const size_t largest = (count + size_t(local) - 1) / size_t(std::max(local, 1)) * es;
  return std::max<size_t>(1, std::min(kMaxPieces, largest / kPieceBytes));
}

void hierarchical_all_reduce(Link& link, size_t count, size_t es, const Reducer& red, const char* in, char* out,
                             const Across& across) {
  ShmWindow& w = window_of(link);
  const RingPlan local(count, w.size(), es, link.options().segment_bytes);
  const size_t P = hierarchical_pieces(count, w.size(), es);
  if (P == 1) {
    char* own = out + local.chunk_begin(w.rank()) * es;
    direct(link, local, red, in, Then::keep, own);
    across(Coll::all_reduce, own, own, local.chunk_count(w.rank()));
    red.finalize(own, local.chunk_count(w.rank()), link.size());
    shm_all_gather(link, local, own, out);
    return;
  }
  // (a step left unwaited by a failure is stopped and settled by its destructor)
  std::unique_ptr<AcrossStep> flying;
  Parts before;
  for (size_t p = 0; p <= P; ++p) {
    Parts now;
    std::unique_ptr<AcrossStep> started;
    if (p < P) {
      now = piece_of(local, p, P);
      char* own = out + now.chunk_begin(w.rank()) * es;
      direct(link, now, red, in, Then::keep, own);
      started = across.start(Coll::all_reduce, own, own, now.chunk_count(w.rank()));
    }
    if (flying) {
      flying->wait();
      flying.reset();
      char* own = out + before.chunk_begin(w.rank()) * es;
      red.finalize(own, before.chunk_count(w.rank()), link.size());
      gather(link, before, own, out);
    }
    flying = std::move(started);
    before = std::move(now);
  }
}

namespace {

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
