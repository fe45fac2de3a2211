// The few NCCL entry points ringcomm uses, declared here and resolved from
// libnccl.so.2 at run time (dlopen on first use), so that building
// ringcomm._cuda needs nvcc only: no NCCL headers, no NCCL at link time. The
// library comes from the nvidia-nccl-cuXX wheel (ringcomm.cuda preloads it),
// $NCCL_HOME, or the system's loader path; without it, everything but NCCL
// (the kernels, the in-process GPU ring) still works and NCCL calls raise a
// TransportError saying how to install it.
//
// Types and values are NCCL's stable ABI (nccl.h since 2.x): an opaque
// communicator pointer, a 128-byte unique id, int-sized enums.
// tests/test_cuda_build.py compiles this header against the real nccl.h and
// checks every value, wherever that header is installed.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace ringcomm {

struct ncclComm;
typedef ncclComm* ncclComm_t;
struct ncclUniqueId {
  char internal[128];
};

enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

enum ncclDataType_t : int {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
};

enum ncclRedOp_t : int { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

// Whether libnccl.so.2 can be loaded; else false and why.
bool nccl_available(std::string* why = nullptr);

// The entry points (each loads the library first; a failure to load throws).
ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error);
const char* ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclAllReduce(const void* in, void* out, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclReduceScatter(const void* in, void* out, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclAllGather(const void* in, void* out, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t s);

// Ends an NCCL group on every path out of a scope (an exception between
// ncclGroupStart and ncclGroupEnd would otherwise leave this thread inside
// the group, and later NCCL calls would be silently deferred).
class NcclGroup {
 public:
  NcclGroup();   // ncclGroupStart (throws on failure)
  void end();    // ncclGroupEnd (throws on failure)
  ~NcclGroup();  // ncclGroupEnd if end() was not reached
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

 private:
  bool open_ = false;
};

}  // namespace ringcomm
