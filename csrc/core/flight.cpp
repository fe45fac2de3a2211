#include "core/flight.h"

#include <cstdio>

#include "core/vocabulary.h"

namespace ringcomm {

void FlightRecorder::set_capacity(size_t k) {
  std::lock_guard<std::mutex> g(m_);
  std::vector<FlightRecord> keep;
  keep.reserve(k);
  for (size_t i = used_ > k ? used_ - k : 0; i < used_; ++i) keep.push_back(records_[(first_ + i) % records_.size()]);
  capacity_ = k;
  records_ = std::move(keep);
  first_ = 0;
  used_ = records_.size();
}

void FlightRecorder::issued(const FlightRecord& r) {
  if (capacity() == 0) return;
  std::lock_guard<std::mutex> g(m_);
  if (records_.size() < capacity_.load()) {  // still filling (first_ is 0 then)
    records_.push_back(r);
    used_ = records_.size();
    return;
  }
  // Full: overwrite the oldest slot in place (its strings keep their capacity).
  FlightRecord& slot = records_[first_];
  first_ = (first_ + 1) % records_.size();
  std::string what = std::move(slot.what), error = std::move(slot.error);
  slot = FlightRecord{};
  slot.seq = r.seq;
  slot.coll = r.coll;
  slot.dtype = r.dtype;
  slot.op = r.op;
  slot.root = r.root;
  slot.algo = r.algo;
  slot.count = r.count;
  slot.t_issue_ns = r.t_issue_ns;
  slot.state = r.state;  // running already, for a collective that runs inline
  slot.t_start_ns = r.t_start_ns;
  slot.t_end_ns = r.t_end_ns;  // a p2p op recorded once it has ended (p2p_run_now)
  slot.what = std::move(what);
  slot.what.clear();
  slot.error = std::move(error);
  slot.error.clear();
}

FlightRecord* FlightRecorder::find(uint64_t seq) {
  // Records are in sequence order; the one asked for is almost always the
  // newest or next to it.
  for (size_t i = used_; i-- > 0;) {
    FlightRecord& r = records_[(first_ + i) % records_.size()];
    if (r.seq == seq) return &r;
  }
  return nullptr;
}

void FlightRecorder::started(uint64_t seq) {
  if (capacity() == 0) return;
  const int64_t now = wall_ns();
  std::lock_guard<std::mutex> g(m_);
  if (FlightRecord* r = find(seq)) {
    r->state = FlightState::running;
    r->t_start_ns = now;
  }
}

void FlightRecorder::fill(FlightRecord& r, const Progress& p) {
  r.phase = p.phase.load(std::memory_order_relaxed);
  r.step = p.step.load(std::memory_order_relaxed);
  r.segment = p.segment.load(std::memory_order_relaxed);
  r.peer = p.peer.load(std::memory_order_relaxed);
  r.waiting = p.waiting.load(std::memory_order_relaxed);
  const char* w = p.what.load(std::memory_order_relaxed);
  r.what = w ? w : "";
  // Waits are stamped on the steady clock (cheap); report them in wall time.
  const Clock::time_point since{Clock::duration(p.wait_since.load(std::memory_order_relaxed))};
  r.wait_since_ns = wall_ns() - std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count();
  r.bytes_sent = p.bytes_sent.load(std::memory_order_relaxed);
  r.bytes_received = p.bytes_received.load(std::memory_order_relaxed);
}

void FlightRecorder::ended(uint64_t seq, const Progress& p, const std::string* error) {
  if (capacity() == 0) return;
  const int64_t now = wall_ns();
  std::lock_guard<std::mutex> g(m_);
  if (FlightRecord* r = find(seq)) {
    if (r->state == FlightState::running) {
      if (error) {
        fill(*r, p);  // where it stopped, and what it waited for
      } else {  // done: only the totals (no wait to describe: no strings, no clocks)
        r->phase = p.phase.load(std::memory_order_relaxed);
        r->step = p.step.load(std::memory_order_relaxed);
        r->segment = p.segment.load(std::memory_order_relaxed);
        r->peer = p.peer.load(std::memory_order_relaxed);
        r->bytes_sent = p.bytes_sent.load(std::memory_order_relaxed);
        r->bytes_received = p.bytes_received.load(std::memory_order_relaxed);
      }
    }
    if (!error) r->waiting = 0;
    r->state = error ? FlightState::failed : FlightState::done;
    r->t_end_ns = now;
    if (r->t_start_ns == 0) r->t_start_ns = now;  // failed before it ran (communicator already aborted)
    if (error) r->error = *error;
  }
}

std::vector<FlightRecord> FlightRecorder::snapshot(const Progress& p) {
  std::lock_guard<std::mutex> g(m_);
  std::vector<FlightRecord> out;
  out.reserve(used_);
  for (size_t i = 0; i < used_; ++i) out.push_back(records_[(first_ + i) % records_.size()]);
  for (FlightRecord& r : out)
    if (r.state == FlightState::running) fill(r, p);
  return out;
}

std::string FlightRecorder::summary(const Progress& p) {
  std::vector<FlightRecord> recs = snapshot(p);
  if (recs.empty()) return "it has issued no collective yet";
  const FlightRecord& r = recs.back();
  const double ago = double(wall_ns() - (r.t_end_ns ? r.t_end_ns : r.t_issue_ns)) * 1e-9;
  char buf[320];
  const char* name = coll_name(Coll(r.coll));
  switch (r.state) {
    case FlightState::queued:
      std::snprintf(buf, sizeof buf, "its latest collective is #%llu %s, queued behind earlier work",
                    (unsigned long long)r.seq, name);
      break;
    case FlightState::running:
      if (r.waiting && r.peer >= 0)
        std::snprintf(buf, sizeof buf, "it is in #%llu %s, waiting %.2f s for rank %d to %s %s", (unsigned long long)r.seq,
                      name, double(wall_ns() - r.wait_since_ns) * 1e-9, r.peer, r.waiting == 1 ? "send" : "receive",
                      r.what.c_str());
      else
        std::snprintf(buf, sizeof buf, "it is in #%llu %s", (unsigned long long)r.seq, name);
      break;
    case FlightState::done:
      std::snprintf(buf, sizeof buf, "its latest collective #%llu %s finished %.2f s ago and it has not issued #%llu",
                    (unsigned long long)r.seq, name, ago, (unsigned long long)r.seq + 1);
      break;
    case FlightState::failed:
      std::snprintf(buf, sizeof buf, "its latest collective #%llu %s failed %.2f s ago", (unsigned long long)r.seq,
                    name, ago);
      break;
  }
  return buf;
}

}  // namespace ringcomm
