#include "flight.h"

#include <cstdio>

#include "common.h"

namespace ringcomm {

void FlightRecorder::issued(const FlightRecord& r) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> g(m_);
  while (records_.size() >= capacity_) records_.pop_front();
  records_.push_back(r);
}

FlightRecord* FlightRecorder::find(uint64_t seq) {
  // Records are in sequence order; the one asked for is almost always the
  // newest or next to it.
  for (auto it = records_.rbegin(); it != records_.rend(); ++it)
    if (it->seq == seq) return &*it;
  return nullptr;
}

void FlightRecorder::started(uint64_t seq) {
  if (capacity_ == 0) return;
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
  r.wait_since_ns = p.wait_since_ns.load(std::memory_order_relaxed);
  r.bytes_sent = p.bytes_sent.load(std::memory_order_relaxed);
  r.bytes_received = p.bytes_received.load(std::memory_order_relaxed);
}

void FlightRecorder::ended(uint64_t seq, const Progress& p, const std::string* error) {
  if (capacity_ == 0) return;
  const int64_t now = wall_ns();
  std::lock_guard<std::mutex> g(m_);
  if (FlightRecord* r = find(seq)) {
    if (r->state == FlightState::running) fill(*r, p);  // where it ended (or stopped)
    if (!error) r->waiting = 0;
    r->state = error ? FlightState::failed : FlightState::done;
    r->t_end_ns = now;
    if (r->t_start_ns == 0) r->t_start_ns = now;  // failed before it ran (communicator already aborted)
    if (error) r->error = *error;
  }
}

std::vector<FlightRecord> FlightRecorder::snapshot(const Progress& p) {
  std::lock_guard<std::mutex> g(m_);
  std::vector<FlightRecord> out(records_.begin(), records_.end());
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
