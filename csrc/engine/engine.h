// Engine: one worker thread per communicator that runs collectives in the
// order they were issued, so every rank executes the same sequence whatever
// its Python threads do. Callers get a Work to wait on (with the GIL
// released by the bindings).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/registry.h"
#include "core/link.h"
#include "core/reducer.h"
#include "engine/p2p.h"

namespace ringcomm {

// Completion state of one collective, shared between caller and worker.
class Work {
 public:
  // Wait up to `timeout_s` (negative: forever). Returns true when complete
  // (successfully or not); check error() afterwards.
  bool wait(double timeout_s);
  bool is_completed();
  // After completion: null on success, else the failure.
  const RingError* error();
  uint64_t seq() const { return seq_; }
  // Device collectives: once complete (on the host: everything is enqueued),
  // the point on the communicator's device after which the result is ready,
  // and that device. Null for host collectives and failed ones.
  EventPtr done_event();
  std::shared_ptr<Device> device() const { return device_; }
  // A failed collective whose requests could not all be withdrawn (or whose
  // peer's write into them stalled): its claim on the caller's arrays
  // (quarantine.h); before it finishes, hold_until_finished's. Null when
  // nothing outlived it.
  std::shared_ptr<Hold> hold();
  // The caller stops waiting before it completes (a Ctrl-C, after the
  // grace): a claim on the caller's arrays, released when it finishes
  // (hold() returns it meanwhile), so the worker never runs on freed ones.
  std::shared_ptr<Hold> hold_until_finished();

 private:
  friend class Engine;
  void finish(std::unique_ptr<RingError> err);
  void reset();  // back to "not complete", for reuse (Engine::enqueue)
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::unique_ptr<RingError> err_;
  uint64_t seq_ = 0;
  EventPtr done_event_;
  std::shared_ptr<Device> device_;
  std::shared_ptr<Hold> hold_;
  std::shared_ptr<Hold> until_finished_;
};

struct Task {
  Coll coll = Coll::barrier;
  const void* in = nullptr;  // see Engine::submit for each collective's buffers
  void* out = nullptr;
  size_t count = 0;          // elements of the full buffer
  DType dtype = DType::f32;
  Op op = Op::sum;
  int root = 0;
  int algo = 0;  // Algo (core/vocabulary.h); Algo::automatic is resolved by choose_algorithm()
  // Per-rank counts (gather, scatter: n of them, the same list on every
  // rank; empty: the split rule) and all_to_all's per-peer splits (`counts`:
  // what this rank sends each peer, `out_counts`: what it receives from
  // each; both empty: equal blocks of count / n).
  std::vector<int64_t> counts, out_counts;
  // Blocks in arrays of their own (torch's gather_list, scatter_list and
  // all_to_all's lists): n addresses each, where the input's blocks are
  // (scatter's root, all_to_all with splits) and where the output's go
  // (gather's root, all_to_all with splits); empty: back to back in in / out.
  std::vector<uintptr_t> in_places, out_places;
  // Device communicators: the collective starts after this point (the
  // caller's stream at the time of the call; device.h). May be null.
  EventPtr after;
  std::shared_ptr<Tracer> tracer;  // filled by submit(): the tracer in force, if any
  Options opts;  // filled by submit(): the options in force when it was issued
  bool abort = false;  // not a collective: abort the communicator (Engine::abort)
  const std::function<bool()>* interrupted = nullptr;  // submit_and_wait on the caller's thread: Ctrl-C check
  bool started = false;  // its flight record already says running (an inline run)
  // Filled by validate(): where the input and output sit in this rank's part
  // of the shared arena (-1: not there); zero copy needs them there.
  int64_t arena_in = -1, arena_out = -1;
};

class Engine {
 public:
  Engine(std::unique_ptr<Transport> transport, Options opts, size_t flight_records = 256);
  ~Engine();  // finishes queued work, then stops the worker

  int rank() const { return link_.rank(); }
  int size() const { return link_.size(); }
  std::string transport_name() { return link_.transport().name(); }
  // Null for host memory; else the device every collective's payload lives on.
  std::shared_ptr<Device> device() { return link_.transport().device(); }

  // Buffers per collective (`count` is always the full buffer's length):
  //   all_reduce     in: count elements, out: count elements (may be in)
  //   reduce_scatter in: count elements, out: this rank's chunk
  //   all_gather     in: this rank's chunk, out: count elements
  //   broadcast      out: count elements (in is ignored)
  //   barrier        none
  //   reduce         in: count elements; out: count elements on the root (may be in; ignored elsewhere)
  //   gather         in: this rank's block; out: count elements on the root (ignored elsewhere), or
  //                  out_places (one address per rank's block; out ignored)
  //   scatter        in: count elements on the root (ignored elsewhere), or in_places; out: this
  //                  rank's block
  //   all_to_all     in: count elements (the sum of counts); out: as many (the sum of out_counts);
  //                  with splits, either may be given as places instead
  // Checks what can be checked locally (dtype, op, root) and throws
  // RingError(invalid) before anything is queued; throws RingError(aborted)
  // at once on an aborted communicator.
  std::shared_ptr<Work> submit(const Task& t);
  // Same, then wait for completion. When nothing is queued or running, the
  // collective runs right here on the caller's thread: a small synchronous
  // collective then costs no thread handoff (order is unchanged: it is the
  // only one in flight). `interrupted` (may be null) is polled every 100 ms
  // while it waits; when it returns true the collective fails, the
  // communicator is aborted and the ring told (Ctrl-C).
  std::shared_ptr<Work> submit_and_wait(const Task& t, const std::function<bool()>* interrupted = nullptr);
  // Wait for `w` like Work::wait, polling `interrupted` every 100 ms; on
  // true, abort the communicator, wait (bounded) for `w` to end, and return
  // false. Returns true once `w` is complete.
  bool wait_interruptible(Work& w, double timeout_s, const std::function<bool()>& interrupted, bool* fired);

  // Abort on purpose (after the collectives already queued): the ring is told,
  // so peers waiting on this rank fail at once instead of at their deadline.
  // `by_interrupt`: a user interrupt (Ctrl-C) is the reason; the ring is told so.
  std::shared_ptr<Work> abort(bool by_interrupt = false);
  // The engine between hosts, stopped by a failure on its host (failed() of
  // the hierarchical communicator above): abort(), its ABORT notice telling
  // the other hosts which rank of that communicator the failure was about
  // (`about`, its number there; `died`: its process is gone or unreachable),
  // so that their ranks name it too (between_hosts).
  std::shared_ptr<Work> abort_for(int about, bool died);
  bool aborted();
  std::string abort_reason();
  // A collective is running inline on the calling thread (submit_and_wait), e.g.
  // a signal handler called from its interrupt check is calling back in:
  // waiting for queued work here would wait for ourselves.
  bool running_here() const;
  // Device communicators: has a peer failed since the last collective? Reads
  // the control stream when no collective is running (one that is running
  // sees failures itself) and, on an ABORT notice, fails the link (which
  // ends device work stuck waiting on that peer). Returns the failure, or
  // null. Thread-safe.
  std::unique_ptr<RingError> check_peers();
  Ledger& ledger() { return link_.ledger(); }
  // "rank P (pid X) died" when `peer` is a process of this host's window,
  // or one watch_processes gave, that has exited, else "" (any thread:
  // point-to-point's waits ask).
  std::string death_of(int peer) const { return link_.death_of(peer); }
  // Each rank's host, by name (ranks on several hosts: shm/window.py's
  // attach): a failure's text names the hosts of the ranks it is about
  // (name_hosts). Once, before the first collective.
  void set_hosts(std::vector<std::string> hosts) { hosts_ = std::move(hosts); }
  // Link::watch_processes: this host's ranks' pids where no window watches them.
  void watch_processes(std::vector<int> pids) { link_.watch_processes(std::move(pids)); }
  // ---- point-to-point (p2p.h): beside the queue, on the callers' threads ----
  std::shared_ptr<Transport> shared_transport() const { return link_.shared_transport(); }
  FlightRecorder& recorder() { return recorder_; }
  P2PPending& p2p_pending() { return p2p_pending_; }
  uint64_t next_p2p_id() { return next_p2p_id_.fetch_add(1, std::memory_order_relaxed) + 1; }
  // A p2p op failed (not for bad arguments): the communicator is aborted and
  // the ring told, as after a failed collective, naming that op (`call`: its
  // fingerprint, coll send or recv, root = the peer, algo = the tag) and
  // e's kind and peer, not the link's last collective. `by_interrupt`: Ctrl-C
  // (Engine::abort). Thread-safe.
  void fail_p2p(const RingError& e, const Fingerprint& call, bool by_interrupt = false);
  // algorithm="auto" for all_reduce on host memory: recursive doubling up to
  // rd_max bytes, halving-doubling up to hd_max, the ring above (the cost
  // model's crossovers for this communicator: ringcomm/tuning/selection.py).
  // Device communicators always run the ring.
  // reduce: the binomial tree up to reduce_max bytes, the ring reduce-scatter
  // + gather above.
  void set_auto_limits(size_t rd_max, size_t hd_max, size_t reduce_max) {
    auto_rd_max_.store(rd_max);
    auto_hd_max_.store(hd_max);
    auto_reduce_max_.store(reduce_max);
  }
  // The ranks share a host: the shared-memory window the shm algorithms run
  // in (algorithms/shm_*.cpp). `for_auto`: algorithm="auto" runs the
  // collectives there, up to set_shm_auto's limits (the one-sync
  // all_reduce up to flat_max bytes). Before the first collective.
  void attach_window(std::shared_ptr<ShmWindow> w, bool for_auto, size_t flat_max) {
    link_.attach_window(std::move(w));
    shm_auto_.store(for_auto);
    auto_flat_max_.store(flat_max);
  }
  // `shm_max`: per collective (all_reduce, reduce_scatter, all_gather,
  // broadcast, reduce, gather, scatter, all_to_all: `count` elements, the
  // whole buffer), the largest buffer auto runs in the window; above it the
  // message path's choice (on a machine where Open MPI's single-copy
  // point-to-point outruns the staged copies), up to `shm_from` (same
  // order; none given: SIZE_MAX), from which the window runs again (where
  // the message path's per-message costs grow with the size faster than
  // the window's copies). Barrier: always the window.
  void set_shm_auto(bool for_auto, size_t flat_max, const std::vector<size_t>& shm_max = {},
                    const std::vector<size_t>& shm_from = {}) {
    shm_auto_.store(for_auto);
    auto_flat_max_.store(flat_max);
    static const Coll order[] = {Coll::all_reduce, Coll::reduce_scatter, Coll::all_gather, Coll::broadcast,
                                 Coll::reduce,     Coll::gather,         Coll::scatter,    Coll::all_to_all};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; ++i) {
      shm_max_[int(order[i])].store(i < shm_max.size() ? shm_max[i] : SIZE_MAX);
      shm_from_[int(order[i])].store(i < shm_from.size() ? shm_from[i] : SIZE_MAX);
    }
  }
  // Ranks on several hosts: `local` is this host's ranks' window (its
  // members: their ranks here), `cross` an engine over the ranks with this
  // rank's local index, one per host (cross_members: their ranks here);
  // `layout` every host's ranks (algorithms.h). algorithm="auto" runs
  // all_reduce hierarchically, and reduce_scatter and all_gather where the
  // layout allows (HostLayout::ordered); the rest over the link.
  void attach_hierarchy(std::shared_ptr<ShmWindow> local, std::shared_ptr<Engine> cross,
                        std::vector<int> cross_members, HostLayout layout) {
    link_.attach_window(std::move(local));
    cross_ = std::move(cross);
    // The step between hosts waits in cross_'s link: it moves this
    // communicator's pending p2p receives too (Link::set_p2p_progress).
    cross_->link_.set_p2p_progress([this] { return link_.progress_p2p(); });
    cross_members_ = std::move(cross_members);
    layout_ = std::move(layout);
    hier_halves_ = layout_.ordered();
  }
  bool hierarchical() const { return cross_ != nullptr; }
  // Algo the inter-host engine ran last (-1: none).
  int cross_last_algo() const { return cross_ ? cross_->last_algo() : -1; }
  // The inter-host engine's ledger, by this communicator's ranks (empty: none).
  std::vector<Counters> cross_traffic();
  bool has_window() const { return link_.window() != nullptr; }
  std::shared_ptr<ShmWindow> window() const { return link_.shared_window(); }
  bool shm_auto() const { return shm_auto_.load(); }
  size_t shm_flat_max() const { return auto_flat_max_.load(); }
  // Algo of the collective submitted last (what "auto" chose).
  int last_algo() const { return last_algo_.load(std::memory_order_relaxed); }
  // Takes effect for collectives submitted afterwards.
  void set_segment_bytes(size_t bytes);
  void set_timeout(double seconds);
  Options options();
  // Record a step trace of the collectives submitted from now on (null: stop).
  void set_tracer(std::shared_ptr<Tracer> t);
  // The last K collectives (flight.h), oldest first.
  std::vector<FlightRecord> flight_record() { return recorder_.snapshot(link_.progress()); }
  // One line about what this rank is doing (for a peer's timeout message).
  std::string flight_summary() { return recorder_.summary(link_.progress()); }
  void set_flight_records(size_t k) { recorder_.set_capacity(k); }
  // In-process worlds: how to ask another rank of the world for its flight_summary().
  void set_peer_state(std::function<std::string(int)> f) { link_.set_peer_state(std::move(f)); }

 private:
  void loop();
  std::shared_ptr<Work> enqueue(Task& t, bool inline_if_idle, bool* run_here);
  void execute(const Task& t, Work& w);  // perform() and record the outcome (Work, flight record, abort state)
  void aborted_by(const RingError& why);                       // execute(): the abort task ran
  std::shared_ptr<Hold> failed(RingError& err, uint64_t seq);  // execute(): a collective failed
  void keep_arrays(Work& w, const std::shared_ptr<Hold>& stalled);  // execute(): a failed one's claim on its arrays
  void perform(const Task& t, Work& w);  // the collective itself: its row's header, run, finalize, drain
  void perform_abort();                  // perform() of the abort task
  Fingerprint fingerprint(const Task& t, uint64_t seq) const;
  void begin_call(const Task& t, const AlgoRow& row, const Fingerprint& fp);  // the header, as the row's path sends it
  // Throws RingError(invalid) for what can be checked locally, or (aborted)
  // on an aborted communicator; fills t.algo (choose_algorithm).
  void validate(Task& t);
  void check_counts(const Task& t) const;  // per-rank counts: one per rank, summing to their buffer
  void check_places(const Task& t) const;  // blocks in arrays of their own: where a call cuts blocks
  Across between_hosts(const Task& t, uint64_t seq);  // the hierarchical collectives' inter-host step
  class CrossStep;                                    // one such step in flight
  void raise_between_hosts(Work& done, uint64_t seq);  // its failure, in this communicator's ranks
  // Can the call run zero copy (its arrays in the shared arena)? Fills t.arena_in / arena_out.
  bool locate_in_arena(Task& t) const;
  // The algorithm the call runs: t.algo when the table has its row for this
  // collective (algorithms/registry.h) and the row's path and needs are met
  // on this communicator (else RingError(invalid), saying where it runs);
  // for Algo::automatic, auto_algorithm().
  Algo choose_algorithm(const Task& t) const;
  void check_path(const Task& t, Algo a) const;           // the algorithm's path on this communicator
  void check_needs(const Task& t, const AlgoRow& row) const;  // the row's needs for this call
  std::string absent_text(const Task& t, Algo a) const;   // the error of an algorithm without a row here
  std::string zero_copy_text() const;
  // The auto policy: by size against the limits of set_auto_limits() and
  // set_shm_auto(), alike on every rank. window_auto: may auto run the
  // window; message_auto: the choice outside it (`tuned`: host, several ranks).
  Algo auto_algorithm(const Task& t) const;
  bool window_auto(const Task& t, size_t bytes) const;
  Algo message_auto(const Task& t, bool tuned, size_t bytes) const;
  bool shm_runs(const Task& t) const;  // can the window run this call (algorithm "shm")?
  // The communicator is aborted (the first failure's reason stays). Thread-safe.
  void record_abort(const std::string& reason, int origin, ErrKind cause);
  // " (rank 4 is on host2)": the hosts of the ranks `e` is about (its
  // origin, the peer it waited for or lost), appended to its text; once,
  // and only where set_hosts gave them. The one place hosts are named.
  void name_hosts(RingError& e) const;
  const Reducer& reducer(DType dtype, Op op);  // the worker's (or inline caller's) only
  std::unique_ptr<Reducer> reducers_[size_t(DType::kCount) * size_t(Op::kCount)];

  Link link_;
  FlightRecorder recorder_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<Task, std::shared_ptr<Work>>> queue_;
  std::shared_ptr<Work> spare_work_;  // the Work of the last call run on its caller's thread (reused)
  bool stop_ = false;
  bool busy_ = false;  // a collective is executing (on the worker or a caller)
  uint64_t next_seq_ = 0;
  std::mutex state_m_;  // guards the abort flag as seen by submit()
  bool aborted_ = false;
  std::string abort_reason_;
  int abort_origin_ = -1;
  ErrKind abort_cause_ = ErrKind::aborted;
  // The failed p2p op the next abort tells the ring about (fail_p2p); under state_m_.
  struct P2PFailure {
    RingError error;
    Fingerprint call;
  };
  std::unique_ptr<P2PFailure> p2p_failure_;
  int abort_about_ = -1;  // abort_for()'s rank, for the abort task; under state_m_
  bool abort_about_died_ = false;
  std::vector<std::string> hosts_;  // set_hosts
  Options opts_;  // guarded by m_; copied into each task
  std::shared_ptr<Tracer> tracer_;  // guarded by m_; copied into each task
  std::atomic<size_t> auto_rd_max_{0}, auto_hd_max_{0}, auto_reduce_max_{0}, auto_flat_max_{0};
  std::atomic<bool> shm_auto_{false};
  std::atomic<size_t> shm_max_[int(Coll::kCount)];   // by collective; set by set_shm_auto (all: SIZE_MAX)
  std::atomic<size_t> shm_from_[int(Coll::kCount)];  // the same (all: SIZE_MAX)
  std::shared_ptr<Engine> cross_;  // hierarchical: the inter-host engine
  std::vector<int> cross_members_;
  HostLayout layout_;
  bool hier_halves_ = false;  // hierarchical reduce_scatter / all_gather run on this layout
  std::atomic<int> last_algo_{0};
  std::atomic<uint64_t> next_p2p_id_{0};
  P2PPending p2p_pending_;
  std::atomic<std::thread::id> inline_thread_{};  // the thread running a collective inline, if any
  std::thread worker_;
};

}  // namespace ringcomm
