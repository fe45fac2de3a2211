#include "device_cuda.h"

#include <thread>

#include "checks.h"
#include "reducer_cuda.h"

namespace ringcomm {

namespace {

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int gpu) : gpu_(gpu) {
    RC_CUDA(cudaSetDevice(gpu));  // callers on the caller's thread hold a DeviceGuard
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
  int gpu_;
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
  CudaDeviceReducer(const CudaDevice& d, std::unique_ptr<Reducer> r) : d_(d), r_(std::move(r)) {}
  void reduce(void* dst, const void* a, const void* b, size_t count) const override {
    d_.make_current();
    r_->reduce(dst, a, b, count);
  }
  void finalize(void* buf, size_t count, int nranks) const override {
    d_.make_current();
    r_->finalize(buf, count, nranks);
  }

 private:
  const CudaDevice& d_;
  std::unique_ptr<Reducer> r_;
};

// Makes `gpu` current for a call made on the caller's thread, and restores
// the caller's own current device afterwards (no side effect on user code).
class DeviceGuard {
 public:
  explicit DeviceGuard(int gpu) {
    RC_CUDA(cudaGetDevice(&prev_));
    if (prev_ != gpu) RC_CUDA(cudaSetDevice(gpu));
    changed_ = prev_ != gpu;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool changed_ = false;
};

}  // namespace

cudaStream_t external_stream(uintptr_t handle) {
  if (handle == 0 || handle == 1) return cudaStreamLegacy;
  if (handle == 2) return cudaStreamPerThread;
  return reinterpret_cast<cudaStream_t>(handle);
}

CudaDevice::CudaDevice(int gpu) : gpu_(gpu) {
  RC_CUDA(cudaSetDevice(gpu));
  RC_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  RC_CUDA(cudaStreamCreateWithFlags(&xfer_, cudaStreamNonBlocking));
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(gpu_);
  cudaStreamSynchronize(xfer_);  // queued work may use the scratch memory
  cudaStreamSynchronize(stream_);
  for (char* p : scratch_)
    if (p) cudaFree(p);
  cudaStreamDestroy(xfer_);
  cudaStreamDestroy(stream_);
}

void CudaDevice::make_current() const { RC_CUDA(cudaSetDevice(gpu_)); }

void CudaDevice::copy(void* dst, const void* src, size_t bytes) {
  make_current();
  RC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

EventPtr CudaDevice::record() {
  auto e = std::make_shared<CudaEvent>(gpu_);
  RC_CUDA(cudaEventRecord(e->get(), stream_));
  return e;
}

void CudaDevice::wait(const EventPtr& e) {
  if (!e) return;
  make_current();
  RC_CUDA(cudaStreamWaitEvent(stream_, native(e), 0));
}

void CudaDevice::transfer_wait(const EventPtr& e) {
  if (!e) return;
  make_current();
  RC_CUDA(cudaStreamWaitEvent(xfer_, native(e), 0));
}

void CudaDevice::transfer_copy(void* dst, const void* src, size_t bytes) {
  make_current();
  RC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, xfer_));
}

EventPtr CudaDevice::transfer_record() {
  auto e = std::make_shared<CudaEvent>(gpu_);
  RC_CUDA(cudaEventRecord(e->get(), xfer_));
  return e;
}

std::unique_ptr<Reducer> CudaDevice::reducer(DType dtype, Op op) {
  return std::make_unique<CudaDeviceReducer>(*this, make_cuda_reducer(dtype, op, stream_));
}

char* CudaDevice::scratch(int which, size_t bytes) {
  if (scratch_bytes_[which] < bytes) {
    make_current();
    // Stream-ordered: the old block is freed after the work queued so far.
    if (scratch_[which]) RC_CUDA(cudaFreeAsync(scratch_[which], stream_));
    scratch_[which] = nullptr;
    scratch_bytes_[which] = 0;
    void* p = nullptr;
    RC_CUDA(cudaMallocAsync(&p, bytes, stream_));
    scratch_[which] = static_cast<char*>(p);
    scratch_bytes_[which] = bytes;
  }
  return scratch_[which];
}

// These two run on the caller's thread: the legacy default stream (handle 0)
// is the current device's, so the rank's GPU must be current, and the
// caller's current device is restored afterwards.
EventPtr CudaDevice::record_external(uintptr_t stream) {
  DeviceGuard g(gpu_);
  auto e = std::make_shared<CudaEvent>(gpu_);
  RC_CUDA(cudaEventRecord(e->get(), external_stream(stream)));
  return e;
}

void CudaDevice::wait_external(uintptr_t stream, const EventPtr& e) {
  if (!e) return;
  DeviceGuard g(gpu_);
  RC_CUDA(cudaStreamWaitEvent(external_stream(stream), native(e), 0));
}

}  // namespace ringcomm
