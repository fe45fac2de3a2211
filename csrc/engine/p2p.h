// Point-to-point: send, recv (also from any rank), and their async forms.
//
// Where it runs: beside the engine's queue, not through it. A send or a
// receive is posted on the caller's thread at once and progressed by
// whoever waits for it (P2POp::wait). Through the queue, a receive that
// waits would hold the worker, and a batch of isend/irecv to each other
// would deadlock (each rank's receive before its send). The price: a p2p op
// is not ordered after this rank's *asynchronous* collectives still queued
// (a synchronous collective has ended before the next call anyway); a
// program that mixes them waits for those Works first, as with torch.
//
// Matching: on their own channel (Channel::p2p: a communicator of its own
// over MPI, queues of their own in process), so a collective's receive never
// sees a p2p message, and no p2p op consumes a collective's sequence number
// (only the ranks involved call it). The transport's tag is
//     wire tag = user tag * 8 + dtype code
// so messages are ordered per (sender, receiver, tag) as in MPI, and the
// dtype travels outside the bytes (nothing is added to a message: the
// 8-byte latency stays MPI's). A receive never posts a buffer blind: it
// takes a message that has arrived (a matched probe), checks its size, and
// only then lets bytes land:
//   * a message of exactly the receive's size is received;
//   * one of another size (larger or smaller) is discarded, none of it
//     landing, and the receiver raises MismatchError naming both sizes;
//   * a message of the same tag from that sender with another dtype, while
//     none of this dtype has come, is a MismatchError naming both dtypes
//     (checked once the receive has waited a moment; not for any-source
//     receives, where another rank's message may be meant for a later one).
// Progress without deadlock: receives are matched in the order they were
// posted, by one matcher per communicator (P2PPending) that any waiting op
// runs, a send's included. So a rank that waits for its (rendezvous-sized)
// isend before its irecv still takes the peer's message, and the peer's
// wait on its own send completes: waits may come in any order.
// Device communicators (CUDA, the emulated device, NCCL): the payload goes
// through host memory on the host transport's p2p channel (the one control
// messages use), copied out of the caller's device buffer on the caller's
// stream (a send, before it is posted) and into it once the message has
// landed (a receive, before wait returns), never on the device queues the
// collectives use (so a p2p op waits for no queued collective). So
// every rule above holds unchanged, any-source and size checks included,
// at the price of one device-host copy each side. Not ncclSend/ncclRecv:
// a p2p op runs on the caller's thread beside the worker that drives the
// NCCL communicator (its calls would have to be ordered with the worker's
// groups on every rank alike), and NCCL has no probe, so a receive could
// not check a message's size before its bytes land.
// Any failure (mismatch, deadline, Ctrl-C) aborts the communicator and
// tells the ring, as a failed collective does, naming the op (send or recv,
// count, dtype, peer, tag: P2POp::call) and what went wrong: the sender hears of it
// while it waits (its wait polls the ring), else at its deadline, which
// names the peer.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "core/fingerprint.h"
#include "core/eager_p2p.h"
#include "core/quarantine.h"
#include "core/transport.h"

namespace ringcomm {

class Engine;
class P2POp;
int p2p_run_now(const std::shared_ptr<Engine>&, bool, int, void*, size_t, DType, int, std::shared_ptr<P2POp>*);

// This communicator's receives not yet matched, oldest first.
class P2PPending {
 public:
  void add(const std::shared_ptr<P2POp>& op);
  // Take every message that has arrived for a pending receive, in posting
  // order (a later receive never takes a message an earlier unmatched one
  // could match, as MPI's posted-receive order).
  void match(Transport& t);
  // A receive ends (failed): never matched after this returns.
  void withdraw(P2POp& op);
  // A receive of this rank, still unmatched, that would take a message from
  // `peer` with wire tag `wire` (then such a message is not a mismatch).
  bool awaits(int peer, uint32_t wire);
  // Some receive waits for its message (cheap; a hint, taken without waiting
  // for the lock).
  bool waiting();
  // The communicator's transport as an EagerP2P (the blocking fast lane's
  // on-the-spot send and take), or null: looked up on first use only (the
  // transport is the engine's for its whole life).
  EagerP2P* eager(Transport& t) {
    std::call_once(eager_once_, [&] { eager_ = dynamic_cast<EagerP2P*>(&t); });
    return eager_;
  }

 private:
  friend int p2p_run_now(const std::shared_ptr<Engine>&, bool, int, void*, size_t, DType, int,
                         std::shared_ptr<P2POp>*);
  bool idle();  // under m_: no receive waits unmatched (forgets those gone or done)
  std::mutex m_;
  std::vector<std::weak_ptr<P2POp>> recvs_;
  std::once_flag eager_once_;
  EagerP2P* eager_ = nullptr;
};

class P2POp {
 public:
  ~P2POp();
  // Progress and block up to `timeout_s` (negative: until it ends, which
  // its deadline bounds). True once complete, successfully or not (error()).
  // `interrupted` (may be null) is polled every 100 ms: true fails the op,
  // aborts the communicator (Ctrl-C), and sets *fired.
  bool wait(double timeout_s, const std::function<bool()>* interrupted = nullptr, bool* fired = nullptr);
  bool test() { return wait(0.0); }
  // test() unless another thread is waiting for this op (then false at
  // once), without back-off and without failing it at its deadline: how
  // the communicator progresses Works nobody waits for (a dropped isend)
  // without blocking behind a wait of the caller's.
  bool poll();
  bool is_completed();
  const RingError* error();
  bool is_send() const { return is_send_; }
  int peer() const { return peer_; }
  // After completion: the rank the message came from (a send: its peer).
  int source();
  size_t bytes() const { return bytes_; }
  // A failed op whose request could not be withdrawn (an MPI send): its
  // claim on the caller's array (quarantine.h). Null otherwise.
  std::shared_ptr<Hold> hold() { std::lock_guard<std::mutex> g(m_); return hold_; }

 private:
  friend class P2PPending;
  friend std::shared_ptr<P2POp> p2p_post(const std::shared_ptr<Engine>&, bool, int, void*, size_t, DType, int,
                                         uintptr_t);
  friend int p2p_run_now(const std::shared_ptr<Engine>&, bool, int, void*, size_t, DType, int,
                         std::shared_ptr<P2POp>*);
  // A new op, its flight record issued (running since t_issue_ns); not yet posted.
  static std::shared_ptr<P2POp> make(const std::shared_ptr<Engine>& e, std::shared_ptr<Transport> t, bool send,
                                     int peer, void* buf, size_t count, DType dtype, int tag, uint64_t id,
                                     int64_t t_issue_ns);
  bool wait_locked(double timeout_s, const std::function<bool()>* interrupted, bool* fired);  // under m_
  bool progress(Clock::time_point until);  // true: done; throws RingError
  // progress()'s and wait_locked()'s steps (p2p.cpp says why each).
  void check_other_dtypes();
  void on_matched();
  void back_off() const;
  bool wait_step(Clock::time_point now, Clock::time_point mine);
  void check_ending(Clock::time_point now, const std::function<bool()>* interrupted, bool* fired);
  void check_peer_gone();
  std::string timeout_text() const;
  void finish(std::unique_ptr<RingError> err);
  // `peer_died`: the peer's process is gone (RingError::peer_died, told to the ring).
  [[noreturn]] void fail(ErrKind kind, const std::string& what, bool peer_died = false);
  // Device communicators: the op's payload goes through `staging_` (see
  // the top of this file). stage(): take it and, for a send, copy the
  // caller's buffer out (the host waits, up to the deadline). delivered():
  // has a received message been copied into the caller's buffer? (the
  // copy is queued at the first call; waits at most until `until`).
  void stage(std::shared_ptr<Device> dev, uintptr_t stream);
  bool delivered(Clock::time_point until);
  // Every other rank's process is gone (only ranks of this host can be
  // known gone): what death_of says of each, or "" while one may live.
  std::string every_peer_dead() const;
  // A receive's timeout: the other tag the peer's next message has, if any.
  std::string unreceived() const;
  // A staging copy queued and not known to be done (an event that fails
  // to answer counts as pending): its memory must never be given back.
  bool copy_pending();
  // What the ring is told failed (Engine::fail_p2p; describe() names it).
  Fingerprint call() const;

  std::mutex m_;  // one waiter progresses it at a time
  std::shared_ptr<Engine> engine_;  // until it completes
  std::shared_ptr<Transport> t_;
  RequestPtr req_;  // a receive: set by P2PPending::match, then `matched_`
  std::atomic<bool> matched_{false};
  bool withdrawn_ = false;  // guarded by P2PPending's lock
  bool is_send_ = false;
  int peer_ = -1, source_ = -1;
  void* buf_ = nullptr;
  size_t bytes_ = 0, count_ = 0;
  DType dtype_ = DType::f32;
  int tag_ = 0;
  uint32_t wire_ = 0;
  uint64_t id_ = 0;  // its flight record
  int rank_ = -1;
  Clock::time_point deadline_;
  long polls_ = 0;
  bool polling_ = false;  // under m_: in poll() (no back-off)
  bool by_interrupt_ = false;  // it failed on Ctrl-C
  std::atomic<bool> done_{false};
  std::unique_ptr<RingError> err_;
  std::shared_ptr<Hold> hold_;
  std::shared_ptr<Device> dev_;    // device communicators only
  std::shared_ptr<char> staging_;  // the host copy of the payload (the quarantine may keep it)
  void* user_ = nullptr;           // the caller's device buffer
  uintptr_t stream_ = 0;           // the caller's stream, where the copies go
  EventPtr copy_;                  // a staging copy queued and not yet seen done
  bool delivering_ = false;        // a receive's copy in has been queued
};

// Post a send (`send` true: `buf` is read) or a receive (`peer` may be
// kAnySource) of `count` elements of `dtype` with `tag`. Checks the
// arguments (RingError(invalid)) and the communicator (aborted) first.
// `stream`: on a device communicator, the caller's (device.h's
// record_external), which the copy out of or into `buf` is ordered after.
std::shared_ptr<P2POp> p2p_post(const std::shared_ptr<Engine>& engine, bool send, int peer, void* buf, size_t count,
                                DType dtype, int tag, uintptr_t stream = 0);

// The blocking fast lane (Communicator.send/recv of a host array): the
// same checks as p2p_post, then the op is finished on the caller's thread
// when it can be at once, allocating nothing: a send the transport completes
// on the spot (MPI's eager sizes), a receive whose message has arrived (or,
// on transports of other processes, arrives within kSpinUs of polling)
// while no earlier receive of this communicator waits unmatched. Its flight
// record then goes in once, ended. Returns the source rank (a send: its
// peer) when done here; else -1 and *posted is the op, posted as p2p_post's
// (its record running), for the caller to wait on, so deadlines, aborts,
// Ctrl-C and mismatches are the general path's.
constexpr int kSpinUs = 20;

// What a p2p op may carry on this transport: the largest user tag (the
// transport's, less the dtype's bits of the wire tag) and message.
struct P2PLimits {
  uint32_t max_tag;
  size_t max_bytes;
};
P2PLimits p2p_limits(const Transport& t);
int p2p_run_now(const std::shared_ptr<Engine>& engine, bool send, int peer, void* buf, size_t count, DType dtype,
                int tag, std::shared_ptr<P2POp>* posted);

// A send to `dst` and a receive from `src` (kAnySource allowed) issued
// together, as MPI_Sendrecv: both are checked before either is posted (and
// the two buffers must not overlap: the send may still be read while the
// receive lands), the send first, then the receive, each done on the spot
// when it can be (p2p_run_now; a device communicator posts both, staged,
// each after the work queued on its own array's stream). Each op not yet
// done is returned for the caller to wait on, in any order (a wait
// progresses the transport, and with it the other op, and matches every
// pending receive); `source` is the receive's sender when it was done here.
// `error`: the receive failed to post after the send was (the communicator
// aborted in between, or by that failure): wait for the send (its failure
// keeps the array), then raise it.
struct SendRecv {
  std::shared_ptr<P2POp> send, recv;
  int source = -1;
  std::exception_ptr error;
  // A copy with itself that missed its deadline stays queued on the device
  // and will still read and write the arrays: this claim is never released,
  // so Python keeps both arrays for the process's life.
  std::shared_ptr<Hold> hold;
};
SendRecv p2p_sendrecv(const std::shared_ptr<Engine>& engine, void* sbuf, size_t scount, DType sdtype, int dst,
                      int stag, void* rbuf, size_t rcount, DType rdtype, int src, int rtag, uintptr_t sstream = 0,
                      uintptr_t rstream = 0);

}  // namespace ringcomm
