#include "core/quarantine.h"

#include <thread>

namespace ringcomm {

Quarantine& Quarantine::instance() {
  static Quarantine* q = new Quarantine;  // leaked: see quarantine.h
  return *q;
}

void Quarantine::add(std::shared_ptr<Transport> t, RequestPtr r, std::shared_ptr<void> memory,
                     std::shared_ptr<Hold> hold) {
  if (hold) hold->pending.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(m_);
  entries_.push_back(Entry{std::move(t), std::move(r), std::move(memory), std::move(hold)});
  size_.store(entries_.size(), std::memory_order_release);
  ++added_;
}

size_t Quarantine::reap() {
  if (size_.load(std::memory_order_acquire) == 0) return 0;  // the common case: one atomic load
  std::vector<Entry> released;
  size_t left;
  {
    std::lock_guard<std::mutex> g(m_);
    for (size_t i = 0; i < entries_.size();) {
      Entry& e = entries_[i];
      if (e.transport->test(*e.request)) {
        released.push_back(std::move(e));
        entries_[i] = std::move(entries_.back());
        entries_.pop_back();
      } else {
        ++i;
      }
    }
    left = entries_.size();
    size_.store(left, std::memory_order_release);
  }
  for (Entry& e : released)
    if (e.hold) e.hold->pending.fetch_sub(1, std::memory_order_acq_rel);
  // `released` (requests, transports, engine buffers) is freed here, outside the lock.
  return left;
}

size_t Quarantine::drain(double seconds) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    size_t left = reap();
    if (left == 0 || Clock::now() >= until) return left;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

size_t Quarantine::size() { return size_.load(std::memory_order_acquire); }

uint64_t Quarantine::total_added() {
  std::lock_guard<std::mutex> g(m_);
  return added_;
}

}  // namespace ringcomm
