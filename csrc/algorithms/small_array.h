// SmallArray<T>: a fixed number of elements, kept inside the object when
// there are few (no allocation on the small-message path), on the heap
// otherwise. For the per-call bookkeeping of the algorithms: requests in
// flight, where each one lands.
#pragma once

#include <cstddef>
#include <vector>

namespace ringcomm {

template <class T, int kInline = 8>
class SmallArray {
 public:
  explicit SmallArray(int n) : n_(n) {
    if (n > kInline) heap_.assign(size_t(n), T{});
  }
  T& operator[](int i) { return n_ > kInline ? heap_[size_t(i)] : inline_[i]; }
  int size() const { return n_; }

 private:
  int n_;
  T inline_[kInline] = {};
  std::vector<T> heap_;
};

}  // namespace ringcomm
