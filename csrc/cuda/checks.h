// One checking macro per API, as NCCL's checks.h: every CUDA and NCCL call
// goes through it, and a failure becomes a RingError naming the call and
// where it failed.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/vocabulary.h"
#include "cuda/nccl_api.h"

#define RC_CUDA(call)                                                                               \
  do {                                                                                              \
    cudaError_t rc_ = (call);                                                                       \
    if (rc_ != cudaSuccess)                                                                         \
      throw ::ringcomm::RingError(::ringcomm::ErrKind::transport, -1, -1, 0,                        \
                                  std::string(#call) + " failed: " + cudaGetErrorString(rc_) +      \
                                      " (" + __FILE__ + ":" + std::to_string(__LINE__) + ")");      \
  } while (0)

#define RC_NCCL(call)                                                                               \
  do {                                                                                              \
    ::ringcomm::ncclResult_t rc_ = (call);                                                          \
    if (rc_ != ::ringcomm::ncclSuccess)                                                             \
      throw ::ringcomm::RingError(::ringcomm::ErrKind::transport, -1, -1, 0,                        \
                                  std::string(#call) + " failed: " +                                \
                                      ::ringcomm::ncclGetErrorString(rc_) +                         \
                                      " (" + __FILE__ + ":" + std::to_string(__LINE__) + ")");      \
  } while (0)
