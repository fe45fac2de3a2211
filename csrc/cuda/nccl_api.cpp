#include "cuda/nccl_api.h"

#include <dlfcn.h>

#include <mutex>

#include "cuda/checks.h"

namespace ringcomm {

namespace {

struct Api {
  bool ok = false;
  std::string why;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommFinalize)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
};

template <class F>
bool bind(void* lib, const char* name, F& fn, std::string& why) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && why.empty()) why = std::string("libnccl.so.2 has no ") + name + " (NCCL too old?)";
  return fn != nullptr;
}

const Api& api_state() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    // ringcomm.cuda has usually preloaded the wheel's copy (RTLD_GLOBAL):
    // then this finds it by its soname.
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      const char* e = dlerror();
      a.why = std::string("libnccl.so.2 could not be loaded (") + (e ? e : "unknown error") +
              "); install it with `pip install nvidia-nccl-cu13` (or -cu12), or set NCCL_HOME";
      return;
    }
    bool ok = bind(lib, "ncclGetVersion", a.GetVersion, a.why) & bind(lib, "ncclGetUniqueId", a.GetUniqueId, a.why) &
              bind(lib, "ncclCommInitRank", a.CommInitRank, a.why) &
              bind(lib, "ncclCommFinalize", a.CommFinalize, a.why) &
              bind(lib, "ncclCommDestroy", a.CommDestroy, a.why) & bind(lib, "ncclCommAbort", a.CommAbort, a.why) &
              bind(lib, "ncclCommGetAsyncError", a.CommGetAsyncError, a.why) &
              bind(lib, "ncclGetErrorString", a.GetErrorString, a.why) &
              bind(lib, "ncclGroupStart", a.GroupStart, a.why) & bind(lib, "ncclGroupEnd", a.GroupEnd, a.why) &
              bind(lib, "ncclSend", a.Send, a.why) & bind(lib, "ncclRecv", a.Recv, a.why) &
              bind(lib, "ncclAllReduce", a.AllReduce, a.why) &
              bind(lib, "ncclReduceScatter", a.ReduceScatter, a.why) &
              bind(lib, "ncclAllGather", a.AllGather, a.why);
    a.ok = ok;
  });
  return a;
}

const Api& api() {
  const Api& a = api_state();
  if (!a.ok) throw RingError(ErrKind::transport, -1, -1, 0, "NCCL is not available: " + a.why);
  return a;
}

}  // namespace

bool nccl_available(std::string* why) {
  const Api& a = api_state();
  if (!a.ok && why) *why = a.why;
  return a.ok;
}

ncclResult_t ncclGetVersion(int* v) { return api().GetVersion(v); }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { return api().GetUniqueId(id); }
ncclResult_t ncclCommInitRank(ncclComm_t* c, int n, ncclUniqueId id, int r) { return api().CommInitRank(c, n, id, r); }
ncclResult_t ncclCommFinalize(ncclComm_t c) { return api().CommFinalize(c); }
ncclResult_t ncclCommDestroy(ncclComm_t c) { return api().CommDestroy(c); }
ncclResult_t ncclCommAbort(ncclComm_t c) { return api().CommAbort(c); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) { return api().CommGetAsyncError(c, e); }
const char* ncclGetErrorString(ncclResult_t r) {
  const Api& a = api_state();
  return a.ok ? a.GetErrorString(r) : "NCCL not loaded";
}
ncclResult_t ncclGroupStart() { return api().GroupStart(); }
ncclResult_t ncclGroupEnd() { return api().GroupEnd(); }
ncclResult_t ncclSend(const void* b, size_t n, ncclDataType_t t, int p, ncclComm_t c, cudaStream_t s) {
  return api().Send(b, n, t, p, c, s);
}
ncclResult_t ncclRecv(void* b, size_t n, ncclDataType_t t, int p, ncclComm_t c, cudaStream_t s) {
  return api().Recv(b, n, t, p, c, s);
}
ncclResult_t ncclAllReduce(const void* i, void* o, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
  return api().AllReduce(i, o, n, t, op, c, s);
}
ncclResult_t ncclReduceScatter(const void* i, void* o, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t s) {
  return api().ReduceScatter(i, o, n, t, op, c, s);
}
ncclResult_t ncclAllGather(const void* i, void* o, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
  return api().AllGather(i, o, n, t, c, s);
}

NcclGroup::NcclGroup() {
  RC_NCCL(ncclGroupStart());
  open_ = true;
}

void NcclGroup::end() {
  open_ = false;
  RC_NCCL(ncclGroupEnd());
}

NcclGroup::~NcclGroup() {
  if (open_) ncclGroupEnd();  // on an exception: leave the group; its error is not the one to report
}

}  // namespace ringcomm
