#include "core/vocabulary.h"

#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdio>

namespace ringcomm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f16: case DType::bf16: case DType::i16: case DType::u16: return 2;
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::f64: case DType::i64: case DType::u64: return 8;
    case DType::i8: case DType::u8: case DType::b8: return 1;
    default: throw_invalid("unknown dtype code " + std::to_string(int(t)));
  }
}

bool dtype_is_floating(DType t) {
  return t == DType::f16 || t == DType::bf16 || t == DType::f32 || t == DType::f64;
}

const char* dtype_name(DType t) {
  static const char* names[] = {"float16", "bfloat16", "float32", "float64", "int8",   "uint8", "int32",
                                "int64",   "int16",    "uint16",  "uint32",  "uint64", "bool"};
  static_assert(sizeof names / sizeof *names == size_t(DType::kCount), "a name per dtype");
  int i = int(t);
  return (i >= 0 && i < int(DType::kCount)) ? names[i] : "?";
}

const char* op_name(Op o) {
  static const char* names[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
  static_assert(sizeof names / sizeof *names == size_t(Op::kCount), "a name per op");
  int i = int(o);
  return (i >= 0 && i < int(Op::kCount)) ? names[i] : "?";
}

bool op_fits(DType t, Op o) {
  if (o == Op::avg) return dtype_is_floating(t);
  if (o == Op::band || o == Op::bor || o == Op::bxor) return !dtype_is_floating(t);
  return true;
}

void check_op(DType t, Op o) {
  if (int(o) < 0 || o >= Op::kCount) throw_invalid("unknown op code " + std::to_string(int(o)));
  if (int(t) < 0 || t >= DType::kCount) throw_invalid("unknown dtype code " + std::to_string(int(t)));
  if (op_fits(t, o)) return;
  if (o == Op::avg)
    throw_invalid(std::string("op 'avg' needs a floating dtype, got ") + dtype_name(t) +
                  " (use 'sum' and divide, or convert to a floating type)");
  throw_invalid(std::string("op '") + op_name(o) + "' needs an integer or bool dtype, got " + dtype_name(t));
}

// The names and traits of RC_COLLECTIVES and RC_ALGORITHMS (vocabulary.h), by code.
namespace {
struct CollTraits {
  const char* name;
  bool reduces, rooted, avg;
};
#define RC_COLL_ROW(name, reduces, rooted, avg) {#name, reduces, rooted, avg},
constexpr CollTraits kColls[] = {RC_COLLECTIVES(RC_COLL_ROW)};
#undef RC_COLL_ROW
static_assert(sizeof kColls / sizeof *kColls == size_t(Coll::kCount), "a row per collective");
#define RC_ALGO_NAME(name) #name,
constexpr const char* kAlgos[] = {RC_ALGORITHMS(RC_ALGO_NAME)};
#undef RC_ALGO_NAME
static_assert(sizeof kAlgos / sizeof *kAlgos == size_t(Algo::kCount), "a name per algorithm");
const CollTraits* coll_traits(Coll c) { return int(c) >= 0 && c < Coll::kCount ? &kColls[int(c)] : nullptr; }
}  // namespace

const char* coll_name(Coll c) { return coll_traits(c) ? coll_traits(c)->name : "?"; }

const char* algo_name(Algo a) { return int(a) >= 0 && a < Algo::kCount ? kAlgos[int(a)] : "auto"; }

bool coll_reduces(Coll c) { return coll_traits(c) && coll_traits(c)->reduces; }

bool coll_has_root(Coll c) { return coll_traits(c) && coll_traits(c)->rooted; }

bool coll_takes_avg(Coll c) { return coll_traits(c) && coll_traits(c)->avg; }

void throw_invalid(const std::string& msg) { throw RingError(ErrKind::invalid, -1, -1, 0, msg); }

void throw_peer_died(int rank, int peer, uint64_t seq, const std::string& msg) {
  RingError e(ErrKind::transport, rank, peer, seq, msg);
  e.peer_died = true;
  throw e;
}

std::string left_words(int rank, uint64_t left, uint64_t seq) {
  return "rank " + std::to_string(rank) + " closed its communicator " +
         (left == 1 ? std::string("before its first collective") : "after its call #" + std::to_string(left - 1)) +
         ": it will not join call #" + std::to_string(seq);
}

void throw_peer_left(int rank, int peer, uint64_t seq, const std::string& why, const std::string& call) {
  RingError e(ErrKind::aborted, rank, peer, seq,
              why + ", and rank " + std::to_string(rank) + " waited for it in " + call);
  e.origin = peer;
  e.cause = ErrKind::aborted;
  e.peer_left = true;
  throw e;
}

// A zombie counts as gone: a process that exited stays one (kill() still
// finds it) until its parent reaps it, which a launcher may do late, or,
// for a program's own child processes, only when it waits for that child.
bool process_gone(int pid) {
  if (kill(pid_t(pid), 0) != 0) return errno == ESRCH;
  char path[64], buf[512];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;  // (no /proc: only kill() can tell)
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');  // the state follows the command name, which may hold ')'
  return close && (close[1] == ' ') && (close[2] == 'Z' || close[2] == 'X');
}

std::string died(int rank, long long pid) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") died";
}

}  // namespace ringcomm
