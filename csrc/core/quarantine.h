// Quarantine: requests that outlived their collective, and the memory they
// may still touch.
//
// After a failure (timeout, mismatch, abort, a transport error) a rank stops
// waiting, but some of its point-to-point requests cannot be withdrawn: MPI
// cannot cancel a send, and a receive that already matched a message still
// arriving completes on its own. Such a request keeps reading or writing its
// buffer until the peer acts, which may be much later (a straggler that
// arrives after the others gave up) or during MPI_Finalize. Freeing that
// memory would let a late message land in, or be sent from, memory that was
// given back: the crash this exists to prevent.
//
// So the request is moved here together with what keeps its memory alive:
// the transport (its communicator must not be freed under it), the engine's
// own buffers it points into, and a Hold that tells the Python layer the
// caller's arrays of that collective are still in use (Python then keeps
// them referenced; see ringcomm/comm.py). reap() tests each request and
// releases those that completed. What is still pending at exit is leaked on
// purpose: the process ends, the memory never goes back.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "core/transport.h"

namespace ringcomm {

// One failed collective's claim on its caller's arrays: how many of its
// quarantined requests may still use them.
struct Hold {
  std::atomic<int> pending{0};
};

class Quarantine {
 public:
  // The process's quarantine (never destroyed: entries may outlive everything).
  static Quarantine& instance();

  // Keep `r` (not done, not withdrawable) with `memory` (engine buffers it
  // may touch) and `hold` (null when it cannot touch caller memory) until
  // `t` says it is done.
  void add(std::shared_ptr<Transport> t, RequestPtr r, std::shared_ptr<void> memory, std::shared_ptr<Hold> hold);
  // Test every entry once; release those that completed. Returns how many remain.
  size_t reap();
  // reap() until nothing remains or `seconds` have passed. Returns how many remain.
  size_t drain(double seconds);
  size_t size();
  // Requests ever quarantined / released (for tests and diagnostics).
  uint64_t total_added();

 private:
  struct Entry {
    std::shared_ptr<Transport> transport;
    RequestPtr request;
    std::shared_ptr<void> memory;
    std::shared_ptr<Hold> hold;
  };
  std::mutex m_;
  std::vector<Entry> entries_;
  std::atomic<size_t> size_{0};
  uint64_t added_ = 0;
};

}  // namespace ringcomm
