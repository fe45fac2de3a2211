// Opt-in step trace (Communicator.trace() in Python): one record per rank per
// ring step, saying what was sent to whom, what came from whom, how many
// bytes, when, and optionally the values the step produced. When tracing is
// off the Link holds no tracer and the algorithms' trace calls return at once.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace ringcomm {

enum class Phase : int32_t { reduce_scatter = 0, all_gather, broadcast, gather, scatter, fold, exchange, unfold, kCount };

struct TraceStep {
  uint64_t seq = 0;
  int32_t coll = 0, dtype = 0, phase = 0, step = 0, rank = 0;
  int32_t send_peer = -1, send_chunk = -1;  // -1: nothing sent in this step
  int32_t recv_peer = -1, recv_chunk = -1;  // -1: nothing received
  uint64_t send_bytes = 0, recv_bytes = 0;
  int64_t t_start_ns = 0, t_end_ns = 0;     // steady clock
  std::vector<char> values;                 // what the step produced, when recorded
};

class Tracer {
 public:
  explicit Tracer(bool values) : values_(values) {}
  bool values() const { return values_; }
  void add(TraceStep&& s) {
    std::lock_guard<std::mutex> g(m_);
    steps_.push_back(std::move(s));
  }
  std::vector<TraceStep> take() {
    std::lock_guard<std::mutex> g(m_);
    std::vector<TraceStep> out;
    out.swap(steps_);
    return out;
  }

 private:
  bool values_;
  std::mutex m_;
  std::vector<TraceStep> steps_;
};

}  // namespace ringcomm
