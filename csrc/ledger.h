// Traffic ledger: exact bytes and messages this rank sent to and received
// from each peer, per collective kind, with the user's data (payload) kept
// apart from ringcomm's own control bytes (headers, abort notices).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "common.h"

namespace ringcomm {

struct Counters {
  uint64_t bytes_sent = 0, msgs_sent = 0, bytes_recv = 0, msgs_recv = 0;
};

class Ledger {
 public:
  explicit Ledger(int nranks) : n_(nranks), cells_(size_t(Coll::kCount) * nranks * 2) {}

  // msgs = 0: bytes that travel inside a message counted elsewhere (a
  // fingerprint riding in a payload message).
  void sent(Coll c, int peer, bool control, uint64_t bytes, uint64_t msgs = 1) {
    std::lock_guard<std::mutex> g(m_);
    Counters& x = at(c, peer, control);
    x.bytes_sent += bytes;
    x.msgs_sent += msgs;
  }
  void received(Coll c, int peer, bool control, uint64_t bytes, uint64_t msgs = 1) {
    std::lock_guard<std::mutex> g(m_);
    Counters& x = at(c, peer, control);
    x.bytes_recv += bytes;
    x.msgs_recv += msgs;
  }
  // Flat copy indexed [(coll * nranks + peer) * 2 + control].
  std::vector<Counters> snapshot() const {
    std::lock_guard<std::mutex> g(m_);
    return cells_;
  }
  void reset() {
    std::lock_guard<std::mutex> g(m_);
    for (auto& x : cells_) x = Counters{};
  }
  int nranks() const { return n_; }

 private:
  Counters& at(Coll c, int peer, bool control) {
    return cells_[(size_t(c) * n_ + size_t(peer)) * 2 + (control ? 1 : 0)];
  }
  int n_;
  mutable std::mutex m_;
  std::vector<Counters> cells_;
};

}  // namespace ringcomm
