/* Counts the calling thread's heap allocations (LD_PRELOAD; read with ctypes:
 * ctypes.CDLL(None).malloc_calls()): malloc, calloc, realloc and the aligned
 * ones. Used by test_mpi.py to check that a collective's small path does not
 * allocate: operator new, Python's allocator and every library in the
 * process end up in one of these. */
#include <stddef.h>

extern void* __libc_malloc(size_t n);
extern void* __libc_calloc(size_t n, size_t size);
extern void* __libc_realloc(void* p, size_t n);
extern void* __libc_memalign(size_t align, size_t n);

static __thread unsigned long calls;

unsigned long malloc_calls(void) { return calls; }

void* malloc(size_t n) {
  ++calls;
  return __libc_malloc(n);
}

void* calloc(size_t n, size_t size) {
  ++calls;
  return __libc_calloc(n, size);
}

void* realloc(void* p, size_t n) {
  ++calls;
  return __libc_realloc(p, n);
}

void* memalign(size_t align, size_t n) {
  ++calls;
  return __libc_memalign(align, n);
}

void* aligned_alloc(size_t align, size_t n) {
  ++calls;
  return __libc_memalign(align, n);
}

int posix_memalign(void** out, size_t align, size_t n) {
  ++calls;
  void* p = __libc_memalign(align, n);
  if (!p) return 12; /* ENOMEM */
  *out = p;
  return 0;
}
