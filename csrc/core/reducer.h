// Reducer: the only arithmetic the ring algorithms need, for one (dtype, op).
// Host reducers live in reducer_cpu.cpp; a device reducer would launch kernels
// with the same contract.
#pragma once

#include <cstddef>
#include <memory>

#include "core/vocabulary.h"

namespace ringcomm {

class Reducer {
 public:
  virtual ~Reducer() = default;
  // dst[i] = a[i] (op) b[i] for i < count. dst may be exactly a or exactly b
  // (never a partial overlap): the ring reduces in place into its accumulator.
  virtual void reduce(void* dst, const void* a, const void* b, size_t count) const = 0;
  // Applied once to each fully reduced element: for avg, divide by nranks
  // (sum first, then divide); a no-op for the other ops.
  virtual void finalize(void* buf, size_t count, int nranks) const = 0;
};

// Throws RingError(invalid) for avg on an integer dtype.
std::unique_ptr<Reducer> make_cpu_reducer(DType dtype, Op op);
// Throws RingError(invalid) unless (dtype, op) is supported (no allocation).
void check_reducer(DType dtype, Op op);

}  // namespace ringcomm
