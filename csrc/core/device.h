// Device: where one rank's data lives and in what order work on it happens.
//
// Host transports (MPI, in-process) have no Device: a collective runs on the
// calling thread and every step completes before the next one starts. A
// transport that moves device memory (in-process on GPUs, NCCL) hands the
// Link a Device: an in-order queue of work (a CUDA stream, or its CPU
// emulation in stream_emu.cpp), onto which the collective's copies and
// reductions are *enqueued* rather than executed. The algorithms are the same
// source either way: on a Device, "the receive is done" (Link::wait) means
// "the data is ordered before anything enqueued afterwards", and nothing in a
// collective blocks the host on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/vocabulary.h"
#include "core/reducer.h"

namespace ringcomm {

// A point in one of a Device's queues: complete once everything enqueued
// there before it has run.
class Event {
 public:
  virtual ~Event() = default;
  virtual bool query() = 0;  // complete now? (does not block)
  // Block the host until complete or `deadline`; false on timeout.
  virtual bool synchronize(Clock::time_point deadline) = 0;
};
using EventPtr = std::shared_ptr<Event>;

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  // Enqueue a copy of `bytes` bytes (any two buffers this device can reach).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // A point after everything enqueued so far.
  virtual EventPtr record() = 0;
  // Work enqueued after this call starts only once `e` is complete (e may
  // belong to another Device of the same kind).
  virtual void wait(const EventPtr& e) = 0;
  // The transfer queue: a second in-order queue of the same device, so that
  // the transfer of one segment runs while the main queue reduces the one
  // before (the ring's pipelining). Transports put incoming payload on it,
  // ordered with events both ways: after what must precede the write (the
  // sender's data, the receiver's last use of the buffer), and the main
  // queue waits for it before using the data.
  virtual void transfer_wait(const EventPtr& e) = 0;
  virtual void transfer_copy(void* dst, const void* src, size_t bytes) = 0;
  virtual EventPtr transfer_record() = 0;
  // Reductions enqueued on this device (the Reducer contract of reducer.h).
  virtual std::unique_ptr<Reducer> reducer(DType dtype, Op op) = 0;
  // Reusable device memory owned by this device (slot 0: receive slots,
  // 1: work buffer); valid until the next call with the same slot.
  virtual char* scratch(int which, size_t bytes) = 0;

  // The caller's side (CUDA: a cudaStream_t as an integer; 0 is the legacy
  // default stream). `record_external`: a point after the work the caller has
  // queued so far, which the collective then waits for. `wait_external`: make
  // the caller's later work wait for `e`.
  virtual EventPtr record_external(uintptr_t stream) = 0;
  virtual void wait_external(uintptr_t stream, const EventPtr& e) = 0;
  // A copy on the caller's side (point-to-point's staging, engine/p2p.h):
  // queued on the caller's `stream`, after the work queued there so far,
  // never on this device's own queues (so it waits for no collective).
  // Returns a point after it, or null when it has already happened.
  virtual EventPtr copy_external(uintptr_t stream, void* dst, const void* src, size_t bytes) = 0;
  // Host memory for that staging, of at least `bytes` (CUDA: pinned, so a
  // copy_external to or from it never blocks the host; see device_cuda.cpp).
  virtual std::shared_ptr<char> host_staging(size_t bytes) {
    return std::shared_ptr<char>(new char[bytes ? bytes : 1], std::default_delete<char[]>());
  }
};

}  // namespace ringcomm
