// ShmWindow: the ranks of one host reaching each other's memory directly.
//
// A block of memory every rank of the communicator has mapped (a shared
// segment between processes, transports/shm_segment.h; plain memory between
// in-process ranks). Laid out as:
//
//   header      abort word + reason (the first failure, for everyone), the
//               futex word sleepers wait on, the count of sleepers
//   per rank    its arrival counter (own cache line, one writer), its pid,
//               the calls it announced (a ring of 4: seq, stamp, fingerprint)
//   per rank    two staging slots of slot_bytes (parity 0 and 1), each in
//               a page more than it needs: it starts at the page offset its
//               writer chose for that round (align_slots_to)
//
// The shared-memory algorithms (algorithms/shm_*.cpp) run in rounds: each
// rank writes its slot of the round's parity, everyone sync()s, then reads
// what it needs from the peers' slots. A slot of parity p is written again
// two rounds later, only after every peer has arrived at the round in
// between, which it does after its last read of the slot: the rotation is
// the only protection a slot needs (no trailing barrier, as in DeepSpeed's
// shm_internal.h and NCCL's FIFO).
//
// Waiting (sync): spin briefly, then sleep on a futex in the shared block;
// an arriving rank wakes the sleepers only when one says it sleeps. Every
// wait has the link's deadline (naming the peer), notices abort() and
// Ctrl-C (Link), a failure any rank published in the header, a peer that
// announced another call (MismatchError naming both), and a peer process
// that died (SIGKILL: kill(pid, 0)).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/fingerprint.h"
#include "core/vocabulary.h"

namespace ringcomm {

class Link;

class ShmWindow {
 public:
  // Bytes a block for `nranks` ranks with slots of `slot_bytes` needs.
  static size_t bytes_for(int nranks, size_t slot_bytes);
  // The room of one slot: slot_bytes and the page it may be shifted by.
  static size_t slot_stride(size_t slot_bytes) { return (slot_bytes + 2 * 4096 - 1) / 4096 * 4096; }
  // `base`: the block (bytes_for() bytes, zero-filled when new); `keep`
  // owns the mapping. `creator`: this rank lays the header out (before any
  // other rank attaches: the bootstrap orders it). `shared_pid`: the ranks
  // are other processes of this host (their liveness is checked); false for
  // in-process ranks.
  ShmWindow(void* base, size_t bytes, int rank, int nranks, size_t slot_bytes, bool creator, bool processes,
            std::shared_ptr<void> keep, std::string label);
  ~ShmWindow();

  int rank() const { return rank_; }
  int size() const { return n_; }
  size_t slot_bytes() const { return slot_bytes_; }
  const std::string& label() const { return label_; }
  // Rank r's staging slot of `parity` (0 or 1): slot_bytes() bytes at the
  // page offset r gave it when it last wrote that parity (align_slots_to).
  char* slot(int r, int parity) const;
  // Where this rank's slots start within their page from its next round on:
  // at `p`'s offset in its page (rounded down to 16 bytes). The copies
  // between an array and a slot run at memcpy's speed only when the two
  // share their offset in the page: on this machine's Xeon a 1 MiB broadcast
  // of N = 2 took 606 us into arrays at offset 16 (numpy's large arrays from
  // a fresh process: malloc's mmap header) against 56 us at offset 0, with
  // the slots at 0 (memcpy's rep movsb; bench/README.md, "The slots at the
  // array's page offset"). The engine aligns to each call's array, an
  // algorithm may align to the exact piece it copies (all_gather); ranks
  // that allocate alike then share the offset on both sides of a copy whose
  // piece sits at the same offset in the slot as in the array (not every
  // piece of the direct reduce-scatter's, whose slot parts are 1/N of a slot).
  void align_slots_to(const void* p) { align_ = (reinterpret_cast<uintptr_t>(p) % 4096) / 16 * 16; }
  // The communicator's rank of window rank j (the ledger books by it):
  // j itself unless set_members() said otherwise.
  int member(int j) const { return members_.empty() ? j : members_[size_t(j)]; }
  void set_members(std::vector<int> m) { members_ = std::move(m); }
  // The parity of the next round (every rank runs the same rounds).
  // Also publishes this rank's slot offset for that parity (align_slots_to):
  // nobody reads its slot of that parity until the round's sync (or
  // arrive/await_any), which orders the offset before them, as it does the
  // slot's bytes.
  int next_parity();

  // Announce this rank's current call (every collective, whichever path it
  // takes, so a peer waiting here can tell that it runs another one).
  void announce(const Fingerprint& fp);
  // Arrive at the next phase and wait until every rank has. `first`: the
  // call's first sync: the peers' announced calls must equal fp (else
  // MismatchError), before any of their slots is read. Throws RingError on
  // timeout, abort, Ctrl-C, a published failure or a dead peer.
  void sync(Link& link, const Fingerprint& fp, bool first);
  // sync in two halves, for a phase in which a rank needs only some peers
  // (scatter's leaves: the root) or can use each as it comes (all_to_all):
  // arrive() at the next phase without waiting (returns it), then
  // await_any() the first of `peers` to arrive at it (its index in peers),
  // with sync's checks on that peer (its call, a published failure) and
  // sync's wait (deadline naming the peer, abort, Ctrl-C, a dead peer). A
  // call that uses them ends with a sync() on every rank: no rank is then
  // more than two phases ahead of one that still compares its word
  // (RankArea::at).
  uint64_t arrive(const Link& link, const Fingerprint& fp);
  int await_any(Link& link, const Fingerprint& fp, uint64_t phase, const int* peers, int count);
  // Between the pieces of work a rank does without waiting (reduce's reads
  // and sums, a leaf's writes into the root): a failure a peer published,
  // or this rank's own abort (Communicator.abort from another thread),
  // raises here, as in a wait, not only at the call's closing sync, where
  // the peers may have arrived already and the call would end as if no
  // abort had come. (A Ctrl-C is polled in waits only: it calls into Python.)
  // `doing`: what the rank was doing, for the message.
  void check_running(const Link& link, const Fingerprint& fp, const char* doing) const;
  // Peer j's announced call `mine.seq` (after the call's first sync, while
  // j is still in it): what j passed for it (zero copy: its arena offsets).
  Fingerprint peer_call(int j, const Fingerprint& mine) const;
  // Publish a failure for every rank (the first one wins) and wake the
  // sleepers. Any thread. `seq`: the call the publishing rank was in
  // (or last ran); it had finished every earlier one.
  // `peer`: the peer the origin named (-1: none), `peer_died`: it died.
  // The caller then waits for writers (await_writers) before its failed
  // call returns.
  void fail(int origin, ErrKind kind, const std::string& reason, uint64_t seq, int peer = -1,
            bool peer_died = false);
  // After fail(): wait until no live peer writes into this rank's arrays
  // (shm_window.cpp, "Writes into a peer"). False when one still says it
  // does after kAwaitWriters (stopped, SIGSTOP): its write may yet land.
  bool await_writers() const;
  // Has a failure been published? (origin, or -1)
  int failed_origin() const;
  // Wake this window's sleepers (Engine::abort: they then see the interrupt).
  void wake();
  // "rank R (pid P) died" when the process of the communicator's rank
  // `member` (one of this window's, as member() numbers them) has exited;
  // "" while it lives, or when it is not a process of this window. `gone`:
  // the caller knows it has exited (the kernel said so), only the words.
  std::string death_of(int member, bool gone = false) const;
  // Are the ranks other processes whose liveness death_of() can tell?
  bool watches_processes() const { return processes_; }
  // This rank closed its communicator after its call `last_seq` (0: before
  // any): it will join no later call. Peers waiting in a later one raise at
  // once (left_note), not at their deadline; one still finishing last_seq
  // goes on. Wakes the sleepers.
  void leave(uint64_t last_seq);
  // "rank R closed its communicator after its call #k" when `member` has
  // left and so will never reach call `seq` (> k); "" otherwise (any thread).
  std::string left_note(int member, uint64_t seq) const;

  // ---- the shared arena (zero copy) ----
  // Memory every rank has mapped, one part of `per_rank` bytes per rank, in
  // which ringcomm allocates arrays (comm.empty): a collective on them has
  // its peers read each rank's part directly (algorithm zero_copy), with no
  // staging copy. Allocation is symmetric: ranks that allocate and free in
  // the same order get the same offsets (and a call checks that they did).
  void attach_arena(char* base, size_t per_rank, std::shared_ptr<void> keep);
  bool has_arena() const { return arena_ != nullptr; }
  size_t arena_bytes() const { return arena_per_rank_; }
  char* arena(int r) const { return arena_ + size_t(r) * arena_per_rank_; }
  // Offset of [p, p + bytes) in this rank's part; -1 when not inside it.
  int64_t arena_offset(const void* p, size_t bytes) const;
  // A block of this rank's part (first fit, 4 KiB aligned); throws
  // RingError(invalid) when no free range is large enough.
  size_t arena_alloc(size_t bytes);
  void arena_free(size_t offset);
  // ---- single copy (large blocks) ----
  // Ranks read blocks straight from each other's arrays: the kernel copies
  // from the peer's pages between processes (process_vm_readv, Linux's cross
  // memory attach, as Open MPI's smsc/cma), memcpy between in-process ranks.
  // One copy instead of the slots' two, in two phases whatever the size
  // (arrive, read each needed peer once it has arrived, sync).
  // Used for blocks of at least single_copy_min() bytes (SIZE_MAX: never,
  // the default; attach decides for every rank alike).
  size_t single_copy_min() const { return single_copy_min_; }
  // Is single copy on at all? (Off: SIZE_MAX, or Python's UNLIMITED, 2^62.)
  bool single_copy_on() const { return single_copy_min_ < (size_t(1) << 62); }
  void set_single_copy_min(size_t bytes) { single_copy_min_ = bytes; }
  // The limit for a block that lies in 4 KiB pages (small_pages()): the
  // kernel pins every page it copies from the peer, so such a block can go
  // faster through the slots (bench/README.md, "The sender's pages").
  // all_to_all's sender decides per block and tells its readers; for
  // all_gather every rank says what it knows of the pages its peers would
  // pin (publish_pages) and all decide alike (shm_direct.cpp).
  size_t single_copy_min_4k() const { return single_copy_min_4k_; }
  void set_single_copy_min_4k(size_t bytes) { single_copy_min_4k_ = bytes; }
  // Does [p, p + bytes) of this process lie in 4 KiB pages? The page at its
  // middle, asked of the kernel (/proc/self/pagemap's PAGEMAP_SCAN, Linux
  // 6.7+): present and not part of a transparent huge page. False when the
  // kernel cannot tell (older kernels, a page not yet touched) and between
  // in-process ranks (a memcpy pins nothing).
  bool small_pages(const void* p, size_t bytes) const;
  // Can this rank read every peer's memory? Reads a word each peer wrote
  // at construction (after every rank has attached).
  bool probe_single_copy() const;
  // Before the call's first sync: where peers find this rank's data for call
  // `seq`, in this process's addresses: `in` (its blocks back to back) or,
  // when its blocks sit in arrays of their own, `places` (their addresses);
  // `out`: where peers may write (write_output).
  void publish(uint64_t seq, const void* in, const uintptr_t* places, void* out = nullptr);
  // Before a sync of call `seq`: whether this rank's array that its peers'
  // single copy would pin lies in 4 KiB pages; after it, what rank j said
  // (MismatchError when j said nothing for this call: its limits differ).
  void publish_pages(uint64_t seq, bool small);
  bool peer_small_pages(int j, uint64_t seq) const;
  // `bytes` of rank j's data into `dst`: from `offset` bytes into the input
  // j published, or from the start of its block `block` when j published
  // places. After the call's first sync, while j is still in call `seq`;
  // throws RingError naming j (a dead peer as such).
  void read_peer(int j, uint64_t seq, size_t offset, int block, void* dst, size_t bytes) const;
  // `bytes` from address `theirs` in rank j's process (one j wrote into the
  // window for this call: all_to_all's per-peer table) into `dst`.
  void read_address(int j, uint64_t seq, uint64_t theirs, void* dst, size_t bytes) const;
  // The same the other way: `bytes` from `src` into rank j's published
  // array (process_vm_writev; gather's leaves into the root's output).
  // Throws the failure published in the window, if any, before each piece
  // (write_into).
  void write_peer(const Link& link, const Fingerprint& fp, int j, size_t offset, int block, const void* src,
                  size_t bytes);
  // `bytes` from `src` to `offset` bytes into the output rank j published
  // for call fp.seq (reduce's leaves into the root's); MismatchError when j
  // published none for it (its window limits differ: it took another path).
  void write_output(const Link& link, const Fingerprint& fp, int j, size_t offset, const void* src, size_t bytes);

  // The newest call window rank `peer` announced in the window (0: none yet).
  uint64_t latest_call(int peer) const;
  // The same for the communicator's rank `member` (as member() numbers
  // them); 0 when it is not one of this window's ranks (another host's).
  uint64_t latest_call_of(int member) const;
  // Whether the communicator's rank `member` is one of this window's.
  bool has_member(int member) const { return index_of(member) >= 0; }
  // What a peer's newest announcement (`latest`, 0: none) says about call
  // `seq`, for an error message (" Rank 1 ..."): it has not reached it, has
  // gone past it, or is in it (`in_it` then says how we know and what of it
  // is missing). Every rank announces each call in the window at its start,
  // before it sends or writes anything for it.
  static std::string announced(int member, uint64_t latest, uint64_t seq, const std::string& in_it);

 private:
  struct Header;
  struct RankArea;
  Header* header() const;
  RankArea* area(int r) const;
  // The window rank of the communicator's rank `member` (-1: none).
  int index_of(int member) const;
  bool all_arrived(uint64_t phase, int* missing) const;
  int first_arrived(uint64_t phase, const int* peers, int count, int* missing) const;
  void check_arrived(const Link& link, const Fingerprint& fp, uint64_t phase, int j);
  void wait_until(Link& link, const Fingerprint& fp, uint64_t phase, const int* peers, int count, int missing);
  // wait_until's steps (shm_window.cpp says why each).
  bool arrived(uint64_t phase, const int* peers, int count, int* missing) const;
  bool spin_for(Link& link, uint64_t phase, const int* peers, int count, int* missing, Clock::time_point until);
  void wait_slowly(Link& link, const Fingerprint& fp, uint64_t phase, const int* peers, int count, int missing,
                   Clock::time_point start);
  void check_ended(Link& link, const Fingerprint& fp, int missing, Clock::time_point now, Clock::time_point& last_poll);
  [[noreturn]] void throw_wait_timeout(Link& link, const Fingerprint& fp, int missing);
  void sleep_for_arrival(Link& link, uint64_t phase, const int* peers, int count, int* missing,
                         Clock::time_point deadline, Clock::time_point now);
  // The failure published in the header, raised on communicator rank `rank`
  // (link.rank(): not the index in this host's window, which differs when
  // the window is one host's part of a larger job) in call `seq`.
  [[noreturn]] void throw_published(int rank, uint64_t seq) const;
  // Writes into a peer's memory, and the wait that keeps them from landing
  // after that peer failed (shm_window.cpp, "Writes into a peer").
  void write_into(const Link& link, const Fingerprint& fp, int j, uint64_t theirs, const char* src, size_t bytes);
  // MismatchError unless rank j published its arrays for call `seq` (a rank
  // whose window limits differ took another path and published none: its
  // old addresses are never read or written).
  void check_published(int j, uint64_t seq, const char* what) const;
  void check_calls(const Link& link, const Fingerprint& fp, bool arrived_only);
  void check_slow(Link& link, const Fingerprint& fp, uint64_t phase, int missing);
  std::string peer_state(Link& link, int peer, const Fingerprint& fp);
  [[noreturn]] void throw_other_call(int j, uint64_t word, const Fingerprint& fp);
  void cross_copy(int j, uint64_t seq, bool write, char* mine, uint64_t theirs, size_t bytes) const;
  uint64_t peer_address(int j, uint64_t seq, size_t offset, int block) const;
  [[noreturn]] void throw_copy_failed(int j, uint64_t seq, const char* what, size_t bytes, int err) const;

  char* base_;
  size_t bytes_;
  int rank_, n_;
  size_t slot_bytes_;
  bool processes_;
  std::shared_ptr<void> keep_;
  std::string label_;
  uint64_t phase_ = 0;  // the last phase this rank arrived at
  uint64_t round_ = 0;
  size_t align_ = 0;  // align_slots_to
  long spin_ns_;        // how long sync spins, then yields, before it sleeps
  long yield_ns_;
  std::vector<int> members_;
  size_t single_copy_min_ = SIZE_MAX;
  size_t single_copy_min_4k_ = SIZE_MAX;
  char* arena_ = nullptr;
  size_t arena_per_rank_ = 0;
  std::shared_ptr<void> arena_keep_;
  std::mutex arena_m_;                      // comm.empty and the arrays' finalizers, any thread
  std::map<size_t, size_t> arena_free_;     // offset -> bytes, coalesced
  std::map<size_t, size_t> arena_used_;
};

}  // namespace ringcomm
