/* Counts the calling thread's malloc calls (LD_PRELOAD; read with ctypes:
 * ctypes.CDLL(None).malloc_calls()). Used by test_mpi.py to check that a
 * collective's small path does not allocate: operator new, Python's
 * allocator and every library in the process go through malloc. */
#include <stddef.h>

extern void* __libc_malloc(size_t n);

static __thread unsigned long calls;

unsigned long malloc_calls(void) { return calls; }

void* malloc(size_t n) {
  ++calls;
  return __libc_malloc(n);
}
