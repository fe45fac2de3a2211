// Scan and exscan: prefix reductions over the ranks (MPI_Scan, MPI_Exscan).
// Rank r gets x_0 op x_1 op ... op x_r (scan, inclusive) or
// x_0 op ... op x_{r-1} (exscan, exclusive); exscan's rank 0 gets the op's
// identity (0 for sum, bor, bxor; 1 for prod; the dtype's largest value,
// +inf for floating types, for min; its smallest, -inf, for max; all ones for
// band; on bool: false for sum and max, true for prod, min and band), so an
// exscan of counts with sum is every rank's offset. avg (scan only): the sum
// over ranks 0..r divided by r + 1; exscan refuses it (vocabulary.h), since
// rank 0 would average over no ranks. Operands are combined in rank order,
// the lower ranks' values first, as MPI requires of non-commutative ops.
//
// linear (the pipeline), p = 4, contributions a b c d, the buffer cut into
// segments of at most segment_bytes (k = 0, 1, ...):
//
//   r0: a ---seg k---> r1: a+b ---seg k---> r2: a+b+c ---seg k---> r3: a+b+c+d
//
// Rank r receives segment k of the prefix from r - 1, combines it with its
// own, and passes segment k on while segment k + 1 is on its way: n - 1 + K
// steps of one segment. Each rank sends and receives the buffer once: the
// choice for large buffers.
//
// recursive_doubling, any n (MPICH's): every rank keeps `partial`, the
// reduction over the ranks of its aligned group of 2^k ranks (those < n).
// At step k it exchanges `partial` with r XOR 2^k (when that rank exists);
// from a lower partner the received values precede its own, and go into the
// result too:
//
//            step 0 (r^1)              step 1 (r^2)
//   r0: a    -> partial a+b            -> partial a+b+c+d   result a
//   r1: b    -> partial a+b, res a+b   -> partial a+b+c+d   result a+b
//   r2: c    -> partial c+d            -> partial a+b+c+d   result a+b+c
//   r3: d    -> partial c+d, res c+d   -> partial a+b+c+d   result a+b+c+d
//
// log2(n) steps (rounded up) of the whole buffer: the choice for small ones.
// Its sums add in another order than the pipeline's (the last bit of a
// floating sum may differ between the two algorithms).
#include <cstring>
#include <limits>

#include "algorithms/pairwise.h"
#include "algorithms/plan.h"
#include "algorithms/registry.h"

namespace ringcomm {
namespace {

// ---- the identity of (dtype, op): exscan's rank 0 ----
template <class E>
void identity_of(Op op, void* at) {
  using C = typename E::C;
  using S = typename E::S;
  S s{};
  switch (op) {
    case Op::prod: s = E::store(C(1)); break;
    case Op::min:
      s = E::store(std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity()
                                                        : std::numeric_limits<C>::max());
      break;
    case Op::max:
      s = E::store(std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                        : std::numeric_limits<C>::lowest());
      break;
    case Op::band: std::memset(&s, 0xFF, sizeof s); s = E::store(E::load(s)); break;  // (bool: 1)
    default: s = E::store(C(0)); break;  // sum, bor, bxor
  }
  std::memcpy(at, &s, sizeof s);
}

// One element of the identity, in storage for the program's life: a device
// copies from it after the call returns to the queue.
const unsigned char* identity(DType t, Op op) {
  static unsigned char table[int(DType::kCount)][int(Op::kCount)][16];
  static const bool filled = [] {
    for (int d = 0; d < int(DType::kCount); ++d)
      for (int o = 0; o < int(Op::kCount); ++o) {
        void* at = table[d][o];
        switch (DType(d)) {
          case DType::f16: identity_of<Half>(Op(o), at); break;
          case DType::bf16: identity_of<BFloat16>(Op(o), at); break;
          case DType::f32: identity_of<Plain<float>>(Op(o), at); break;
          case DType::f64: identity_of<Plain<double>>(Op(o), at); break;
          case DType::i8: identity_of<Plain<int8_t>>(Op(o), at); break;
          case DType::u8: identity_of<Plain<uint8_t>>(Op(o), at); break;
          case DType::i16: identity_of<Plain<int16_t>>(Op(o), at); break;
          case DType::u16: identity_of<Plain<uint16_t>>(Op(o), at); break;
          case DType::i32: identity_of<Plain<int32_t>>(Op(o), at); break;
          case DType::u32: identity_of<Plain<uint32_t>>(Op(o), at); break;
          case DType::i64: identity_of<Plain<int64_t>>(Op(o), at); break;
          case DType::u64: identity_of<Plain<uint64_t>>(Op(o), at); break;
          case DType::b8: identity_of<Bool>(Op(o), at); break;
          default: break;
        }
      }
    return true;
  }();
  (void)filled;
  return table[int(t)][int(op)];
}

// out = the identity, every element. On the host a loop; on a device one
// element is copied from the host, then doubled in place (log2(count) copies).
void fill_identity(const AlgoCall& c) {
  if (!c.count) return;
  const unsigned char* one = identity(c.dtype, c.op);
  if (!c.link.device()) {
    for (size_t i = 0; i < c.count; ++i) std::memcpy(c.out + i * c.es, one, c.es);
    return;
  }
  c.link.copy(c.out, one, c.es);
  for (size_t have = 1; have < c.count;) {
    const size_t more = std::min(have, c.count - have);
    c.link.copy(c.out + have * c.es, c.out, more * c.es);
    have += more;
  }
}

// ---- linear: the pipeline ----
void linear_prefix(const AlgoCall& c, bool inclusive) {
  Link& link = c.link;
  const int n = link.size(), r = link.rank();
  const size_t es = c.es, total = c.count * es;
  const int K = whole_buffer_segments(c.count, es, link.options().segment_bytes);
  auto off = [&](int k) { return split_offset(c.count, K, k) * es; };
  auto len = [&](int k) { return split_size(c.count, K, k); };
  const bool first = r == 0, last = r == n - 1;
  link.trace_start(Phase::broadcast, r, last ? -1 : r + 1, -1, last ? 0 : total, first ? -1 : r - 1, -1,
                   first ? 0 : total);
  if (first) {
    // Rank 0's prefix is its own input: it goes on as it is (read from `in`
    // until the sends are done; exscan's identity may overwrite it after).
    if (inclusive) link.copy(c.out, c.in, total);
    int unit = 0;
    if (n > 1) send_all(link, 1, inclusive ? c.out : c.in, c.count, es, unit);
    link.drain();
    if (!inclusive) fill_identity(c);
  } else if (inclusive) {
    // out_k = prefix_k op in_k as segment k arrives (in place too: recv_reduce
    // writes dst only from a and the received slot), then on to r + 1.
    int recv_unit = 0, send_unit = 0;
    for (int k = 0; k < K; ++k) {
      recv_reduce(link, *c.red, r - 1, c.in + off(k), c.out + off(k), len(k), es, k, recv_unit);
      if (!last) send_all(link, r + 1, c.out + off(k), len(k), es, send_unit);
    }
    link.drain();
  } else {
    // out_k = prefix_k; sent on: prefix_k op in_k, in scratch (out holds
    // the prefix; in place, the input is kept first).
    const char* mine = c.in;
    char* onward = nullptr;
    if (!last) {
      char* work = link.scratch(1, (c.in == c.out ? 2 : 1) * total);
      onward = work;
      if (c.in == c.out) {
        link.copy(work + total, c.in, total);
        mine = work + total;
      }
    }
    int recv_unit = 0, send_unit = 0;
    for (int k = 0; k < K; ++k) {
      recv_all(link, r - 1, c.out + off(k), len(k), es, k, recv_unit);
      if (last) continue;
      c.red->reduce(onward + off(k), c.out + off(k), mine + off(k), len(k));
      send_all(link, r + 1, onward + off(k), len(k), es, send_unit);
    }
    link.drain();
  }
  if (inclusive) c.red->finalize(c.out, c.count, r + 1);  // avg: the sum of ranks 0..r over r + 1
  link.trace_finish(c.out, total);
}

// ---- recursive doubling ----
void doubling_prefix(const AlgoCall& c, bool inclusive) {
  Link& link = c.link;
  const int n = link.size(), r = link.rank();
  const size_t es = c.es, total = c.count * es;
  const int K = whole_buffer_segments(c.count, es, link.options().segment_bytes);
  char* partial = link.scratch(1, 2 * total);  // this rank's group's reduction, then the partner's
  char* theirs = partial + total;
  link.copy(partial, c.in, total);  // (before out changes: in place, in is out)
  if (inclusive) link.copy(c.out, c.in, total);
  bool have = inclusive;  // exscan: out holds something once a lower partner has sent
  for (int k = 0, mask = 1; mask < n; ++k, mask <<= 1) {
    const int peer = r ^ mask;
    if (peer >= n) continue;
    link.trace_start(Phase::exchange, k, peer, -1, total, peer, -1, total);
    // Units by step: a rank whose partner is missing skips a step, and the
    // two sides of an exchange must still number it alike (transport.h).
    int send_unit = k * K, recv_unit = k * K;
    send_all(link, peer, partial, c.count, es, send_unit);
    recv_all(link, peer, theirs, c.count, es, k, recv_unit);
    link.drain();  // `partial` changes below; its sends read it
    if (peer < r) {  // the lower group's values come first
      if (have) c.red->reduce(c.out, theirs, c.out, c.count);
      else link.copy(c.out, theirs, total);
      have = true;
      c.red->reduce(partial, theirs, partial, c.count);
    } else {
      c.red->reduce(partial, partial, theirs, c.count);
    }
    link.trace_finish(c.out, total);
  }
  link.drain();
  if (!have) fill_identity(c);  // exscan's rank 0
  if (inclusive) c.red->finalize(c.out, c.count, r + 1);
}

}  // namespace

// The rows' run functions and closed forms (declared in registry.cpp, the only caller).
void scan_linear(const AlgoCall& c) { linear_prefix(c, true); }
void exscan_linear(const AlgoCall& c) { linear_prefix(c, false); }
void scan_doubling(const AlgoCall& c) { doubling_prefix(c, true); }
void exscan_doubling(const AlgoCall& c) { doubling_prefix(c, false); }

// The closed forms (traffic "native"): bytes per peer from the schedules
// drawn above, not from the code, so the ledger checks the code against them.
void scan_linear_bytes(int n, int r, size_t count, size_t es, size_t, int64_t* sent, int64_t* received) {
  if (r + 1 < n) sent[r + 1] = int64_t(count * es);
  if (r > 0) received[r - 1] = int64_t(count * es);
}
void scan_doubling_bytes(int n, int r, size_t count, size_t es, size_t, int64_t* sent, int64_t* received) {
  for (int mask = 1; mask < n; mask <<= 1)
    if ((r ^ mask) < n) sent[r ^ mask] = received[r ^ mask] = int64_t(count * es);
}

}  // namespace ringcomm
