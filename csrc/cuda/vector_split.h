// How a device reduction of n elements splits into a scalar head, 16-byte
// vector words and a scalar tail. Ring segments start at arbitrary element
// offsets (count 1000, 3 ranks, float32: chunk 1 starts at byte 1336), so
// requiring all three pointers to be 16-byte aligned would send most segments
// down the scalar path. When the pointers share their misalignment modulo 16,
// a short scalar head brings all three to a 16-byte boundary together; only
// pointers that disagree go fully scalar. Pure arithmetic: tested on CPUs
// (ringcomm._cuda.vector_split).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ringcomm {

struct VectorSplit {
  size_t head = 0;   // elements before the first aligned word (scalar)
  size_t words = 0;  // 16-byte words (vectorized)
  size_t tail = 0;   // elements after the last word (scalar)
};

inline VectorSplit vector_split(uintptr_t dst, uintptr_t a, uintptr_t b, size_t n, size_t elem) {
  VectorSplit s;
  const size_t mis = dst % 16;
  if (a % 16 != mis || b % 16 != mis || mis % elem != 0 || elem > 16 || 16 % elem != 0) {
    s.head = n;  // no common alignment: all scalar
    return s;
  }
  s.head = mis ? (16 - mis) / elem : 0;
  if (s.head > n) s.head = n;
  const size_t per = 16 / elem;
  s.words = (n - s.head) / per;
  s.tail = n - s.head - s.words * per;
  return s;
}

}  // namespace ringcomm
