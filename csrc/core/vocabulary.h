// The vocabulary of the native core, for host and device alike:
//   * the codes that cross the binding (DType, Op, Coll, Algo, ErrKind);
//     ringcomm/vocab.py, ringcomm/errors.py and ringcomm/comm.py mirror
//     their values, which are part of the Python API;
//   * what an element of each dtype is: the type it is stored in, the type
//     it is combined in, and the conversions between them (Plain, Half,
//     BFloat16);
//   * what each op does to two elements (ops::Sum, Prod, Min, Max);
//   * the one error type every layer throws (RingError), with the host's
//     ways to throw it (throw_invalid, throw_peer_died) and to tell a dead
//     peer process (process_gone).
// g++ compiles it for the host (the host reducer and everything else), nvcc
// for the device kernels (cuda/reducer_cuda.cu): the element traits and the
// ops are __host__ __device__ there (RC_HD), so both reducers define every
// (dtype, op) the same way and give the same results.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define RC_HD __host__ __device__ __forceinline__
#else
#if !defined(__FLT16_MANT_DIG__)
#error "ringcomm needs a compiler with _Float16 (GCC >= 12 or Clang >= 15 on x86-64/aarch64)"
#endif
#define RC_HD inline __attribute__((always_inline))  // must inline into the vectorized loops
#endif

namespace ringcomm {

// ---- codes ------------------------------------------------------------------
// (New codes go at the end: the codes are the wire's and the flight records'.)
enum class DType : int32_t { f16 = 0, bf16, f32, f64, i8, u8, i32, i64, i16, u16, u32, u64, b8, kCount };
// band, bor, bxor: bitwise, on integers and bool only (torch's BAND/BOR/BXOR,
// MPI_BAND/BOR/BXOR); avg on floating types only (op_fits).
enum class Op : int32_t { sum = 0, prod, min, max, avg, band, bor, bxor, kCount };
// The collectives, one line each: name, whether it combines values with an
// op (its fingerprint and the reducer), whether it has a root, whether op
// 'avg' is defined for it. The enum, the names (coll_name) and the traits
// below are read from this one list; a new collective is one line here, at
// the end (its code is its place). send and recv are point-to-point
// (engine/p2p.h): not collectives (never queued, no call sequence number);
// codes of their own for the ledger and the flight recorder.
#define RC_COLLECTIVES(X)                       \
  X(all_reduce, true, false, true)              \
  X(reduce_scatter, true, false, true)          \
  X(all_gather, false, false, false)            \
  X(broadcast, false, true, false)              \
  X(barrier, false, false, false)               \
  X(reduce, true, true, true)                   \
  X(gather, false, true, false)                 \
  X(scatter, false, true, false)                \
  X(all_to_all, false, false, false)            \
  X(send, false, false, false)                  \
  X(recv, false, false, false)                  \
  X(scan, true, false, true)                    \
  X(exscan, true, false, false)
#define RC_COLL_CODE(name, reduces, rooted, avg) name,
enum class Coll : int32_t { RC_COLLECTIVES(RC_COLL_CODE) kCount };
#undef RC_COLL_CODE
// Queued collectives are every code but these two (Engine::validate).
constexpr bool coll_is_p2p(Coll c) { return c == Coll::send || c == Coll::recv; }
// The algorithms a collective can run (algorithms/algorithms.h), one name
// each, in code order. `automatic` is resolved by the Engine before the
// call starts (Engine::choose_algorithm, with the crossovers
// ringcomm/tuning/selection.py computes); it never travels.
// binomial: reduce's tree (small buffers); linear: gather and scatter through
// the root, one message stream per rank; pairwise: all_to_all's n-1 exchanges.
#define RC_ALGORITHMS(X) \
  X(ring) X(naive) X(recursive_doubling) X(halving_doubling) X(binomial) X(linear) X(pairwise) X(shm) X(shm_flat) \
  X(zero_copy) X(hierarchical)
#define RC_ALGO_CODE(name) name,
enum class Algo : int32_t { RC_ALGORITHMS(RC_ALGO_CODE) kCount, automatic = -1 };
#undef RC_ALGO_CODE
// Error kinds map one-to-one onto the Python exception classes in ringcomm/errors.py.
enum class ErrKind : int32_t { invalid = 0, timeout, mismatch, aborted, transport };

size_t dtype_size(DType t);
bool dtype_is_floating(DType t);
const char* dtype_name(DType t);
const char* op_name(Op o);
// Whether `o` is defined on `t` (avg: floating types; band/bor/bxor:
// integers and bool); check_op throws InvalidArgument saying why not.
bool op_fits(DType t, Op o);
void check_op(DType t, Op o);
const char* coll_name(Coll c);
const char* algo_name(Algo a);
// The traits of RC_COLLECTIVES: the collective combines values with an op;
// it has a root; op 'avg' is defined for it (Engine::validate refuses it
// elsewhere, before the call starts).
bool coll_reduces(Coll c);
bool coll_has_root(Coll c);
bool coll_takes_avg(Coll c);

// ---- element traits: storage type S, compute type C, load/store -------------
// Half types are widened to float, combined, and rounded back
// (round-to-nearest-even, as numpy and ml_dtypes do), so each ring step
// rounds exactly once.
template <class T>
struct Plain {
  using S = T;
  using C = T;
  static RC_HD C load(S x) { return x; }
  static RC_HD S store(C x) { return x; }
};

struct Half {
#if defined(__CUDACC__)
  using S = __half;
  using C = float;
  static RC_HD C load(S x) { return __half2float(x); }
  static RC_HD S store(C x) { return __float2half_rn(x); }
#else
  using S = _Float16;
  using C = float;
  static RC_HD C load(S x) { return float(x); }
  static RC_HD S store(C x) { return S(x); }
#endif
};

// A bool is one byte, 0 or 1, read as true wherever it is not 0 (as numpy and
// torch do: a byte reinterpreted as bool may hold any value), so every op is
// defined on it: sum and max are "or", prod and min are "and" (gloo's rule:
// its sum of two bools is a bool).
struct Bool {
  using S = uint8_t;
  using C = uint8_t;
  static RC_HD C load(S x) { return C(x != 0); }
  static RC_HD S store(C x) { return S(x != 0); }
};

// Stored as its bits: a bfloat16 is the upper half of a float32.
struct BFloat16 {
  using S = uint16_t;
  using C = float;
  static RC_HD C load(S x) { return bit_cast<float>(uint32_t(x) << 16); }
  static RC_HD S store(C f) {
#if defined(__CUDA_ARCH__)
    // The device's own conversion (one instruction from sm_80 on).
    return __nv_bfloat16_raw(__float2bfloat16_rn(f)).x;
#else
    const uint32_t u = bit_cast<uint32_t>(f);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // nearest, ties to even
    const uint32_t quiet_nan = (u >> 16) | 0x40u;                     // keep NaN a NaN
    return S(f != f ? quiet_nan : rounded);
#endif
  }

 private:
  template <class To, class From>
  static RC_HD To bit_cast(From x) {  // (memcpy is a register move here, on host and device)
    static_assert(sizeof(To) == sizeof(From), "same size");
    To y;
    std::memcpy(&y, &x, sizeof y);
    return y;
  }
};

// ---- ops --------------------------------------------------------------------
// Integers wrap modulo 2^bits (computed in the unsigned type of the same
// width: signed overflow is undefined in C++); min/max compare with <, in the
// compute type (float for half types), and return a NaN operand. avg is sum,
// then one division by the number of ranks (Reducer::finalize).
namespace ops {

// The unsigned type of C's width, but never narrower than int: a 16-bit
// product is computed in unsigned int (promoted to a signed int, 65535 *
// 65535 would overflow it).
template <class C, bool = std::is_integral<C>::value>
struct WideOf { using type = C; };
template <class C>
struct WideOf<C, true> { using type = typename std::make_unsigned<typename std::common_type<C, int>::type>::type; };
template <class C>
using Wide = typename WideOf<C>::type;

// kPicks: the op returns one of its operands (second(): which), so
// combine() copies that operand's bits.
struct Sum {
  static constexpr bool kPicks = false;
  template <class C>
  static RC_HD C apply(C a, C b) { return C(Wide<C>(a) + Wide<C>(b)); }
};
struct Prod {
  static constexpr bool kPicks = false;
  template <class C>
  static RC_HD C apply(C a, C b) { return C(Wide<C>(a) * Wide<C>(b)); }
};
// A NaN in either operand is the result (as numpy's minimum/maximum and
// torch's): with `<` alone a NaN survived only as the first operand, so the
// result depended on the order in which an algorithm met the ranks (a NaN
// could even hide a larger value of a third rank).
template <class C>
RC_HD bool is_nan(C x) { return x != x; }  // (false for integers: compiled away)
// A float (a half type's compute type too) by its bits: GCC narrows
// float(h) != float(h) of a _Float16 h to a library call per element.
RC_HD bool is_nan(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7FFFFFFFu) > 0x7F800000u;
}

// (`|`, not `||`: no branch.)
struct Min {
  static constexpr bool kPicks = true;
  template <class C>
  static RC_HD bool second(C a, C b) { return bool(b < a) | is_nan(b); }
  template <class C>
  static RC_HD C apply(C a, C b) { return second(a, b) ? b : a; }
};
struct Max {
  static constexpr bool kPicks = true;
  template <class C>
  static RC_HD bool second(C a, C b) { return bool(a < b) | is_nan(b); }
  template <class C>
  static RC_HD C apply(C a, C b) { return second(a, b) ? b : a; }
};

template <size_t> struct BitsOf;
template <> struct BitsOf<1> { using type = uint8_t; };
template <> struct BitsOf<2> { using type = uint16_t; };
template <> struct BitsOf<4> { using type = uint32_t; };
template <> struct BitsOf<8> { using type = uint64_t; };

// Bitwise, on integers and bool (op_fits); on bool's 0/1 they are and, or, xor.
struct BAnd {
  static constexpr bool kPicks = false;
  template <class C>
  static RC_HD C apply(C a, C b) { return C(a & b); }
};
struct BOr {
  static constexpr bool kPicks = false;
  template <class C>
  static RC_HD C apply(C a, C b) { return C(a | b); }
};
struct BXor {
  static constexpr bool kPicks = false;
  template <class C>
  static RC_HD C apply(C a, C b) { return C(a ^ b); }
};

// One element of a (op) b, on the host and in the kernels alike. min and max
// copy the bits of the operand they pick (compared in the compute type): a
// half type is not rounded back (exact, a NaN's payload kept), and the pick
// is a mask, not a branch (GCC does not vectorize _Float16 on the host, and
// a branch per element, mispredicted on random data, made float16 max 4.5x
// slower). A bool is normalized to 0/1, as every op's result is.
template <class E, class F>
RC_HD typename E::S combine(typename E::S x, typename E::S y) {
  using S = typename E::S;
  if constexpr (!F::kPicks || std::is_same<E, Bool>::value) {
    return E::store(F::apply(E::load(x), E::load(y)));
  } else if constexpr (std::is_same<S, typename E::C>::value) {
    return F::second(x, y) ? y : x;  // (vectorized as a blend)
  } else {
    using U = typename BitsOf<sizeof(S)>::type;
    U xs, ys;
    std::memcpy(&xs, &x, sizeof xs);
    std::memcpy(&ys, &y, sizeof ys);
    const U m = U(-int(F::second(E::load(x), E::load(y))));  // all ones: take y
    const U r = U((ys & m) | (xs & U(~m)));
    S out;
    std::memcpy(&out, &r, sizeof out);
    return out;
  }
}

}  // namespace ops

// ---- errors -----------------------------------------------------------------
// Every failure carries who saw it, which peer was involved and which collective
// (by sequence number), so a message from any rank of a large job is actionable.
struct RingError : std::runtime_error {
  ErrKind kind;
  int rank;
  int peer;       // -1 when no single peer is involved
  uint64_t seq;   // sequence number of the collective on this communicator (0: none)
  // Where the failure began: the rank that detected it and what it was (a
  // rank that heard of it through the ring raises `aborted`, but keeps the
  // origin's rank and kind here). -1 / kind itself when this rank is the origin.
  int origin = -1;
  ErrKind cause;
  // A transport error because `peer`'s process is gone (or, over UCX,
  // unreachable): the ABORT notice carries it, so the ranks that hear of
  // the failure second-hand still say the peer died.
  bool peer_died = false;
  // Aborted because `origin` closed its communicator (throw_peer_left).
  bool peer_left = false;
  // Heard second-hand (through the shared-memory window): the peer the
  // origin named, whose death peer_died then tells (-1: none or unknown).
  int origin_peer = -1;
  // An engine between hosts stopped by a failure on its host (Engine::
  // abort_for): the rank of the hierarchical communicator above that
  // failure was about, in that communicator's numbering (the ABORT notice
  // carries it to the other hosts; -1: none); peer_died: it died.
  int about = -1;
  RingError(ErrKind k, int rank_, int peer_, uint64_t seq_, const std::string& msg)
      : std::runtime_error(msg), kind(k), rank(rank_), peer(peer_), seq(seq_), cause(k) {}
  // The same failure told in other words: every field kept, whatever fields come.
  RingError retold(const std::string& msg) const {
    RingError r = *this;
    static_cast<std::runtime_error&>(r) = std::runtime_error(msg);
    return r;
  }
};

[[noreturn]] void throw_invalid(const std::string& msg);
// A transport error because `peer`'s process is gone (RingError::peer_died).
[[noreturn]] void throw_peer_died(int rank, int peer, uint64_t seq, const std::string& msg);
// `peer` closed its communicator (`why`: ShmWindow::left_note's words) while
// `rank` waited for it in call `seq` (`call`: its description): the
// communicator is aborted with `peer` as the origin.
[[noreturn]] void throw_peer_left(int rank, int peer, uint64_t seq, const std::string& why, const std::string& call);
// "rank R closed its communicator after its call #k: it will not join call
// #seq" (`left`: 1 + k, as ShmWindow and Link keep it).
std::string left_words(int rank, uint64_t left, uint64_t seq);
// The process `pid` (of this host and pid namespace) has exited: gone, or a
// zombie its parent has not reaped yet.
bool process_gone(int pid);
// "rank R (pid P) died": how every wait names a peer whose process is gone.
std::string died(int rank, long long pid);

// ---- small shared helpers ---------------------------------------------------
using Clock = std::chrono::steady_clock;

constexpr size_t round_up(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// The most elements one buffer, count or sum of per-rank counts may have:
// the bytes of the widest element (16) fit an int64, and a running sum of
// such counts, each checked against it, never wraps. Python's door uses it
// too (core.MAX_ELEMENTS), so both sides refuse the same calls.
constexpr size_t kMaxElements = size_t(1) << 59;

}  // namespace ringcomm
