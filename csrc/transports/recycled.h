// Recycled<T>: objects made and destroyed once or more per collective (the
// transports' requests) come from a per-thread free list instead of malloc.
//
// The small path of a collective should not allocate: a malloc and a free
// per message are a few percent of an 8-byte all_reduce, and in a process
// with threads they may contend. A class derives from Recycled<itself>; its
// operator new takes a block of exactly its size from the calling thread's
// list, and operator delete returns one there (up to kKeep; the rest goes
// back to the heap). A block freed on another thread than the one that made
// it simply joins that thread's list: every block is an ordinary heap block.
// Deleting through a base pointer works as usual: the virtual destructor
// finds the most derived class's operator delete.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace ringcomm {

template <class T, size_t kKeep = 64>
struct Recycled {
  static void* operator new(size_t n) {
    if (gone()) return ::operator new(n);
    List& l = list();
    if (n == sizeof(T) && !l.blocks.empty()) {
      void* p = l.blocks.back();
      l.blocks.pop_back();
      return p;
    }
    return ::operator new(n);
  }
  static void operator delete(void* p, size_t n) {
    // After this thread's list was destroyed (an object outliving it at
    // exit, e.g. in the quarantine), blocks go straight back to the heap.
    if (!gone() && n == sizeof(T)) {
      List& l = list();
      if (l.blocks.size() < kKeep) {
        l.blocks.push_back(p);  // never reallocates: capacity kKeep reserved
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  struct List {
    std::vector<void*> blocks;
    List() { blocks.reserve(kKeep); }
    ~List() {
      gone() = true;
      for (void* p : blocks) ::operator delete(p);
    }
  };
  static List& list() {
    thread_local List l;
    return l;
  }
  static bool& gone() {
    thread_local bool g = false;  // trivially destructible: readable until the thread ends
    return g;
  }
};

}  // namespace ringcomm
