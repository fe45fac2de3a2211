// Elementwise reduction kernels for every (dtype, op) of the host side.
//
// dst[i] = a[i] (op) b[i]. Each thread handles 16 bytes at a time (one uint4
// load from a, one from b, one store), which is what reaches the memory
// bandwidth; a scalar head brings the three pointers to a 16-byte boundary
// when they share their misalignment (vector_split.h), and the tail (or
// pointers that disagree) goes through a scalar loop. Each element is
// ops::combine (core/vocabulary.h), the host reducer's own: half types are
// widened to float, combined and rounded once (round-to-nearest-even; min and
// max copy the operand they pick), so host and device give bit-identical
// results. Integer sum and prod wrap modulo 2^bits (computed unsigned). avg =
// sum, then one division by nranks in the compute type (finalize).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/vocabulary.h"
#include "cuda/checks.h"
#include "cuda/reducer_cuda.h"
#include "cuda/vector_split.h"

namespace ringcomm {
namespace {

using ops::Max;  // core/vocabulary.h: the same element types and ops as the host reducer
using ops::Min;
using ops::Prod;
using ops::Sum;

using ops::combine;

// Vectorized part: 16-byte words; i indexes words.
template <class E, class F>
__global__ void reduce_vec(uint4* dst, const uint4* a, const uint4* b, size_t words) {  // dst may be a or b
  using S = typename E::S;
  constexpr int kPer = sizeof(uint4) / sizeof(S);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    uint4 va = a[i], vb = b[i], vo;
    const S* pa = reinterpret_cast<const S*>(&va);
    const S* pb = reinterpret_cast<const S*>(&vb);
    S* po = reinterpret_cast<S*>(&vo);
#pragma unroll
    for (int k = 0; k < kPer; ++k) po[k] = combine<E, F>(pa[k], pb[k]);
    dst[i] = vo;
  }
}

// Scalar part: the tail after the vectorized words, or everything if misaligned.
template <class E, class F>
__global__ void reduce_scalar(typename E::S* dst, const typename E::S* a, const typename E::S* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = combine<E, F>(a[i], b[i]);
}

template <class E>
__global__ void divide(typename E::S* buf, size_t n, int nranks) {
  using C = typename E::C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    buf[i] = E::store(E::load(buf[i]) / C(nranks));
}

constexpr int kThreads = 512;

unsigned blocks_for(size_t items) {
  size_t b = (items + kThreads - 1) / kThreads;
  return unsigned(b == 0 ? 1 : (b > 65535 ? 65535 : b));  // grid-stride loops cover the rest
}

template <class E, class F>
void launch_scalar(typename E::S* dst, const typename E::S* a, const typename E::S* b, size_t n, cudaStream_t s) {
  if (!n) return;
  reduce_scalar<E, F><<<blocks_for(n), kThreads, 0, s>>>(dst, a, b, n);
  RC_CUDA(cudaGetLastError());
}

template <class E, class F>
void launch(void* dst, const void* a, const void* b, size_t n, cudaStream_t s) {
  using S = typename E::S;
  constexpr size_t kPer = sizeof(uint4) / sizeof(S);
  const VectorSplit sp = vector_split(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(a),
                                      reinterpret_cast<uintptr_t>(b), n, sizeof(S));
  S* d = static_cast<S*>(dst);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  launch_scalar<E, F>(d, x, y, sp.head, s);
  if (sp.words) {
    reduce_vec<E, F><<<blocks_for(sp.words), kThreads, 0, s>>>(reinterpret_cast<uint4*>(d + sp.head),
                                                               reinterpret_cast<const uint4*>(x + sp.head),
                                                               reinterpret_cast<const uint4*>(y + sp.head), sp.words);
    RC_CUDA(cudaGetLastError());
  }
  const size_t done = sp.head + sp.words * kPer;
  launch_scalar<E, F>(d + done, x + done, y + done, sp.tail, s);
}

template <class E>
void launch_op(Op op, void* dst, const void* a, const void* b, size_t n, cudaStream_t s) {
  switch (op) {
    case Op::sum: case Op::avg: launch<E, Sum>(dst, a, b, n, s); break;
    case Op::prod: launch<E, Prod>(dst, a, b, n, s); break;
    case Op::min: launch<E, Min>(dst, a, b, n, s); break;
    case Op::max: launch<E, Max>(dst, a, b, n, s); break;
    default:
      if constexpr (std::is_integral<typename E::C>::value) {  // (op_fits: never on floating types)
        if (op == Op::band) return launch<E, ops::BAnd>(dst, a, b, n, s);
        if (op == Op::bor) return launch<E, ops::BOr>(dst, a, b, n, s);
        if (op == Op::bxor) return launch<E, ops::BXor>(dst, a, b, n, s);
      }
      throw_invalid("unknown op");
  }
}

template <class E>
void launch_divide(void* buf, size_t n, int nranks, cudaStream_t s) {
  divide<E><<<blocks_for(n), kThreads, 0, s>>>(static_cast<typename E::S*>(buf), n, nranks);
  RC_CUDA(cudaGetLastError());
}

class CudaReducer final : public Reducer {
 public:
  CudaReducer(DType d, Op op, cudaStream_t s) : dtype_(d), op_(op), stream_(s) {}

  void reduce(void* dst, const void* a, const void* b, size_t n) const override {
    if (!n) return;
    switch (dtype_) {
      case DType::f16: launch_op<Half>(op_, dst, a, b, n, stream_); break;
      case DType::bf16: launch_op<BFloat16>(op_, dst, a, b, n, stream_); break;
      case DType::f32: launch_op<Plain<float>>(op_, dst, a, b, n, stream_); break;
      case DType::f64: launch_op<Plain<double>>(op_, dst, a, b, n, stream_); break;
      case DType::i8: launch_op<Plain<int8_t>>(op_, dst, a, b, n, stream_); break;
      case DType::u8: launch_op<Plain<uint8_t>>(op_, dst, a, b, n, stream_); break;
      case DType::i32: launch_op<Plain<int32_t>>(op_, dst, a, b, n, stream_); break;
      case DType::i64: launch_op<Plain<int64_t>>(op_, dst, a, b, n, stream_); break;
      case DType::i16: launch_op<Plain<int16_t>>(op_, dst, a, b, n, stream_); break;
      case DType::u16: launch_op<Plain<uint16_t>>(op_, dst, a, b, n, stream_); break;
      case DType::u32: launch_op<Plain<uint32_t>>(op_, dst, a, b, n, stream_); break;
      case DType::u64: launch_op<Plain<uint64_t>>(op_, dst, a, b, n, stream_); break;
      case DType::b8: launch_op<Bool>(op_, dst, a, b, n, stream_); break;
      default: throw_invalid("unknown dtype");
    }
  }

  void finalize(void* buf, size_t n, int nranks) const override {
    if (op_ != Op::avg || !n) return;
    switch (dtype_) {
      case DType::f16: launch_divide<Half>(buf, n, nranks, stream_); break;
      case DType::bf16: launch_divide<BFloat16>(buf, n, nranks, stream_); break;
      case DType::f32: launch_divide<Plain<float>>(buf, n, nranks, stream_); break;
      case DType::f64: launch_divide<Plain<double>>(buf, n, nranks, stream_); break;
      default: break;  // avg on integers is rejected at construction
    }
  }

 private:
  DType dtype_;
  Op op_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<Reducer> make_cuda_reducer(DType dtype, Op op, cudaStream_t stream) {
  check_op(dtype, op);
  return std::make_unique<CudaReducer>(dtype, op, stream);
}

}  // namespace ringcomm
