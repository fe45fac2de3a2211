// Shared vocabulary of the native core: element types, reduction ops,
// collective kinds, and the one error type every layer throws.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ringcomm {

using Clock = std::chrono::steady_clock;

// Values are part of the Python API (ringcomm/_dtypes.py mirrors them).
enum class DType : int32_t { f16 = 0, bf16, f32, f64, i8, u8, i32, i64, kCount };
enum class Op : int32_t { sum = 0, prod, min, max, avg, kCount };
enum class Coll : int32_t { all_reduce = 0, reduce_scatter, all_gather, broadcast, barrier, kCount };

size_t dtype_size(DType t);
bool dtype_is_floating(DType t);
const char* dtype_name(DType t);
const char* op_name(Op o);
const char* coll_name(Coll c);

// Error kinds map one-to-one onto the Python exception classes in ringcomm/errors.py.
enum class ErrKind : int32_t { invalid = 0, timeout, mismatch, aborted, transport };

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
  RingError(ErrKind k, int rank_, int peer_, uint64_t seq_, const std::string& msg)
      : std::runtime_error(msg), kind(k), rank(rank_), peer(peer_), seq(seq_), cause(k) {}
};

[[noreturn]] void throw_invalid(const std::string& msg);

constexpr size_t round_up(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

}  // namespace ringcomm
