// The reduction ops, written once for the host reducer (reducer_cpu.cpp) and
// the device kernels (cuda/reducer_cuda.cu), so both define sum, prod, min
// and max the same way: integers wrap modulo 2^bits (computed in the unsigned
// type of the same width; signed overflow is undefined in C++), min/max
// compare with <, in the compute type (float for half types).
#pragma once

#include <type_traits>

#if defined(__CUDACC__)
#define RC_HD __host__ __device__ __forceinline__
#else
#define RC_HD inline __attribute__((always_inline))  // must inline into the vectorized loops
#endif

namespace ringcomm {
namespace ops {

template <class C, bool = std::is_integral<C>::value>
struct WideOf { using type = C; };
template <class C>
struct WideOf<C, true> { using type = typename std::make_unsigned<C>::type; };
template <class C>
using Wide = typename WideOf<C>::type;

struct Sum {
  template <class C>
  static RC_HD C apply(C a, C b) { return C(Wide<C>(a) + Wide<C>(b)); }
};
struct Prod {
  template <class C>
  static RC_HD C apply(C a, C b) { return C(Wide<C>(a) * Wide<C>(b)); }
};
struct Min {
  template <class C>
  static RC_HD C apply(C a, C b) { return b < a ? b : a; }
};
struct Max {
  template <class C>
  static RC_HD C apply(C a, C b) { return a < b ? b : a; }
};

}  // namespace ops
}  // namespace ringcomm
