// Traffic ledger: exact bytes and messages this rank sent to and received
// from each peer, per collective kind, with the user's data (payload) kept
// apart from ringcomm's own control bytes (headers, abort notices).
#pragma once

#include <cstdint>
#include <atomic>
#include <vector>

#include "core/vocabulary.h"

namespace ringcomm {

struct Counters {
  uint64_t bytes_sent = 0, msgs_sent = 0, bytes_recv = 0, msgs_recv = 0;
};

// Written only by the thread running the communicator's collective (one at
// a time: the worker or an inline caller, handed over under the Engine's
// lock), read by anyone: relaxed atomics, no lock (a lock per message was a
// tenth of a small all_reduce). A snapshot taken while a collective runs may
// see part of it; reset() while one runs may keep part of its counts.
class Ledger {
 public:
  explicit Ledger(int nranks) : n_(nranks), cells_(size_t(Coll::kCount) * nranks * 2 * 4) {}

  // One message of `bytes`.
  void sent(Coll c, int peer, bool control, uint64_t bytes) {
    add(at(c, peer, control) + 0, bytes);
    add(at(c, peer, control) + 1, 1);
  }
  void received(Coll c, int peer, bool control, uint64_t bytes) {
    add(at(c, peer, control) + 2, bytes);
    add(at(c, peer, control) + 3, 1);
  }
  // The same from any thread (point-to-point ops complete on their callers'
  // threads, several at once): a locked add, in cells no collective writes.
  void sent_shared(Coll c, int peer, uint64_t bytes) {
    cells_[at(c, peer, false) + 0].fetch_add(bytes, std::memory_order_relaxed);
    cells_[at(c, peer, false) + 1].fetch_add(1, std::memory_order_relaxed);
  }
  void received_shared(Coll c, int peer, uint64_t bytes) {
    cells_[at(c, peer, false) + 2].fetch_add(bytes, std::memory_order_relaxed);
    cells_[at(c, peer, false) + 3].fetch_add(1, std::memory_order_relaxed);
  }
  // Flat copy indexed [(coll * nranks + peer) * 2 + control].
  std::vector<Counters> snapshot() const {
    std::vector<Counters> out(cells_.size() / 4);
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].bytes_sent = cells_[4 * i + 0].load(std::memory_order_relaxed);
      out[i].msgs_sent = cells_[4 * i + 1].load(std::memory_order_relaxed);
      out[i].bytes_recv = cells_[4 * i + 2].load(std::memory_order_relaxed);
      out[i].msgs_recv = cells_[4 * i + 3].load(std::memory_order_relaxed);
    }
    return out;
  }
  void reset() {
    for (auto& x : cells_) x.store(0, std::memory_order_relaxed);
  }
  int nranks() const { return n_; }

 private:
  size_t at(Coll c, int peer, bool control) const {
    return ((size_t(c) * n_ + size_t(peer)) * 2 + (control ? 1 : 0)) * 4;
  }
  void add(size_t i, uint64_t v) {  // one writer: a plain read-modify-write, no locked instruction
    cells_[i].store(cells_[i].load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
  int n_;
  std::vector<std::atomic<uint64_t>> cells_;
};

}  // namespace ringcomm
