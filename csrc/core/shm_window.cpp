// ShmWindow (shm_window.h): the shared block's layout, the phase sync and
// how a wait in it fails.
#include "core/shm_window.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "core/link.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RC_PAUSE() _mm_pause()
#else
#define RC_PAUSE() std::this_thread::yield()
#endif

namespace ringcomm {

namespace {

constexpr uint64_t kMagic = 0x72696e67736d3034ull;  // "ringsm04" (02: slots one page longer, at an offset; 03: an output address per call, tagged; 04: `writing`)
constexpr size_t kLine = 64;
constexpr int kCalls = 4;  // announced calls kept per rank (seq % 4)
constexpr int kPhases = 4;  // the calls of the phases kept per rank (RankArea::at)

// Futexes on a shared mapping: not FUTEX_PRIVATE (the word is shared by
// processes; in process the same calls work on ordinary memory).
void futex_wait(std::atomic<uint32_t>* w, uint32_t expected, Clock::duration d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  timespec ts{time_t(ns / 1000000000), long(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

uint64_t call_word(const Fingerprint& fp) { return (fp.seq << 32) | stamp_of(fp); }

// The inode of this process's pid namespace (0: unknown). Containers that
// share /dev/shm (--ipc=host) may still each have their own.
uint64_t pid_namespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? uint64_t(st.st_ino) : 0;
}

bool oversubscribed(int nranks) { return unsigned(nranks) > std::max(1u, std::thread::hardware_concurrency()); }

long env_us(const char* name, long dflt_ns) {
  if (const char* s = std::getenv(name)) return std::max(0L, std::atol(s)) * 1000;
  return dflt_ns;
}

// How long sync spins, then yields, before it sleeps on the futex. More
// ranks than cores: a spinning rank takes the time slice the rank it waits
// for needs, so it yields almost at once.
long spin_budget_ns(int nranks) { return env_us("RINGCOMM_SHM_SPIN_US", oversubscribed(nranks) ? 1000 : 50000); }
long yield_budget_ns(int nranks) { return env_us("RINGCOMM_SHM_YIELD_US", oversubscribed(nranks) ? 2000000 : 200000); }

}  // namespace

struct alignas(kLine) ShmWindow::Header {
  uint64_t magic;
  int32_t nranks;
  int32_t pad;
  uint64_t slot_bytes;
  alignas(kLine) std::atomic<int32_t> claim;   // a failure is being written
  std::atomic<int32_t> failed;                 // 0: none; else its origin + 1 (reason below is complete)
  int32_t kind;
  int32_t peer;                                // the peer the origin named (-1: none)
  int32_t peer_died;                           // ... and whether it died (RingError::peer_died)
  uint64_t seq;                                // the publisher's call (reason and seq: before `failed`)
  char reason[1024];
  alignas(kLine) std::atomic<uint32_t> epoch;  // the futex word: bumped to wake sleepers
  alignas(kLine) std::atomic<int32_t> sleepers;
};

struct alignas(kLine) ShmWindow::RankArea {
  std::atomic<uint64_t> arrived;  // the last phase this rank reached (its own line: one writer)
  // The call this rank was in when it reached phase p, at p % kPhases:
  // written before `arrived`. A rank can be two phases ahead of one still
  // comparing phase p's word (it arrives at p + 1 without waiting: arrive(),
  // then at p + 2, a sync, where it waits), never three: reaching p + 3 takes
  // a sync at p + 2 (every call ends with one) or earlier, which needs every
  // rank past p. So four words.
  std::atomic<uint64_t> at[kPhases];
  std::atomic<uint32_t> slot_offset[2];  // where its slot of each parity starts in its page (next_parity)
  std::atomic<uint32_t> writing;  // 1 + the rank whose memory it is writing into (0: none; write_into)
  alignas(kLine) int64_t pid;     // 0: in process
  uint64_t pidns;                 // its pid namespace (a pid means something only in the same one)
  std::atomic<uint64_t> latest;   // seq of the newest call it announced
  std::atomic<uint64_t> left;     // 0: present; else 1 + its last call's seq (leave: it joins no later one)
  std::atomic<uint64_t> call[kCalls];  // (seq << 32) | stamp of call seq, at seq % kCalls
  Fingerprint fp[kCalls];
  // Single copy: this area's address in its owner's process (the probe reads
  // `pid` through it), and per call (at seq % kCalls, like fp) the owner's
  // input and block table addresses, valid while it is in that call,
  // whether its array lies in 4 KiB pages (publish_pages), and its output
  // (reduce's root: where the others write their sums) with the call that
  // published it (a stale address is never written to).
  uint64_t self;
  std::atomic<uint64_t> addr[kCalls][5];
};

size_t ShmWindow::bytes_for(int nranks, size_t slot_bytes) {
  const size_t head = round_up(sizeof(Header) + size_t(nranks) * sizeof(RankArea), 4096);
  return head + size_t(nranks) * 2 * slot_stride(slot_bytes);
}

ShmWindow::ShmWindow(void* base, size_t bytes, int rank, int nranks, size_t slot_bytes, bool creator,
                     bool processes, std::shared_ptr<void> keep, std::string label)
    : base_(static_cast<char*>(base)),
      bytes_(bytes),
      rank_(rank),
      n_(nranks),
      slot_bytes_(slot_bytes),
      processes_(processes),
      keep_(std::move(keep)),
      label_(std::move(label)),
      spin_ns_(spin_budget_ns(nranks)),
      yield_ns_(yield_budget_ns(nranks)) {
  if (bytes < bytes_for(nranks, slot_bytes)) throw_invalid("shared block too small for its ranks and slots");
  Header* h = header();
  if (creator) {
    new (h) Header();
    h->magic = kMagic;
    h->nranks = nranks;
    h->slot_bytes = slot_bytes;
    for (int r = 0; r < nranks; ++r) new (area(r)) RankArea();
  } else if (h->magic != kMagic || h->nranks != nranks || h->slot_bytes != slot_bytes) {
    throw RingError(ErrKind::transport, rank, -1, 0, "shared segment " + label_ + " was not laid out for " +
                                                         std::to_string(nranks) + " ranks (another job's?)");
  }
  area(rank)->pid = processes ? int64_t(getpid()) : 0;
  area(rank)->pidns = pid_namespace();
  area(rank)->self = reinterpret_cast<uint64_t>(area(rank));
  // First touch on the owning rank: its slots' pages are faulted in here.
  std::memset(slot(rank, 0), 0, slot_stride(slot_bytes_));  // (the offsets are 0 yet: the whole stride)
  std::memset(slot(rank, 1), 0, slot_stride(slot_bytes_));
}

ShmWindow::~ShmWindow() = default;

ShmWindow::Header* ShmWindow::header() const { return reinterpret_cast<Header*>(base_); }

ShmWindow::RankArea* ShmWindow::area(int r) const {
  return reinterpret_cast<RankArea*>(base_ + sizeof(Header)) + r;
}

char* ShmWindow::slot(int r, int parity) const {
  const size_t head = round_up(sizeof(Header) + size_t(n_) * sizeof(RankArea), 4096);
  return base_ + head + (size_t(r) * 2 + size_t(parity)) * slot_stride(slot_bytes_) +
         area(r)->slot_offset[parity].load(std::memory_order_relaxed);
}

int ShmWindow::next_parity() {
  const int parity = int(round_++ & 1);
  area(rank_)->slot_offset[parity].store(uint32_t(align_), std::memory_order_relaxed);
  return parity;
}

void ShmWindow::announce(const Fingerprint& fp) {
  RankArea* me = area(rank_);
  const int k = int(fp.seq % kCalls);
  me->call[k].store(0, std::memory_order_relaxed);  // being rewritten (a reader then skips it)
  std::atomic_thread_fence(std::memory_order_release);
  me->fp[k] = fp;
  me->fp[k].rank = rank_;
  me->call[k].store(call_word(fp), std::memory_order_release);
  me->latest.store(fp.seq, std::memory_order_release);
}

Fingerprint ShmWindow::peer_call(int j, const Fingerprint& mine) const {
  // j announced it before its first sync and cannot announce call seq + 4
  // before this call is over: the slot holds it now.
  RankArea* a = area(j);
  const int k = int(mine.seq % kCalls);
  if (a->call[k].load(std::memory_order_acquire) != call_word(mine))
    throw RingError(ErrKind::transport, member(rank_), member(j), mine.seq,
                    "rank " + std::to_string(member(j)) + "'s announcement of " + describe(mine) + " is gone from the window");
  return a->fp[k];
}

namespace {
// PAGEMAP_SCAN (linux/fs.h since 6.7; spelled out here for older headers).
struct PageRegion {
  uint64_t start, end, categories;
};
struct PmScanArg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask,
      category_anyof_mask, return_mask;
};
constexpr uint64_t kPageIsPresent = 1 << 3, kPageIsHuge = 1 << 6;
constexpr unsigned long kPagemapScan = _IOWR('f', 16, PmScanArg);

// /proc/self/pagemap, opened once per process: a child of fork() must not
// ask through its parent's descriptor (it would read the parent's pages).
std::atomic<int> pagemap = -2;  // -2: not opened yet; -1: cannot be
std::once_flag pagemap_atfork;

int pagemap_fd() {
  int fd = pagemap.load(std::memory_order_acquire);
  if (fd != -2) return fd;
  std::call_once(pagemap_atfork, [] {
    ::pthread_atfork(nullptr, nullptr, [] {
      const int old = pagemap.exchange(-2);
      if (old >= 0) ::close(old);
    });
  });
  fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  int expected = -2;
  if (!pagemap.compare_exchange_strong(expected, fd)) {  // (another thread opened it first)
    if (fd >= 0) ::close(fd);
    fd = expected;
  }
  return fd;
}
}  // namespace

bool ShmWindow::small_pages(const void* p, size_t bytes) const {
  if (!processes_ || !bytes || pagemap_fd() < 0) return false;
  const uint64_t page = (reinterpret_cast<uint64_t>(p) + bytes / 2) & ~uint64_t(4095);
  PageRegion got{};
  PmScanArg a{};
  a.size = sizeof a;
  a.start = page;
  a.end = page + 4096;
  a.vec = reinterpret_cast<uint64_t>(&got);
  a.vec_len = 1;
  a.category_anyof_mask = kPageIsPresent | kPageIsHuge;  // report the page whatever it is
  a.return_mask = kPageIsPresent | kPageIsHuge;
  if (::ioctl(pagemap_fd(), kPagemapScan, &a) != 1) return false;
  return (got.categories & kPageIsPresent) && !(got.categories & kPageIsHuge);
}

bool ShmWindow::probe_single_copy() const {
  if (!processes_) return true;  // in-process ranks: one address space
  const RankArea* me = area(rank_);
  for (int j = 0; j < n_; ++j) {
    const RankArea* a = area(j);
    if (j == rank_) continue;
    if (a->pid <= 0 || a->pidns != me->pidns) return false;
    // a->pid as j's process holds it: at the same offset from j's own address of its area
    int64_t got = 0;
    const uint64_t at = a->self + (reinterpret_cast<uint64_t>(&a->pid) - reinterpret_cast<uint64_t>(a));
    struct iovec local{&got, sizeof got}, remote{reinterpret_cast<void*>(at), sizeof got};
    if (process_vm_readv(pid_t(a->pid), &local, 1, &remote, 1, 0) != ssize_t(sizeof got) || got != a->pid) return false;
  }
  return true;
}

void ShmWindow::publish(uint64_t seq, const void* in, const uintptr_t* places, void* out) {
  RankArea* me = area(rank_);
  const int k = int(seq % kCalls);
  me->addr[k][0].store(reinterpret_cast<uint64_t>(in), std::memory_order_relaxed);
  me->addr[k][1].store(reinterpret_cast<uint64_t>(places), std::memory_order_relaxed);
  me->addr[k][3].store(reinterpret_cast<uint64_t>(out), std::memory_order_relaxed);
  me->addr[k][4].store(seq << 1 | 1, std::memory_order_relaxed);  // (never 0: the call these are for)
  // (the sync that follows releases them)
}

// Tagged with the call: a rank whose window limits differ from the others'
// (a property set on one rank only) would not say it for this call.
void ShmWindow::publish_pages(uint64_t seq, bool small) {
  area(rank_)->addr[seq % kCalls][2].store(seq << 1 | (small ? 1 : 0), std::memory_order_relaxed);  // (the sync releases it)
}

bool ShmWindow::peer_small_pages(int j, uint64_t seq) const {
  const uint64_t word = area(j)->addr[seq % kCalls][2].load(std::memory_order_relaxed);
  if (word >> 1 != seq)
    throw RingError(ErrKind::mismatch, member(rank_), member(j), seq,
                    "rank " + std::to_string(member(j)) + " did not say in which pages its array lies for call #" +
                        std::to_string(seq) + ", as rank " + std::to_string(member(rank_)) +
                        " did: the ranks' window limits differ (single_copy_min and single_copy_min_4k must be "
                        "set alike on every rank)");
  return word & 1;
}

void ShmWindow::throw_copy_failed(int j, uint64_t seq, const char* what, size_t bytes, int err) const {
  // A peer that failed (and published why) may have returned and freed the
  // array this rank reads: its reason, not "Bad address". (No write lands
  // there: write_into looks for the failure first, and the failing rank
  // waits for writers before it returns.)
  if (header()->failed.load(std::memory_order_seq_cst) > 0) throw_published(member(rank_), seq);
  // ESRCH: no process has j's pid, or the one that has it has no memory any
  // more: it is exiting, and kill() still finds it until it is a zombie, so
  // death_of could not tell yet (a kill during the copy, in CI).
  const std::string dead = death_of(member(j), err == ESRCH);
  RingError e(ErrKind::transport, member(rank_), member(j), seq,
              !dead.empty() ? dead + " during a single-copy " + what
                            : std::string("single-copy ") + what + " of " + std::to_string(bytes) + " bytes, rank " +
                                  std::to_string(member(j)) + " (pid " + std::to_string(area(j)->pid) +
                                  "), failed: " + std::strerror(err) +
                                  " (RINGCOMM_SHM_SINGLE_COPY=off turns single copy off)");
  e.peer_died = !dead.empty();
  throw e;
}

// `bytes` between this process's `mine` and rank j's address `theirs`:
// read (theirs into mine) or write (mine into theirs). Between processes the
// kernel copies (process_vm_readv / writev), which may move less than asked
// (then the rest, again) or fail: RingError naming j.
void ShmWindow::cross_copy(int j, uint64_t seq, bool write, char* mine, uint64_t theirs, size_t bytes) const {
  if (!processes_) {
    void* peer = reinterpret_cast<void*>(theirs);
    std::memcpy(write ? peer : mine, write ? static_cast<const void*>(mine) : peer, bytes);
    return;
  }
  const pid_t pid = pid_t(area(j)->pid);
  while (bytes) {
    struct iovec local{mine, bytes}, remote{reinterpret_cast<void*>(theirs), bytes};
    const ssize_t moved = write ? process_vm_writev(pid, &local, 1, &remote, 1, 0)
                                : process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (moved > 0) {
      mine += moved;
      theirs += uint64_t(moved);
      bytes -= size_t(moved);
    } else if (!(moved < 0 && errno == EINTR)) {
      throw_copy_failed(j, seq, write ? "write into its array" : "read of its data", bytes, moved < 0 ? errno : EFAULT);
    }
  }
}

uint64_t ShmWindow::peer_address(int j, uint64_t seq, size_t offset, int block) const {
  check_published(j, seq, "array");
  const RankArea* a = area(j);
  const int k = int(seq % kCalls);
  const uint64_t base = a->addr[k][0].load(std::memory_order_relaxed);
  const uint64_t places = a->addr[k][1].load(std::memory_order_relaxed);
  uint64_t at = base + offset;
  if (places) cross_copy(j, seq, false, reinterpret_cast<char*>(&at), places + uint64_t(block) * sizeof(uint64_t), sizeof at);
  return at;
}

void ShmWindow::read_peer(int j, uint64_t seq, size_t offset, int block, void* dst, size_t bytes) const {
  if (bytes) cross_copy(j, seq, false, static_cast<char*>(dst), peer_address(j, seq, offset, block), bytes);
}

void ShmWindow::read_address(int j, uint64_t seq, uint64_t theirs, void* dst, size_t bytes) const {
  if (bytes) cross_copy(j, seq, false, static_cast<char*>(dst), theirs, bytes);
}

void ShmWindow::write_peer(const Link& link, const Fingerprint& fp, int j, size_t offset, int block,
                           const void* src, size_t bytes) {
  if (bytes) write_into(link, fp, j, peer_address(j, fp.seq, offset, block), static_cast<const char*>(src), bytes);
}

// ---- Writes into a peer ---------------------------------------------------
// gather's and reduce's leaves write into the root's output. A root that
// fails (a peer died, the deadline, an abort) returns its error to a caller
// who may free that output at once, so no write may land after: found in a
// test, a leaf's process_vm_writev of 256 MiB went on landing for tens of
// milliseconds after the root had returned. So a writer says whom it writes
// into (`writing`, seq_cst) and then looks for a published failure (seq_cst)
// before each piece (and for its own abort: check_running); a failing rank
// publishes its failure (seq_cst) and then waits until no live peer says it
// writes into it (await_writers, from Link::fail()). Of the two stores, each
// side loads the other's after its own: a writer either sees the failure and
// writes no more, or the failing rank sees it writing and waits for its piece
// (at most kWritePiece) to land.
namespace {
constexpr size_t kWritePiece = size_t(4) << 20;
constexpr auto kAwaitWriters = std::chrono::seconds(2);
}  // namespace

void ShmWindow::write_into(const Link& link, const Fingerprint& fp, int j, uint64_t theirs, const char* src,
                           size_t bytes) {
  std::atomic<uint32_t>& mine = area(rank_)->writing;
  struct Done {
    std::atomic<uint32_t>& w;
    ~Done() { w.store(0, std::memory_order_seq_cst); }
  } done{mine};
  mine.store(uint32_t(j + 1), std::memory_order_seq_cst);
  for (size_t at = 0; at < bytes; at += kWritePiece) {
    check_running(link, fp, "wrote into a peer's output");  // (the failure: seq_cst, as the comment above says)
    // (process_vm_writev's local iovec is not const; it is only read)
    cross_copy(j, fp.seq, true, const_cast<char*>(src + at), theirs + at, std::min(kWritePiece, bytes - at));
  }
}

bool ShmWindow::await_writers() const {
  // Bounded: a writer's piece lands in milliseconds; one that is stopped
  // (SIGSTOP) would otherwise hold this rank forever. Within the engine's
  // grace for a Ctrl-C (5 s), so an interrupted caller's failed call ends
  // in it; past the bound the caller's arrays are held for good
  // (Link::fail), as a request that cannot be withdrawn holds them.
  const auto start = Clock::now(), until = start + kAwaitWriters;
  for (int j = 0; j < n_; ++j) {
    if (j == rank_) continue;
    auto last_check = start;
    for (unsigned i = 0; area(j)->writing.load(std::memory_order_seq_cst) == uint32_t(rank_ + 1); ++i) {
      const auto now = Clock::now();
      if (now >= until) return false;
      if (now - last_check >= std::chrono::milliseconds(1)) {  // a dead writer writes no more
        last_check = now;
        if (!death_of(member(j)).empty()) break;
      }
      if (i < 1000) sched_yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return true;
}

void ShmWindow::check_published(int j, uint64_t seq, const char* what) const {
  if (area(j)->addr[seq % kCalls][4].load(std::memory_order_relaxed) != (seq << 1 | 1))
    throw RingError(ErrKind::mismatch, member(rank_), member(j), seq,
                    "rank " + std::to_string(member(j)) + " published no " + what + " for call #" +
                        std::to_string(seq) + ", which rank " + std::to_string(member(rank_)) +
                        " would copy by single copy: the ranks' window limits differ (single_copy_min and "
                        "single_copy_min_4k must be set alike on every rank)");
}

void ShmWindow::write_output(const Link& link, const Fingerprint& fp, int j, size_t offset, const void* src,
                             size_t bytes) {
  check_published(j, fp.seq, "output");
  const uint64_t out = area(j)->addr[fp.seq % kCalls][3].load(std::memory_order_relaxed);
  if (!out)  // (j published for this call, but no output: only a root does)
    throw RingError(ErrKind::mismatch, member(rank_), member(j), fp.seq,
                    "rank " + std::to_string(member(j)) + " published no output for call #" + std::to_string(fp.seq));
  if (bytes) write_into(link, fp, j, out + offset, static_cast<const char*>(src), bytes);
}

bool ShmWindow::all_arrived(uint64_t phase, int* missing) const {
  for (int j = 0; j < n_; ++j)
    if (area(j)->arrived.load(std::memory_order_acquire) < phase) {
      *missing = j;
      return false;
    }
  return true;
}

int ShmWindow::failed_origin() const {
  const int f = header()->failed.load(std::memory_order_acquire);
  return f > 0 ? f - 1 : -1;
}

void ShmWindow::fail(int origin, ErrKind kind, const std::string& reason, uint64_t seq, int peer, bool peer_died) {
  Header* h = header();
  if (h->claim.exchange(1, std::memory_order_acq_rel) == 0) {
    const size_t n = std::min(reason.size(), sizeof(h->reason) - 1);
    std::memcpy(h->reason, reason.data(), n);
    h->reason[n] = 0;
    h->kind = int32_t(kind);
    h->peer = peer;
    h->peer_died = peer_died ? 1 : 0;
    h->seq = seq;
    h->failed.store(std::max(origin, 0) + 1, std::memory_order_seq_cst);
  } else {
    // Another rank claimed it: its store of `failed` may not have landed
    // yet, and a writer into this rank that does not see it writes on.
    const auto until = Clock::now() + std::chrono::milliseconds(100);
    while (h->failed.load(std::memory_order_seq_cst) == 0 && Clock::now() < until) sched_yield();
    int32_t none = 0;  // it stalled or died in between: the writers need `failed` set, whoever says why
    h->failed.compare_exchange_strong(none, std::max(origin, 0) + 1, std::memory_order_seq_cst);
  }
  wake();
}

void ShmWindow::wake() {
  Header* h = header();
  h->epoch.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&h->epoch);
}

void ShmWindow::throw_published(int rank, uint64_t seq) const {
  const Header* h = header();
  const int origin = failed_origin();
  const ErrKind kind = ErrKind(h->kind);
  RingError e(kind == ErrKind::mismatch ? ErrKind::mismatch : ErrKind::aborted, rank, origin, seq,
              std::string(h->reason) + " (reported to rank " + std::to_string(rank) + " through shared memory)");
  e.origin = origin;
  e.cause = kind;
  e.origin_peer = h->peer;
  e.peer_died = h->peer_died != 0;
  throw e;
}

// The peers' announced calls for fp.seq must be this one. `arrived_only`:
// only peers that have arrived at the current phase (the others may not
// have announced yet).
void ShmWindow::check_calls(const Link& link, const Fingerprint& fp, bool arrived_only) {
  const uint64_t mine = call_word(fp);
  const int k = int(fp.seq % kCalls);
  for (int j = 0; j < n_; ++j) {
    if (j == rank_) continue;
    RankArea* a = area(j);
    if (arrived_only && a->arrived.load(std::memory_order_acquire) < phase_) continue;
    const uint64_t w = a->call[k].load(std::memory_order_acquire);
    if (w == mine || (w >> 32) != (fp.seq & 0xffffffffu)) continue;  // the same call, or not (or no longer) there
    Fingerprint theirs = a->fp[k];
    std::atomic_thread_fence(std::memory_order_acquire);
    if (a->call[k].load(std::memory_order_relaxed) != w) continue;  // rewritten while we read it
    throw RingError(ErrKind::mismatch, member(rank_), member(j), fp.seq, mismatch_text(theirs, fp));
  }
  (void)link;
}

// A peer that has not arrived: has it announced another call for this seq,
// moved past it, or died?

int ShmWindow::index_of(int member) const {
  int j = members_.empty() ? member : -1;
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i] == member) j = int(i);
  return j >= 0 && j < n_ ? j : -1;
}

std::string ShmWindow::death_of(int member, bool gone) const {
  if (!processes_) return "";
  const int j = index_of(member);
  if (j < 0 || j == rank_) return "";
  const RankArea* a = area(j);
  if (a->pid <= 0 || a->pidns != area(rank_)->pidns || !(gone || process_gone(int(a->pid)))) return "";
  return died(member, a->pid);
}

void ShmWindow::check_slow(Link& link, const Fingerprint& fp, uint64_t phase, int missing) {
  check_calls(link, fp, false);
  RankArea* a = area(missing);
  // It announces a later call only after arriving at every phase of this
  // one: seen after its announcement, its arrival counter tells whether it
  // skipped this call or just finished it since we looked.
  const uint64_t latest = a->latest.load(std::memory_order_acquire);
  if (latest > fp.seq && a->arrived.load(std::memory_order_acquire) < phase)
    throw RingError(ErrKind::mismatch, member(rank_), member(missing), fp.seq,
                    "rank " + std::to_string(member(missing)) + " went on to call #" + std::to_string(latest) +
                        " without joining " + describe(fp) + " on rank " + std::to_string(member(rank_)) +
                        " through shared memory: the ranks disagree on the call");
  const std::string dead = death_of(member(missing));
  if (!dead.empty())
    throw_peer_died(member(rank_), member(missing), fp.seq,
                    dead + " while rank " + std::to_string(member(rank_)) + " waited for it in " + describe(fp) +
                        " (shared memory)");
  const std::string left = left_note(member(missing), fp.seq);
  if (!left.empty()) throw_peer_left(member(rank_), member(missing), fp.seq, left, describe(fp));
}

void ShmWindow::leave(uint64_t last_seq) {
  area(rank_)->left.store(last_seq + 1, std::memory_order_seq_cst);
  wake();
}

std::string ShmWindow::left_note(int member, uint64_t seq) const {
  const int j = index_of(member);
  if (j < 0 || j == rank_) return "";
  const uint64_t left = area(j)->left.load(std::memory_order_acquire);
  if (left == 0 || seq < left) return "";  // present, or it still ran call seq (<= its last)
  return left_words(member, left, seq);
}

uint64_t ShmWindow::latest_call(int peer) const { return area(peer)->latest.load(std::memory_order_acquire); }

uint64_t ShmWindow::latest_call_of(int member) const {
  const int j = index_of(member);
  return j < 0 ? 0 : latest_call(j);
}

std::string ShmWindow::announced(int member, uint64_t latest, uint64_t seq, const std::string& in_it) {
  const std::string who = "rank " + std::to_string(member);
  if (latest == 0) return " Rank " + std::to_string(member) + " has not announced any collective yet.";
  if (latest < seq)
    return " The newest call " + who + " has announced is #" + std::to_string(latest) + ": it has not reached #" +
           std::to_string(seq) + ".";
  if (latest > seq)
    return " Rank " + std::to_string(member) + " has already announced #" + std::to_string(latest) +
           ", a later call than #" + std::to_string(seq) + ".";
  return " Rank " + std::to_string(member) + " has started #" + std::to_string(seq) + " too " + in_it + ".";
}

// What the window says about `peer` (its newest announced call), or what
// the link knows (in process: the peer's flight record). A peer in this
// call that has not arrived here (stopped, or slow within the call) has
// announced it: "the newest call it announced is #74: it has not reached
// #74" was said of it.
std::string ShmWindow::peer_state(Link& link, int peer, const Fingerprint& fp) {
  const int who = member(peer);
  std::string note = link.peer_report(who);
  if (!note.empty()) return note;
  return announced(who, latest_call(peer), fp.seq,
                   "(announced in shared memory) but has not arrived at this step of it");
}

uint64_t ShmWindow::arrive(const Link& link, const Fingerprint& fp) {
  Header* h = header();
  if (h->failed.load(std::memory_order_acquire) > 0) throw_published(link.rank(), fp.seq);
  const uint64_t p = ++phase_;
  area(rank_)->at[p % kPhases].store(call_word(fp), std::memory_order_relaxed);
  area(rank_)->arrived.store(p, std::memory_order_seq_cst);  // (publishes `at` too)
  if (h->sleepers.load(std::memory_order_seq_cst) > 0) wake();
  return p;
}

void ShmWindow::sync(Link& link, const Fingerprint& fp, bool first) {
  const uint64_t p = arrive(link, fp);
  int missing = -1;
  if (!all_arrived(p, &missing)) wait_until(link, fp, p, nullptr, 0, missing);
  // Every rank arrived at p: each must have been in this call (two-sided,
  // on every sync: a peer that went ahead on its own is caught here, not
  // by its next call), and no rank may have failed in it meanwhile (one
  // that gave up may already have handed its arrays back to its caller). A
  // failure in a later call does not stop this one: its publisher finished
  // this call, so every rank passed this sync's phase already and what we
  // still read sits in slots no one writes before our next sync (a rank
  // that slept here while a peer died after this call once raised, in CI).
  for (int j = 0; j < n_; ++j)
    if (j != rank_) check_arrived(link, fp, p, j);
  (void)first;
}

int ShmWindow::await_any(Link& link, const Fingerprint& fp, uint64_t p, const int* peers, int count) {
  int missing = -1;
  int k = first_arrived(p, peers, count, &missing);
  if (k < 0) {
    wait_until(link, fp, p, peers, count, missing);
    k = first_arrived(p, peers, count, &missing);
  }
  check_arrived(link, fp, p, peers[k]);
  return k;
}

int ShmWindow::first_arrived(uint64_t phase, const int* peers, int count, int* missing) const {
  for (int i = 0; i < count; ++i)
    if (area(peers[i])->arrived.load(std::memory_order_acquire) >= phase) return i;
  *missing = peers[0];
  return -1;
}

// Peer j arrived at phase p: it must be in this call, and no rank may have
// failed in it (see sync).
void ShmWindow::check_arrived(const Link& link, const Fingerprint& fp, uint64_t p, int j) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Header* h = header();
  if (h->failed.load(std::memory_order_acquire) > 0 && h->seq <= fp.seq) throw_published(link.rank(), fp.seq);
  const uint64_t theirs = area(j)->at[p % kPhases].load(std::memory_order_acquire);
  if (theirs != call_word(fp)) throw_other_call(j, theirs, fp);
}

// Wait (spin, yield, sleep) until every rank has arrived at phase p
// (peers == nullptr), or one of `peers`; `missing`: one not there yet.
void ShmWindow::wait_until(Link& link, const Fingerprint& fp, uint64_t p, const int* peers, int count,
                           int missing) {
  const auto start = Clock::now();
  if (spin_for(link, p, peers, count, &missing, start + std::chrono::nanoseconds(spin_ns_))) return;
  wait_slowly(link, fp, p, peers, count, missing, start);
}

bool ShmWindow::arrived(uint64_t p, const int* peers, int count, int* missing) const {
  return peers ? first_arrived(p, peers, count, missing) >= 0 : all_arrived(p, missing);
}

// Spin until `until`: true once arrived.
bool ShmWindow::spin_for(Link& link, uint64_t p, const int* peers, int count, int* missing,
                         Clock::time_point until) {
  for (unsigned i = 1;; ++i) {
    RC_PAUSE();
    if (arrived(p, peers, count, missing)) return true;
    if ((i & 63) == 0 && Clock::now() >= until) return false;
    if ((i & 1023) == 0) link.progress_p2p();  // (about every 30 us: Link::set_p2p_progress)
  }
}

// After the spin, yield the core for a while: with more ranks than cores the
// rank we wait for needs this time slice, and a futex round trip (sleep, the
// writer's wake, the scheduler) costs tens of microseconds more than
// sched_yield (what Open MPI's progress loop does when oversubscribed).
// Then sleep. Failures, aborts, Ctrl-C and the deadline are looked at in
// both (the yield phase lasts 2 s when oversubscribed, too long for a Ctrl-C
// or a peer's published failure to go unseen); the costlier checks (a dead
// peer's pid, the transport's progress) at most once a millisecond while
// yielding.
void ShmWindow::wait_slowly(Link& link, const Fingerprint& fp, uint64_t p, const int* peers, int count, int missing,
                            Clock::time_point start) {
  const auto yield_until = start + std::chrono::nanoseconds(yield_ns_);
  link.publish_wait(member(missing), 1, "its part in shared memory", start);
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(link.options().timeout_s));
  auto last_poll = start, last_check = start;
  int shown = missing;
  while (!arrived(p, peers, count, &missing)) {
    if (missing != shown) {  // the one waited for now (the flight recorder names it)
      shown = missing;
      link.publish_wait(member(missing), 1, "its part in shared memory", start);
    }
    const auto now = Clock::now();
    check_ended(link, fp, missing, now, last_poll);
    const bool yielding = now < yield_until;
    if (!yielding || now - last_check >= std::chrono::milliseconds(1)) {
      last_check = now;
      check_slow(link, fp, p, missing);
      // Hear an ABORT notice travelling around the ring, and keep the
      // point-to-point transport moving while we wait here (Link::drain()
      // sees every header delivered before a call ends, which also covers
      // waits outside the window).
      link.poll_control();
    }
    if (now >= deadline) throw_wait_timeout(link, fp, missing);
    if (yielding) sched_yield();
    else sleep_for_arrival(link, p, peers, count, &missing, deadline, now);
  }
  link.publish_wait(-1, 0, nullptr, start);
}

// A failure published in the window, an abort, or a Ctrl-C (polled every
// 100 ms) ends the wait: each throws.
void ShmWindow::check_ended(Link& link, const Fingerprint& fp, int missing, Clock::time_point now,
                            Clock::time_point& last_poll) {
  if (header()->failed.load(std::memory_order_acquire) > 0) throw_published(link.rank(), fp.seq);
  if (link.transport().interrupted())
    throw RingError(ErrKind::aborted, member(rank_), -1, fp.seq,
                    "rank " + std::to_string(member(rank_)) +
                        (link.user_interrupted() ? " was interrupted (KeyboardInterrupt) in " : " aborted ") +
                        describe(fp) + " while it waited for rank " + std::to_string(member(missing)) +
                        " (shared memory)");
  if (now - last_poll < std::chrono::milliseconds(100)) return;
  last_poll = now;
  if (link.interrupt_requested()) {
    link.mark_user_interrupt();
    throw RingError(ErrKind::aborted, member(rank_), -1, fp.seq,
                    "rank " + std::to_string(member(rank_)) + " was interrupted (KeyboardInterrupt) in " +
                        describe(fp) + " while it waited for rank " + std::to_string(member(missing)));
  }
}

void ShmWindow::throw_wait_timeout(Link& link, const Fingerprint& fp, int missing) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", link.options().timeout_s);
  throw RingError(ErrKind::timeout, member(rank_), member(missing), fp.seq,
                  "timed out after " + std::string(secs) + " s in " + describe(fp) + ": rank " +
                      std::to_string(member(rank_)) + " waited for rank " + std::to_string(member(missing)) +
                      " to arrive in shared memory (" + label_ +
                      "); is that rank alive and calling the same collective?" + peer_state(link, missing, fp));
}

// Sleep until an arrival (or a failure) bumps the epoch: say so first, then
// look once more (an arrival between the two either is seen here or sees us
// sleeping and wakes us).
void ShmWindow::sleep_for_arrival(Link& link, uint64_t p, const int* peers, int count, int* missing,
                                  Clock::time_point deadline, Clock::time_point now) {
  Header* h = header();
  const uint32_t e = h->epoch.load(std::memory_order_seq_cst);
  h->sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!arrived(p, peers, count, missing) && h->failed.load(std::memory_order_acquire) == 0 &&
      !link.transport().interrupted())
    futex_wait(&h->epoch, e, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(20)));
  h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmWindow::check_running(const Link& link, const Fingerprint& fp, const char* doing) const {
  if (header()->failed.load(std::memory_order_seq_cst) > 0) throw_published(link.rank(), fp.seq);
  if (link.transport().interrupted())
    throw RingError(ErrKind::aborted, member(rank_), -1, fp.seq,
                    "rank " + std::to_string(member(rank_)) +
                        (link.user_interrupted() ? " was interrupted (KeyboardInterrupt) in " : " aborted ") +
                        describe(fp) + " while it " + doing + " (shared memory)");
}

// Rank j reached this phase in another call (its word: seq << 32 | stamp):
// name it from its announcements when they still hold it.
void ShmWindow::throw_other_call(int j, uint64_t word, const Fingerprint& fp) {
  RankArea* a = area(j);
  const uint64_t seq = word >> 32;
  const int k = int(seq % kCalls);
  if (a->call[k].load(std::memory_order_acquire) == word) {
    Fingerprint theirs = a->fp[k];
    std::atomic_thread_fence(std::memory_order_acquire);
    if (a->call[k].load(std::memory_order_relaxed) == word)
      throw RingError(ErrKind::mismatch, member(rank_), member(j), fp.seq, mismatch_text(theirs, fp));
  }
  throw RingError(ErrKind::mismatch, member(rank_), member(j), fp.seq,
                  "ranks disagree on a collective call: rank " + std::to_string(member(j)) + " reached the same step in "
                  "shared memory in call #" + std::to_string(seq) + " (another call), while rank " +
                  std::to_string(member(rank_)) + " called " + describe(fp));
}

void ShmWindow::attach_arena(char* base, size_t per_rank, std::shared_ptr<void> keep) {
  std::lock_guard<std::mutex> g(arena_m_);
  arena_ = base;
  arena_per_rank_ = per_rank;
  arena_keep_ = std::move(keep);
  arena_free_.clear();
  arena_used_.clear();
  arena_free_[0] = per_rank;
}

int64_t ShmWindow::arena_offset(const void* p, size_t bytes) const {
  if (!arena_) return -1;
  const char* c = static_cast<const char*>(p);
  const char* mine = arena(rank_);
  if (c < mine || c + bytes > mine + arena_per_rank_) return -1;
  return int64_t(c - mine);
}

size_t ShmWindow::arena_alloc(size_t bytes) {
  std::lock_guard<std::mutex> g(arena_m_);
  if (!arena_) throw_invalid("this communicator has no shared arena");
  const size_t need = round_up(std::max<size_t>(bytes, 1), 4096);
  for (auto it = arena_free_.begin(); it != arena_free_.end(); ++it) {
    if (it->second < need) continue;
    const size_t off = it->first, left = it->second - need;
    arena_free_.erase(it);
    if (left) arena_free_[off + need] = left;
    arena_used_[off] = need;
    return off;
  }
  size_t free_bytes = 0, largest = 0;
  for (auto& f : arena_free_) {
    free_bytes += f.second;
    largest = std::max(largest, f.second);
  }
  throw_invalid("the shared arena is full: " + std::to_string(bytes) + " bytes asked, " + std::to_string(free_bytes) +
                " free of " + std::to_string(arena_per_rank_) + " (largest block " + std::to_string(largest) +
                "); free arrays or set RINGCOMM_SHM_ARENA (bytes per rank) larger");
}

void ShmWindow::arena_free(size_t offset) {
  std::lock_guard<std::mutex> g(arena_m_);
  auto u = arena_used_.find(offset);
  if (u == arena_used_.end()) return;
  size_t off = u->first, len = u->second;
  arena_used_.erase(u);
  auto next = arena_free_.lower_bound(off);
  if (next != arena_free_.end() && next->first == off + len) {  // merge with the range after
    len += next->second;
    next = arena_free_.erase(next);
  }
  if (next != arena_free_.begin()) {  // and the one before
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  arena_free_[off] = len;
}

}  // namespace ringcomm
