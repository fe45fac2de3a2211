#include "device_cuda.h"

#include <thread>

#include "checks.h"
#include "reducer_cuda.h"

namespace ringcomm {

DeviceGuard::DeviceGuard(int gpu) {
  RC_CUDA(cudaGetDevice(&prev_));
  if (prev_ == gpu) {
    prev_ = -1;  // nothing to restore
    return;
  }
  RC_CUDA(cudaSetDevice(gpu));
}

DeviceGuard::DeviceGuard(int gpu, std::nothrow_t) noexcept {
  if (cudaGetDevice(&prev_) != cudaSuccess || prev_ == gpu) {
    prev_ = -1;
    return;
  }
  cudaSetDevice(gpu);
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) cudaSetDevice(prev_);
}

namespace {

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int gpu) {
    DeviceGuard g(gpu);  // an event belongs to the device current at creation
    RC_CUDA(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
  }
  ~CudaEvent() override { cudaEventDestroy(ev_); }  // deferred by CUDA if still pending
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
  cudaEvent_t ev_ = nullptr;
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

EventPtr record_on(int gpu, cudaStream_t s) {
  DeviceGuard g(gpu);
  auto e = std::make_shared<CudaEvent>(gpu);
  RC_CUDA(cudaEventRecord(e->get(), s));
  return e;
}

}  // namespace

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
  cudaStreamDestroy(xfer_);
  cudaStreamDestroy(stream_);
}

void CudaDevice::copy(void* dst, const void* src, size_t bytes) {
  DeviceGuard g(gpu_);
  RC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

EventPtr CudaDevice::record() { return record_on(gpu_, stream_); }

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

EventPtr CudaDevice::transfer_record() { return record_on(gpu_, xfer_); }

std::unique_ptr<Reducer> CudaDevice::reducer(DType dtype, Op op) {
  return std::make_unique<CudaDeviceReducer>(gpu_, make_cuda_reducer(dtype, op, stream_));
}

// Plain cudaMalloc, not the stream-ordered allocator: a neighbour on another
// GPU copies out of this memory (the reduce-scatter accumulator), and peer
// access enabled with cudaDeviceEnablePeerAccess does not extend to memory
// pools. Growth is rare (the largest collective so far), and cudaFree waits
// for the device, so no queued work still uses the old block.
char* CudaDevice::scratch(int which, size_t bytes) {
  if (scratch_bytes_[which] < bytes) {
    DeviceGuard g(gpu_);
    if (scratch_[which]) RC_CUDA(cudaFree(scratch_[which]));
    scratch_[which] = nullptr;
    scratch_bytes_[which] = 0;
    void* p = nullptr;
    RC_CUDA(cudaMalloc(&p, bytes));
    scratch_[which] = static_cast<char*>(p);
    scratch_bytes_[which] = bytes;
  }
  return scratch_[which];
}

// These two run on the caller's thread: the legacy default stream (handle 0)
// is the current device's, so the rank's GPU must be current (and the
// caller's current device is restored afterwards).
EventPtr CudaDevice::record_external(uintptr_t stream) { return record_on(gpu_, external_stream(stream)); }

void CudaDevice::wait_external(uintptr_t stream, const EventPtr& e) {
  if (!e) return;
  DeviceGuard g(gpu_);
  RC_CUDA(cudaStreamWaitEvent(external_stream(stream), native(e), 0));
}

}  // namespace ringcomm
