#include "cuda/device_cuda.h"

#include <algorithm>
#include <thread>

#include "cuda/checks.h"
#include "cuda/reducer_cuda.h"

namespace ringcomm {

namespace {

// Two driver calls, reached through the runtime (no libcuda at link time):
// whether the thread has a current context, and dropping it again.
struct CtxApi {
  int (*get)(void**) = nullptr;  // cuCtxGetCurrent
  int (*set)(void*) = nullptr;   // cuCtxSetCurrent
};

const CtxApi& ctx_api() {
  static const CtxApi api = [] {
    CtxApi a;
    void* p = nullptr;
    cudaDriverEntryPointQueryResult st;
#if CUDART_VERSION >= 12050
    auto entry = [&](const char* name) {
      return cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &st);
    };
#else
    auto entry = [&](const char* name) { return cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &st); };
#endif
    if (entry("cuCtxGetCurrent") == cudaSuccess && st == cudaDriverEntryPointSuccess)
      a.get = reinterpret_cast<int (*)(void**)>(p);
    if (entry("cuCtxSetCurrent") == cudaSuccess && st == cudaDriverEntryPointSuccess)
      a.set = reinterpret_cast<int (*)(void*)>(p);
    cudaGetLastError();
    return a;
  }();
  return api;
}

// A thread that has never used CUDA has no current context, yet
// cudaGetDevice says 0 there: restoring "device 0" would create a context on
// GPU 0 (hundreds of MiB) for a rank that lives on another GPU. Such a
// thread is given back no context at all.
bool thread_has_context() {
  const CtxApi& a = ctx_api();
  if (!a.get || !a.set) return true;  // cannot tell: restore the device as before
  void* ctx = nullptr;
  return a.get(&ctx) == 0 && ctx != nullptr;
}

}  // namespace

DeviceGuard::DeviceGuard(int gpu) {
  if (!thread_has_context()) {
    no_context_ = true;
    RC_CUDA(cudaSetDevice(gpu));
    return;
  }
  RC_CUDA(cudaGetDevice(&prev_));
  if (prev_ == gpu) {
    prev_ = -1;  // nothing to restore
    return;
  }
  RC_CUDA(cudaSetDevice(gpu));
}

DeviceGuard::DeviceGuard(int gpu, std::nothrow_t) noexcept {
  if (!thread_has_context()) {
    no_context_ = true;
    cudaSetDevice(gpu);
    return;
  }
  if (cudaGetDevice(&prev_) != cudaSuccess || prev_ == gpu) {
    prev_ = -1;
    return;
  }
  cudaSetDevice(gpu);
}

DeviceGuard::~DeviceGuard() {
  if (no_context_)
    ctx_api().set(nullptr);
  else if (prev_ >= 0)
    cudaSetDevice(prev_);
}

namespace {

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(std::shared_ptr<EventPool> pool) : pool_(std::move(pool)), ev_(pool_->take()) {}
  ~CudaEvent() override { pool_->give(ev_); }
  cudaEvent_t get() const { return ev_; }

  bool query() override {
    cudaError_t rc = cudaEventQuery(ev_);
    if (rc == cudaErrorNotReady) return false;
    RC_CUDA(rc);
    return true;
  }
  // Polls rather than cudaEventSynchronize, so a device that never gets there
  // (a peer that never sent) ends in a timeout, not a hang.
  bool synchronize(Clock::time_point deadline) override {
    if (deadline == Clock::time_point::max()) {
      RC_CUDA(cudaEventSynchronize(ev_));
      return true;
    }
    auto pause = std::chrono::microseconds(2);
    while (!query()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      if (pause < std::chrono::microseconds(500)) pause *= 2;
    }
    return true;
  }

 private:
  std::shared_ptr<EventPool> pool_;
  cudaEvent_t ev_;
};

cudaEvent_t native(const EventPtr& e) {
  auto* c = dynamic_cast<CudaEvent*>(e.get());
  if (!c) throw_invalid("a CUDA device can only wait for CUDA events");
  return c->get();
}

// The kernels, launched with the rank's GPU current.
class CudaDeviceReducer final : public Reducer {
 public:
  CudaDeviceReducer(int gpu, std::unique_ptr<Reducer> r) : gpu_(gpu), r_(std::move(r)) {}
  void reduce(void* dst, const void* a, const void* b, size_t count) const override {
    DeviceGuard g(gpu_);
    r_->reduce(dst, a, b, count);
  }
  void finalize(void* buf, size_t count, int nranks) const override {
    DeviceGuard g(gpu_);
    r_->finalize(buf, count, nranks);
  }

 private:
  int gpu_;
  std::unique_ptr<Reducer> r_;
};

}  // namespace

// Events come from the device's pool, not from cudaEventCreate each time: a
// ring unit records three events per rank, and in-process ranks share one
// context, so every CUDA call of every rank's thread contends for it. Pooling
// cut the host's time to enqueue a 256 MiB all_reduce of 4 ranks on one H200
// from 3.28 to 1.64 ms with 16 MiB segments, 1.61 to 1.22 ms with 64 MiB
// (bench/README.md, GPU). An event goes back to the pool when its last holder
// drops it, maybe still pending: recording it again is safe, since waits
// already enqueued on it keep the record they saw, and nobody is left to
// query the old one.
EventPtr CudaDevice::record_on(cudaStream_t s) {
  DeviceGuard g(gpu_);
  auto e = std::make_shared<CudaEvent>(events_);
  RC_CUDA(cudaEventRecord(e->get(), s));
  return e;
}

cudaEvent_t EventPool::take() {
  {
    std::lock_guard<std::mutex> g(m_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  DeviceGuard g(gpu_);  // an event belongs to the device current at creation
  cudaEvent_t e = nullptr;
  RC_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void EventPool::give(cudaEvent_t e) {
  std::lock_guard<std::mutex> g(m_);
  free_.push_back(e);  // as many as were ever held at once: a few per unit in flight
}

EventPool::~EventPool() {
  DeviceGuard g(gpu_, std::nothrow);  // (may run on any thread: the last event's holder)
  for (cudaEvent_t e : free_) cudaEventDestroy(e);  // deferred by CUDA if still pending
}

cudaStream_t external_stream(uintptr_t handle) {
  if (handle == 0 || handle == 1) return cudaStreamLegacy;
  if (handle == 2) return cudaStreamPerThread;
  return reinterpret_cast<cudaStream_t>(handle);
}

CudaDevice::CudaDevice(int gpu) : gpu_(gpu) {
  DeviceGuard g(gpu);
  RC_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  RC_CUDA(cudaStreamCreateWithFlags(&xfer_, cudaStreamNonBlocking));
}

CudaDevice::~CudaDevice() {
  DeviceGuard g(gpu_, std::nothrow);
  cudaStreamSynchronize(xfer_);  // queued work may use the scratch memory
  cudaStreamSynchronize(stream_);
  for (char* p : scratch_)
    if (p) cudaFree(p);
  for (char* p : retired_) cudaFree(p);
  cudaStreamDestroy(xfer_);
  cudaStreamDestroy(stream_);
}

void CudaDevice::copy(void* dst, const void* src, size_t bytes) {
  DeviceGuard g(gpu_);
  RC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

EventPtr CudaDevice::record() { return record_on(stream_); }

void CudaDevice::wait(const EventPtr& e) {
  if (!e) return;
  DeviceGuard g(gpu_);
  RC_CUDA(cudaStreamWaitEvent(stream_, native(e), 0));
}

void CudaDevice::transfer_wait(const EventPtr& e) {
  if (!e) return;
  DeviceGuard g(gpu_);
  RC_CUDA(cudaStreamWaitEvent(xfer_, native(e), 0));
}

void CudaDevice::transfer_copy(void* dst, const void* src, size_t bytes) {
  DeviceGuard g(gpu_);
  RC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, xfer_));
}

EventPtr CudaDevice::transfer_record() { return record_on(xfer_); }

std::unique_ptr<Reducer> CudaDevice::reducer(DType dtype, Op op) {
  return std::make_unique<CudaDeviceReducer>(gpu_, make_cuda_reducer(dtype, op, stream_));
}

// Plain cudaMalloc, not the stream-ordered allocator: a neighbour on another
// GPU copies out of this memory (the reduce-scatter accumulator), and peer
// access enabled with cudaDeviceEnablePeerAccess does not extend to memory
// pools. A block that is outgrown is retired, not freed: cudaFree waits for
// the whole device (other ranks' streams, the caller's producer kernels), and
// queued work of earlier collectives may still use the old block. Retired
// blocks are freed with the device, or (rarely: sizes that keep growing)
// once they add up to more than the live block, accepting that one wait, so
// scratch never holds more than twice what the largest collective needs.
char* CudaDevice::scratch(int which, size_t bytes) {
  if (scratch_bytes_[which] < bytes) {
    DeviceGuard g(gpu_);
    const size_t want = round_up(bytes, size_t(1) << 20);
    void* p = nullptr;
    RC_CUDA(cudaMalloc(&p, want));  // before retiring the old block: on failure nothing changes
    if (scratch_[which]) {
      retired_.push_back(scratch_[which]);
      retired_bytes_ += scratch_bytes_[which];
    }
    scratch_[which] = static_cast<char*>(p);
    scratch_bytes_[which] = want;
    if (retired_bytes_ > want) {
      RC_CUDA(cudaStreamSynchronize(xfer_));  // our queued work may still use them
      RC_CUDA(cudaStreamSynchronize(stream_));
      for (char* r : retired_) RC_CUDA(cudaFree(r));
      retired_.clear();
      retired_bytes_ = 0;
    }
  }
  return scratch_[which];
}

// These two run on the caller's thread: the legacy default stream (handle 0)
// is the current device's, so the rank's GPU must be current (and the
// caller's current device is restored afterwards).
EventPtr CudaDevice::record_external(uintptr_t stream) { return record_on(external_stream(stream)); }

void CudaDevice::wait_external(uintptr_t stream, const EventPtr& e) {
  if (!e) return;
  DeviceGuard g(gpu_);
  RC_CUDA(cudaStreamWaitEvent(external_stream(stream), native(e), 0));
}

// Pinned, because cudaMemcpyAsync to or from pageable memory returns only
// when the caller's stream has reached and done the copy, past any deadline.
// Pooled, because cudaFreeHost may synchronize the device, which would wait
// for queued collectives that wait for peers (maybe for this very message).
// A block is reused for requests of at least half its size; nothing is
// freed before the device goes (a job staging ever larger messages keeps
// every size it used).
std::shared_ptr<char> CudaDevice::host_staging(size_t bytes) {
  const size_t want = round_up(bytes ? bytes : 1, 4096);
  std::pair<char*, size_t> block{nullptr, 0};
  {
    std::lock_guard<std::mutex> g(pinned_->m);
    auto& free = pinned_->free;
    size_t best = free.size();
    for (size_t i = 0; i < free.size(); ++i)
      if (free[i].second >= want && free[i].second <= 2 * want &&  // (no small op holds a large block)
          (best == free.size() || free[i].second < free[best].second))
        best = i;
    if (best < free.size()) {
      block = free[best];
      free.erase(free.begin() + long(best));
    }
  }
  if (!block.first) {
    DeviceGuard g(gpu_);
    void* p = nullptr;
    RC_CUDA(cudaHostAlloc(&p, want, cudaHostAllocPortable));
    block = {static_cast<char*>(p), want};
  }
  return std::shared_ptr<char>(block.first, [pool = pinned_, block](char*) {
    std::lock_guard<std::mutex> g(pool->m);
    pool->free.push_back(block);
  });
}

CudaDevice::PinnedPool::~PinnedPool() {
  DeviceGuard g(gpu, std::nothrow);  // (may run on any thread: the last block's deleter)
  for (auto& b : free) cudaFreeHost(b.first);
}

EventPtr CudaDevice::copy_external(uintptr_t stream, void* dst, const void* src, size_t bytes) {
  DeviceGuard g(gpu_);
  const cudaStream_t s = external_stream(stream);
  RC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  return record_on(s);
}

}  // namespace ringcomm
