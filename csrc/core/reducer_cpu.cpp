// Host reducers: one plain loop per (dtype, op), written so that the compiler
// vectorizes it (no branches in the body, no calls, unit stride). Half types
// are widened to float, combined, and rounded back (round-to-nearest-even, as
// numpy and ml_dtypes do), so each ring step rounds exactly once; min and max
// copy the operand they pick (ops::combine).
//
// The element types and the ops themselves (integer wrap-around included)
// are in core/vocabulary.h, shared with the device kernels.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/reducer.h"
#include "core/vocabulary.h"

// On x86-64, also build an AVX2/F16C clone of each loop and pick at load time,
// so a portable wheel still gets wide vectors and hardware half conversion.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RC_CLONES __attribute__((target_clones("default", "arch=x86-64-v3")))
#else
#define RC_CLONES
#endif
#define RC_INLINE inline __attribute__((always_inline))

namespace ringcomm {
namespace {

// ---- element types and ops: core/vocabulary.h (shared with the device kernels)
using ops::Max;
using ops::Min;
using ops::Prod;
using ops::Sum;

template <class E, class F>
RC_INLINE void loop(void* dst, const void* a, const void* b, size_t n) {
  using S = typename E::S;
  S* d = static_cast<S*>(dst);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = ops::combine<E, F>(x[i], y[i]);
}

template <class E>
RC_INLINE void dispatch(Op op, void* dst, const void* a, const void* b, size_t n) {
  switch (op) {
    case Op::sum: case Op::avg: loop<E, Sum>(dst, a, b, n); break;
    case Op::prod: loop<E, Prod>(dst, a, b, n); break;
    case Op::min: loop<E, Min>(dst, a, b, n); break;
    case Op::max: loop<E, Max>(dst, a, b, n); break;
    default:
      if constexpr (std::is_integral<typename E::C>::value) {  // (op_fits: never on floating types)
        if (op == Op::band) loop<E, ops::BAnd>(dst, a, b, n);
        else if (op == Op::bor) loop<E, ops::BOr>(dst, a, b, n);
        else if (op == Op::bxor) loop<E, ops::BXor>(dst, a, b, n);
      }
      break;
  }
}

template <class E>
RC_INLINE void divide(void* buf, size_t n, int nranks) {
  using S = typename E::S;
  using C = typename E::C;
  S* d = static_cast<S*>(buf);
  const C div = C(nranks);
  for (size_t i = 0; i < n; ++i) d[i] = E::store(E::load(d[i]) / div);
}

// One multiversioned entry per dtype (the templates above inline into each clone).
#define RC_DTYPE_ENTRY(NAME, E)                                                   \
  RC_CLONES void reduce_##NAME(Op op, void* d, const void* a, const void* b, size_t n) { \
    dispatch<E>(op, d, a, b, n);                                                  \
  }
RC_DTYPE_ENTRY(f16, Half)
RC_DTYPE_ENTRY(bf16, BFloat16)
RC_DTYPE_ENTRY(f32, Plain<float>)
RC_DTYPE_ENTRY(f64, Plain<double>)
RC_DTYPE_ENTRY(i8, Plain<int8_t>)
RC_DTYPE_ENTRY(u8, Plain<uint8_t>)
RC_DTYPE_ENTRY(i32, Plain<int32_t>)
RC_DTYPE_ENTRY(i64, Plain<int64_t>)
RC_DTYPE_ENTRY(i16, Plain<int16_t>)
RC_DTYPE_ENTRY(u16, Plain<uint16_t>)
RC_DTYPE_ENTRY(u32, Plain<uint32_t>)
RC_DTYPE_ENTRY(u64, Plain<uint64_t>)
RC_DTYPE_ENTRY(b8, Bool)
#undef RC_DTYPE_ENTRY

using ReduceFn = void (*)(Op, void*, const void*, const void*, size_t);
using DivideFn = void (*)(void*, size_t, int);

class CpuReducer final : public Reducer {
 public:
  CpuReducer(Op op, ReduceFn reduce, DivideFn divide) : op_(op), reduce_(reduce), divide_(divide) {}
  void reduce(void* dst, const void* a, const void* b, size_t count) const override {
    if (count) reduce_(op_, dst, a, b, count);
  }
  void finalize(void* buf, size_t count, int nranks) const override {
    if (op_ == Op::avg && count) divide_(buf, count, nranks);
  }

 private:
  Op op_;
  ReduceFn reduce_;
  DivideFn divide_;
};

template <class E>
void divide_fn(void* buf, size_t n, int nranks) { divide<E>(buf, n, nranks); }

}  // namespace

void check_reducer(DType dtype, Op op) {
  check_op(dtype, op);
}

std::unique_ptr<Reducer> make_cpu_reducer(DType dtype, Op op) {
  check_reducer(dtype, op);
  switch (dtype) {
    case DType::f16: return std::make_unique<CpuReducer>(op, reduce_f16, divide_fn<Half>);
    case DType::bf16: return std::make_unique<CpuReducer>(op, reduce_bf16, divide_fn<BFloat16>);
    case DType::f32: return std::make_unique<CpuReducer>(op, reduce_f32, divide_fn<Plain<float>>);
    case DType::f64: return std::make_unique<CpuReducer>(op, reduce_f64, divide_fn<Plain<double>>);
    case DType::i8: return std::make_unique<CpuReducer>(op, reduce_i8, nullptr);
    case DType::u8: return std::make_unique<CpuReducer>(op, reduce_u8, nullptr);
    case DType::i32: return std::make_unique<CpuReducer>(op, reduce_i32, nullptr);
    case DType::i64: return std::make_unique<CpuReducer>(op, reduce_i64, nullptr);
    case DType::i16: return std::make_unique<CpuReducer>(op, reduce_i16, nullptr);
    case DType::u16: return std::make_unique<CpuReducer>(op, reduce_u16, nullptr);
    case DType::u32: return std::make_unique<CpuReducer>(op, reduce_u32, nullptr);
    case DType::u64: return std::make_unique<CpuReducer>(op, reduce_u64, nullptr);
    case DType::b8: return std::make_unique<CpuReducer>(op, reduce_b8, nullptr);
    default: throw_invalid("unknown dtype code " + std::to_string(int(dtype)));
  }
}

}  // namespace ringcomm
