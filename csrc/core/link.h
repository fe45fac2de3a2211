// Link: this rank's connection to the ring, as the algorithms see it.
//
// It wraps a Transport and adds the three things every collective needs and
// no algorithm should repeat:
//   * the ledger: every message is counted here, payload apart from control;
//   * deadlines: every wait has one, and expiry names the peer waited for;
//   * the control stream: at the start of each collective a rank sends a
//     small header (sequence number + fingerprint of the call) to its right
//     neighbour and checks the one from its left before it posts its first
//     receive from the left (so a peer with another count can never deliver
//     messages of another size), and at the latest when the collective ends.
//     Sends may leave before that check: a receiver checks first. This keeps
//     the header off the latency path: it travels alongside the first
//     payload. Disagreement raises MismatchError, and any failure sends an
//     ABORT notice to both neighbours, which each rank forwards onwards, so
//     every rank that is waiting on the ring fails within one trip around it
//     instead of hanging until its deadline, even when one rank is away.
//   * every payload message is checked: on a host transport that carries
//     stamps (transport.h: MPI's tag, a field in process) each one carries a
//     32-bit hash of its call outside its bytes; a receive takes only a
//     message with its call's stamp (another call's is found by probe and
//     fails the call), and its size is checked before the algorithm sees it.
//     That covers peers beyond the left neighbour (recursive doubling,
//     halving-doubling, master-centric) at no cost: no byte is added to a
//     message (an extra byte can cost a protocol step: Open MPI sends up to
//     256 bytes inline). To name both calls in the error, the two ranks
//     then exchange fingerprints on the check channel (every failing rank
//     also sends its own to the peers it sent to). Elsewhere (payload in
//     device memory) the first message to a peer beyond the neighbours is
//     preceded by the sender's fingerprint on its own, in host memory
//     (Channel::check), and it is checked before the payload's receive is
//     even posted.
//   * failure hygiene: requests a failed collective cannot withdraw go to
//     the quarantine (quarantine.h) with the memory they may touch; a
//     failure the ring reported while this rank was away is raised when it
//     next calls, before it posts anything; waits poll an interrupt check
//     (Ctrl-C) and publish where they are (Progress, for the flight recorder).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/vocabulary.h"
#include "core/fingerprint.h"
#include "core/flight.h"
#include "core/ledger.h"
#include "core/quarantine.h"
#include "core/shm_window.h"
#include "core/trace.h"
#include "core/transport.h"

namespace ringcomm {

struct Options {
  double timeout_s = 300.0;         // deadline of every blocking wait
  size_t segment_bytes = 1u << 20;  // largest payload message (the pipelining unit)
  int window = 4;                   // receives in flight per pass (>= 2)
};

class Link {
 public:
  Link(std::shared_ptr<Transport> t, Options opts);
  ~Link();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int left() const { return (rank_ + size_ - 1) % size_; }
  int right() const { return (rank_ + 1) % size_; }
  const Options& options() const { return opts_; }
  Options& mutable_options() { return opts_; }
  Ledger& ledger() { return ledger_; }
  Transport& transport() { return *t_; }
  const Transport& transport() const { return *t_; }
  std::shared_ptr<Transport> shared_transport() const { return t_; }

  // ---- collective lifecycle (called by the Engine) ----
  // Send this collective's header to the right neighbour. With
  // `header_inline` (stamped links only) none is sent: the stamps of the
  // first payload messages each way are the header (for algorithms whose
  // first message goes to the neighbour anyway: one message less per call;
  // Engine decides, alike on every rank).
  void begin(const Fingerprint& fp, bool header_inline = false);
  // A collective that runs in the shared-memory window (algorithms/shm_*.cpp):
  // no header is sent, the window carries the call (ShmWindow::announce).
  void begin_shared(const Fingerprint& fp);
  // Receive and check the left neighbour's header (once per collective;
  // recv() and drain() call it). Throws MismatchError on disagreement.
  void await_header();
  // Between collectives: read what the left neighbour has sent on the control
  // stream without waiting (headers of later calls are kept); throws the
  // failure an ABORT notice reports. Device transports need it: their
  // collectives end on the host before the device is done, so a peer's
  // failure can arrive while only the device still waits on it.
  void poll_control();
  // Wait for every request posted so far in this collective; forget them.
  // Algorithms call it before reusing memory that a send may still read.
  void drain();
  // The collective is over (after its last drain()): a failure heard between
  // calls sends no fingerprint (fail()).
  void end_call() { told_.clear(); }
  // After any exception escaped a collective: withdraw outstanding requests
  // (those that cannot be withdrawn go to the quarantine with the memory
  // they may touch), pass an ABORT notice to the right, and mark this link
  // as dead. `call` (a failed p2p op, which never begins on the link): the
  // notice names it, with e's kind and peer, instead of the last collective.
  // Returns a claim never released when a peer still wrote into this rank's
  // arrays after the wait for writers (ShmWindow::await_writers): the failed
  // collective's arrays are kept for good (null otherwise).
  std::shared_ptr<Hold> fail(const RingError& e, const Fingerprint* call = nullptr);
  // After fail(): the claim on the failed collective's caller arrays (null
  // when no request that may touch them outlived it).
  std::shared_ptr<Hold> hold() const { return hold_; }
  bool aborted() const { return aborted_; }
  // Payload messages carry the call's stamp (host memory, a stamping transport).
  bool stamped() const { return stamp_mask_ != 0; }

  // The coming abort is a user interrupt (Ctrl-C): the ring is told so. Any thread.
  void mark_user_interrupt() { user_interrupted_.store(true); }
  const std::string& abort_reason() const { return abort_reason_; }
  uint64_t seq() const { return fp_.seq; }
  // The running collective's fingerprint (begin / begin_shared).
  const Fingerprint& call() const { return fp_; }

  // ---- payload movement (called by the algorithms) ----
  // The returned request is owned by the Link until drain(); null when bytes == 0
  // (nothing is sent for an empty segment, and both sides skip it alike).
  // `unit`: the algorithm's (step, segment) index of this message (transport.h).
  Request* send(int peer, const void* buf, size_t bytes, int unit = -1);
  Request* recv(int peer, void* buf, size_t bytes, int unit = -1);
  // The same, but a message travels even when bytes == 0: for sizes that
  // only the sender knows (all_to_all's per-peer splits), so the receiver
  // checks every disagreement, an empty block included, before a byte lands:
  // the block's size is part of the message's stamp (pair_stamp), so a
  // block of another size never matches the receive (Open MPI would write
  // it in full past the buffer), and the receiver names both sizes; without
  // stamps (device memory) it travels in the sender's fingerprint
  // (Fingerprint::block_bytes), checked before the receive is posted.
  Request* send_exact(int peer, const void* buf, size_t bytes, int unit = -1);
  Request* recv_exact(int peer, void* buf, size_t bytes, int unit = -1);
  // Copy within this rank's memory: memcpy on the host, enqueued on a Device.
  void copy(void* dst, const void* src, size_t bytes);
  // Null for host memory; else where payload lives and work is ordered (device.h).
  Device* device() const { return device_.get(); }
  // A zero-byte message (the barrier's token), counted as a payload message.
  Request* send_token(int peer);
  Request* recv_token(int peer);
  // Block until r is done. `what` describes the wait for the timeout message.
  void wait(Request* r, const char* what, int step = -1, int segment = -1);
  // Polled every 100 ms while a wait blocks (null: never). Returning true
  // fails the collective as interrupted (Ctrl-C: the bindings check Python's
  // signals here), which aborts the link and tells the ring.
  void set_interrupt_check(const std::function<bool()>* check) { interrupt_check_ = check; }
  // Where the running collective is (flight.h).
  const Progress& progress() const { return progress_; }
  // Says what a peer is doing, for timeout messages (in-process worlds can
  // tell; null elsewhere).
  void set_peer_state(std::function<std::string(int)> f) { peer_state_ = std::move(f); }
  // What keeps this rank's point-to-point receives moving while a
  // collective waits (the Engine's: match those still pending; true while
  // one still waits for its message). Called at each slow wait's start and
  // 1, 3, 7, ... ms into it (the gaps doubling up to 100 ms), from
  // poll_control(), and about every 30 us of the window's spin: a receive
  // posted before the collective must take its message during it, or its
  // sender, blocked in a send of the rendezvous size, never reaches the
  // collective (a deadlock; MPI's progress engine moves its posted receives
  // the same way).
  void set_p2p_progress(std::function<bool()> f) { p2p_progress_ = std::move(f); }
  bool progress_p2p() { return p2p_progress_ && p2p_progress_(); }
  // " Rank j: what it is doing." for a timeout message (empty when unknown):
  // peer_report() from the peer itself (in-process worlds), else what the
  // control stream has told about the left neighbour.
  std::string peer_note(int peer);
  std::string peer_report(int peer);
  // Has the interrupt check (set_interrupt_check) fired? For waits outside
  // the transport (the shared-memory window).
  bool interrupt_requested() const { return interrupt_check_ && (*interrupt_check_)(); }
  // Ctrl-C is the reason for the coming (or current) abort.
  bool user_interrupted() const { return user_interrupted_.load(); }
  // What this rank waits for, for the flight recorder (waiting: 1 receive,
  // 2 send, 0: no longer waiting); also for waits outside the transport.
  void publish_wait(int peer, int waiting, const char* what, Clock::time_point since);
  // The ranks of this communicator share a host: their shared-memory window
  // (null: none). Every call is announced in it, and a failure published
  // there as well as told around the ring.
  void attach_window(std::shared_ptr<ShmWindow> w) { window_ = std::move(w); }
  ShmWindow* window() const { return window_.get(); }
  // Ranks of this host with no window between them (transport "ucx", or
  // the window failed): each rank's pid, 0 where not watched (this rank, or
  // a rank of another host or pid namespace). Watched like the window's, as
  // a transport may never notice such a peer gone (UCX's shared memory).
  // Once, before the first collective (death_of reads them from other
  // threads without a lock). Nothing to watch (every pid 0): no table.
  void watch_processes(std::vector<int> pids);
  // "rank P (pid X) died" when `peer` is a watched process of this host
  // (the window's, or watch_processes') that has exited; "" otherwise (any
  // thread).
  std::string death_of(int peer) const;
  // This rank closed its communicator after its call `last_seq`: tell the
  // peers, so that one waiting for it in a later call raises at once, naming
  // it, while one still finishing last_seq goes on (through the window where
  // there is one: nothing is sent; else an LEFT notice to both neighbours,
  // whose failure the ring then hears as any other). Best effort, never throws.
  void leave(uint64_t last_seq) noexcept;
  std::shared_ptr<ShmWindow> shared_window() const { return window_; }
  // Reusable scratch memory owned by the link (slot 0: receive slots, 1: work
  // buffer), in the memory the payload lives in (the Device's, if any).
  char* scratch(int which, size_t bytes);

  // ---- step trace (trace.h); no-ops unless a tracer is set ----
  void set_tracer(Tracer* t) { tracer_ = t; }
  void trace_start(Phase phase, int step, int send_peer, int send_chunk, size_t send_bytes, int recv_peer,
                   int recv_chunk, size_t recv_bytes) {
    progress_.phase.store(int32_t(phase), std::memory_order_relaxed);
    if (tracer_) trace_start_impl(phase, step, send_peer, send_chunk, send_bytes, recv_peer, recv_chunk, recv_bytes);
  }
  // `values`: what this step produced (the chunk just reduced or received).
  void trace_finish(const void* values, size_t bytes) {
    if (tracer_) trace_finish_impl(values, bytes);
  }

  // Per-peer all_to_all: `peer` sends `theirs` bytes where this rank expects
  // `mine` (out_splits): MismatchError naming both, before any byte landed.
  [[noreturn]] void throw_block_sizes(int peer, size_t theirs, size_t mine);

 private:
  struct ControlMsg;
  Request* send_exact_impl(int peer, const void* buf, size_t bytes, int unit, bool exact);
  Request* recv_exact_impl(int peer, void* buf, size_t bytes, int unit, bool exact);
  // The stamp of an exact message of `bytes` (this call's stamp, mixed with the size).
  uint32_t pair_stamp(size_t bytes) const;
  void trace_start_impl(Phase phase, int step, int send_peer, int send_chunk, size_t send_bytes, int recv_peer,
                        int recv_chunk, size_t recv_bytes);
  void trace_finish_impl(const void* values, size_t bytes);
  void post_control_recv(int side);  // side 0: from the left neighbour, 1: from the right
  void take_control(int side);       // a control message arrived on `side`: repost (unless it left), then handle it
  // The control receive of `side`; once that neighbour left (none is posted
  // then), a stand-in that names it, for the texts that name the peer waited for.
  const Request& control_request(int side);
  void handle_control(const ControlMsg& m, int side);  // throws on ABORT
  std::string abort_text(const ControlMsg& m) const;   // what the notice says happened at its origin
  static std::string p2p_abort_text(const ControlMsg& m);      // abort_text's cases (link.cpp)
  static std::string relayed_abort_text(const ControlMsg& m);
  static std::string origin_abort_text(const ControlMsg& m);
  static std::string transport_peer_text(const ControlMsg& m);
  // fail()'s steps, in its order (link.cpp says why each).
  void withdraw_live();
  ControlMsg abort_notice(const RingError& e, const Fingerprint* call) const;
  void publish_failure(const ControlMsg& notice, const RingError& e, const Fingerprint* call);
  void send_abort_notices(const ControlMsg& notice);
  std::shared_ptr<Hold> await_window_writers();
  void send_fingerprints_to_told();
  // Block on reqs until one is done or `deadline`, in slices that poll the
  // interrupt check. Returns wait_any's answer.
  int wait_for(Request* const* reqs, int n, Clock::time_point now, Clock::time_point deadline);
  void throw_if_dead(Request* const* reqs, int n);  // a watched peer's process is gone: RingError(transport)
  // Block on r (null: the control streams alone) and both control streams,
  // until one is done or `deadline` (wait_for). A control message that
  // arrives is handled (a later call's header is kept; an ABORT notice
  // throws) and kControl returned; else 0 (r is done) or wait_for's answer.
  int wait_or_control(Request* r, Clock::time_point now, Clock::time_point deadline);
  bool quick_wait(Request* r);  // wait()'s first polls, without the clock
  void slow_wait(Request* r, const char* what, int step, int segment);

  void counted(const Request& r);  // a payload request completed: progress
  void quarantine(RequestPtr r, bool payload);
  // ---- how a collective fails; each error is built in one place ----
  // A wait ended without r: deadline (throw_timeout), abort or Ctrl-C (throw_aborted).
  [[noreturn]] void throw_wait_failure(int why, const Request& r, const char* what, int step, int segment);
  [[noreturn]] void throw_timeout(const Request& r, const char* what, int step, int segment);
  [[noreturn]] void throw_aborted(const Request& r, bool by_ctrl_c);
  // Called from a handler: a receive that matched another call's message becomes a mismatch.
  [[noreturn]] void rethrow_wait_error(const Request& r, const RingError& e);
  [[noreturn]] void throw_wrong_message(const Request& r, const RingError& e);  // r got another call's message
  // A message from r.peer belongs to another call: name both calls (fingerprints on the check channel).
  [[noreturn]] void throw_foreign_message(const Request& r, const std::string& unnamed);
  // Throws MismatchError; the ABORT notice fail() forwards names the other call when known.
  [[noreturn]] void throw_mismatch(int peer, const Fingerprint* theirs, const std::string& text);
  void check_call(const Fingerprint& theirs, int peer);  // throws MismatchError
  void check_early_header();  // this call's header from the left, if it came on its own already
  void send_control(const ControlMsg& m, int peer);
  // Without stamps, the first message of a collective to/from a peer that
  // is not our right/left neighbour (`exact`: any peer) is preceded by a fingerprint.
  bool first_to(int peer, bool exact = false);
  bool first_from(int peer, bool exact = false);
  Request* recv_fingerprint(int peer, Fingerprint** slot);  // a fingerprint sent on its own (check channel)
  void send_fingerprint(int peer);  // ours, on the check channel, once per call and peer

  std::shared_ptr<Transport> t_;
  std::shared_ptr<Device> device_;  // t_->device(): null for host memory
  Options opts_;
  int rank_, size_;
  Ledger ledger_;
  Fingerprint fp_;
  uint32_t stamp_mask_ = 0;  // the transport's stamp bits; 0: no stamps (device memory, or none carried)
  uint32_t stamp_ = 0;       // this call's stamp
  Coll coll_ = Coll::barrier;
  bool header_checked_ = true;
  bool header_inline_ = false;

  std::vector<RequestPtr> live_;  // payload requests of the current collective
  // peers that got a payload message from us / gave us a fingerprint this
  // call (with stamps: all we sent to; without: those beyond the neighbours)
  std::vector<int> told_, heard_;
  std::vector<int> fp_told_;  // peers our fingerprint went to on the check channel this call (stamps)
  size_t fp_used_ = 0, fp_sent_ = 0;  // fingerprint slots (in, out) used this call
  Fingerprint* fp_slot(std::deque<Fingerprint>& slots, size_t& used);
  std::vector<RequestPtr> fp_sends_;  // our fingerprint to the peers told, after a failure

  // Control streams: one receive always posted from the left neighbour
  // (headers and ABORT notices) and, with more than two ranks, one from the
  // right (ABORT notices travelling the other way round).
  std::shared_ptr<ControlMsg> ctrl_in_[2];
  RequestPtr ctrl_req_[2];  // null once that neighbour left (take_control)
  Request left_side_;       // control_request()'s stand-in
  // Headers of later collectives that arrived early, oldest first (a vector:
  // it holds one or two, and keeps its memory between calls).
  std::vector<ControlMsg> early_headers_;
  uint64_t left_seq_ = 0;  // the newest call whose header came from the left neighbour
  uint64_t left_data_seq_ = 0;  // the newest call a payload message of which came from it (counted())
  std::vector<uint64_t> peer_left_;  // per rank: 0, or 1 + the last call of a neighbour that left (LEFT notice)
  [[noreturn]] void throw_left(int peer, uint64_t left);
  void throw_if_left();  // a neighbour left before this call: it will never join it
  Clock::time_point last_end_{};  // when the last collective drained
  // control messages to the right (kept alive until their send completes),
  // oldest first, and completed ones no one else holds, for reuse
  std::vector<std::pair<std::shared_ptr<ControlMsg>, RequestPtr>> ctrl_out_;
  std::vector<std::shared_ptr<ControlMsg>> ctrl_spare_;

  bool aborted_ = false;
  std::atomic<bool> user_interrupted_{false};  // Ctrl-C, on this thread or via Engine::abort
  std::string abort_reason_;
  std::unique_ptr<ControlMsg> received_abort_;  // the notice that failed us, to forward
  int abort_from_ = -1;  // the neighbour it came from (not told again)

  // Memory the transport may be given (scratch, fingerprints): shared, so a
  // quarantined request can keep it alive after the Link is gone.
  struct Memory {
    std::vector<char> scratch[2];
    std::deque<Fingerprint> fp_in;   // fingerprint messages received this call
    std::deque<Fingerprint> fp_out;  // fingerprint messages sent
  };
  std::shared_ptr<Memory> mem_ = std::make_shared<Memory>();
  std::shared_ptr<Hold> hold_;

  const std::function<bool()>* interrupt_check_ = nullptr;
  std::function<std::string(int)> peer_state_;
  std::function<bool()> p2p_progress_;
  Progress progress_;

  std::shared_ptr<ShmWindow> window_;
  std::vector<int> pids_;  // watch_processes
  Tracer* tracer_ = nullptr;
  TraceStep open_step_;
};

}  // namespace ringcomm
