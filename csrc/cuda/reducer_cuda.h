// Device reducers: the Reducer contract of reducer.h, executed as kernels
// enqueued on a CUDA stream (the call returns once the kernel is queued).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "core/reducer.h"

namespace ringcomm {

std::unique_ptr<Reducer> make_cuda_reducer(DType dtype, Op op, cudaStream_t stream);

}  // namespace ringcomm
