// The CUDA Device (device.h): two non-blocking streams per rank on one GPU
// (main: reductions and the collective's program order; transfer: incoming
// payload, so that it overlaps the reductions).
// Copies are cudaMemcpyAsync (any two device buffers: unified addressing), the
// reductions are the kernels of reducer_cuda.cu on that stream, events are
// cudaEvents, scratch is plain device memory that only grows. Every call
// first makes the rank's GPU current, since a rank's engine thread may be
// shared with other GPUs' ranks (in-process ranks on several GPUs).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "core/device.h"

namespace ringcomm {

// cudaEvents handed back by the events this device records, reused: shared
// with the events, so it outlives the device while one is held (see
// CudaDevice::record_on for why they are pooled).
class EventPool {
 public:
  explicit EventPool(int gpu) : gpu_(gpu) {}
  ~EventPool();
  cudaEvent_t take();
  void give(cudaEvent_t e);

 private:
  int gpu_;
  std::mutex m_;
  std::vector<cudaEvent_t> free_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int gpu);
  ~CudaDevice() override;
  std::string name() const override { return "cuda:" + std::to_string(gpu_); }
  int gpu() const { return gpu_; }
  cudaStream_t stream() const { return stream_; }

  void copy(void* dst, const void* src, size_t bytes) override;
  EventPtr record() override;
  void wait(const EventPtr& e) override;
  void transfer_wait(const EventPtr& e) override;
  void transfer_copy(void* dst, const void* src, size_t bytes) override;
  EventPtr transfer_record() override;
  cudaStream_t transfer_stream() const { return xfer_; }
  std::unique_ptr<Reducer> reducer(DType dtype, Op op) override;
  char* scratch(int which, size_t bytes) override;
  EventPtr record_external(uintptr_t stream) override;
  void wait_external(uintptr_t stream, const EventPtr& e) override;
  EventPtr copy_external(uintptr_t stream, void* dst, const void* src, size_t bytes) override;
  std::shared_ptr<char> host_staging(size_t bytes) override;

 private:
  // Pinned blocks handed back by point-to-point staging, reused by size;
  // shared with the blocks' deleters, so it outlives the device while a
  // block is out.
  struct PinnedPool {
    explicit PinnedPool(int g) : gpu(g) {}
    int gpu;
    std::mutex m;
    std::vector<std::pair<char*, size_t>> free;
    ~PinnedPool();
  };
  int gpu_;
  std::shared_ptr<PinnedPool> pinned_ = std::make_shared<PinnedPool>(gpu_);
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>(gpu_);
  EventPtr record_on(cudaStream_t s);
  cudaStream_t stream_ = nullptr, xfer_ = nullptr;
  char* scratch_[2] = {nullptr, nullptr};
  size_t scratch_bytes_[2] = {0, 0};
  std::vector<char*> retired_;  // outgrown scratch blocks, freed with the device (scratch())
  size_t retired_bytes_ = 0;
};

// Makes `gpu` current for the duration of a scope and restores the thread's
// previous device afterwards: ringcomm's calls never change which GPU the
// caller's thread (or its engine thread) is on, and a thread that had no
// CUDA context gets none (device_cuda.cpp). Never throws on restore.
class DeviceGuard {
 public:
  explicit DeviceGuard(int gpu);
  // For destructors: never throws (a failing runtime at exit is ignored).
  DeviceGuard(int gpu, std::nothrow_t) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
  bool no_context_ = false;  // the thread had no current context: drop it again
};

// A stream handle as Python passes it (__cuda_array_interface__ convention:
// 0 or 1 = the legacy default stream, 2 = the per-thread default stream).
cudaStream_t external_stream(uintptr_t handle);

}  // namespace ringcomm
