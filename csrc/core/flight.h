// Flight recorder: each communicator's last K collectives and, for the one
// running, where it is (phase, step, segment, the peer it waits on, bytes
// moved so far). Read at any time from any thread (Communicator.flight_record
// in Python); dumped on errors and read by `ringcomm analyze` to say which
// rank is behind and what everyone else waits for (the role of PyTorch's
// NCCL flight recorder).
//
// Cost: three short critical sections per collective (issued, started,
// ended); progress inside a collective is a few relaxed atomic stores
// (Progress), read only when someone asks.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "core/vocabulary.h"

namespace ringcomm {

enum class FlightState : int32_t { queued = 0, running, done, failed };

// What the running collective is doing now. Written by the thread running
// it (Link), read by anyone.
struct Progress {
  std::atomic<int32_t> phase{-1}, step{-1}, segment{-1}, peer{-1};
  std::atomic<int32_t> waiting{0};  // 0: not waiting; 1: for a message from `peer`; 2: for `peer` to take ours
  std::atomic<const char*> what{nullptr};  // static text: what is awaited
  std::atomic<Clock::rep> wait_since{0};  // steady clock (cheap; converted to wall time when read)
  std::atomic<uint64_t> bytes_sent{0}, bytes_received{0};  // payload of completed requests
  void reset() {
    phase.store(-1, std::memory_order_relaxed);
    step.store(-1, std::memory_order_relaxed);
    segment.store(-1, std::memory_order_relaxed);
    peer.store(-1, std::memory_order_relaxed);
    waiting.store(0, std::memory_order_relaxed);
    what.store(nullptr, std::memory_order_relaxed);
    bytes_sent.store(0, std::memory_order_relaxed);
    bytes_received.store(0, std::memory_order_relaxed);
  }
};

struct FlightRecord {
  uint64_t seq = 0;
  int32_t coll = 0, dtype = 0, op = 0, root = 0, algo = 0;
  int64_t count = 0;
  FlightState state = FlightState::queued;
  int64_t t_issue_ns = 0, t_start_ns = 0, t_end_ns = 0;  // wall clock (comparable across a node's ranks)
  // Running: filled from Progress when the record is read. Ended: the last
  // position (where a failed one stopped).
  int32_t phase = -1, step = -1, segment = -1, peer = -1, waiting = 0;
  std::string what;
  int64_t wait_since_ns = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  std::string error;
};

inline int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class FlightRecorder {
 public:
  // The slots are reserved up front: a collective never grows the vector
  // (tests/test_mpi.py counts the mallocs of a call).
  explicit FlightRecorder(size_t capacity) : capacity_(capacity) { records_.reserve(capacity); }
  size_t capacity() const { return capacity_.load(std::memory_order_relaxed); }
  void set_capacity(size_t k);
  void issued(const FlightRecord& r);  // state queued, t_issue set by the caller
  void started(uint64_t seq);
  void ended(uint64_t seq, const Progress& p, const std::string* error);
  // Oldest first; the running one carries `p`'s live position.
  std::vector<FlightRecord> snapshot(const Progress& p);
  // One line about the latest collective (for a peer's timeout message).
  std::string summary(const Progress& p);

 private:
  FlightRecord* find(uint64_t seq);  // with m_ held
  static void fill(FlightRecord& r, const Progress& p);
  std::atomic<size_t> capacity_;  // read without the lock on the fast path (0: off)
  std::mutex m_;
  // A ring of `capacity_` slots reused in place (no allocation per call once
  // warm): records_[(first_ + i) % size] is the i-th oldest of `used_`.
  std::vector<FlightRecord> records_;
  size_t first_ = 0, used_ = 0;
};

}  // namespace ringcomm
