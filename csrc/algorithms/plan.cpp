#include "algorithms/plan.h"

#include "core/vocabulary.h"

namespace ringcomm {

RingPlan::RingPlan(size_t count, int nranks, size_t elem_size, size_t segment_bytes)
    : count_(count), n_(nranks), elem_(elem_size) {
  if (nranks < 1) throw_invalid("RingPlan: nranks must be >= 1");
  if (elem_size == 0) throw_invalid("RingPlan: elem_size must be >= 1");
  // K is set by the largest chunk so that no segment exceeds segment_bytes;
  // smaller chunks (one element shorter) then get segments at most as large.
  k_ = whole_buffer_segments(chunk_count(0), elem_size, segment_bytes);
}

}  // namespace ringcomm
