#include "engine/engine.h"

#include <algorithm>

#include "algorithms/algorithms.h"

namespace ringcomm {

bool Work::wait(double timeout_s) {
  std::unique_lock<std::mutex> lk(m_);
  if (timeout_s < 0) {
    cv_.wait(lk, [&] { return done_; });
    return true;
  }
  return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return done_; });
}

bool Work::is_completed() {
  std::lock_guard<std::mutex> g(m_);
  return done_;
}

const RingError* Work::error() {
  std::lock_guard<std::mutex> g(m_);
  return err_.get();
}

EventPtr Work::done_event() {
  std::lock_guard<std::mutex> g(m_);
  return done_event_;
}

std::shared_ptr<Hold> Work::hold() {
  std::lock_guard<std::mutex> g(m_);
  return hold_ ? hold_ : until_finished_;
}

std::shared_ptr<Hold> Work::hold_until_finished() {
  std::lock_guard<std::mutex> g(m_);
  if (done_) return hold_;
  if (!until_finished_) {
    until_finished_ = std::make_shared<Hold>();
    until_finished_->pending.fetch_add(1);
  }
  return until_finished_;
}

void Work::reset() {
  std::lock_guard<std::mutex> g(m_);
  done_ = false;
  err_.reset();
  seq_ = 0;
  done_event_.reset();
  device_.reset();
  hold_.reset();
  until_finished_.reset();
}

void Work::finish(std::unique_ptr<RingError> err) {
  std::lock_guard<std::mutex> g(m_);
  err_ = std::move(err);
  done_ = true;
  if (until_finished_) {
    // The caller left early (its Python error took this claim): its arrays
    // may go now, unless the failure left something that may still use
    // them (hold_): then they are kept for good (rare: a Ctrl-C's collective
    // still running after the grace, and failing with a request in flight).
    if (!hold_ || hold_->pending.load() == 0) until_finished_->pending.fetch_sub(1);
    until_finished_.reset();
  }
  cv_.notify_all();
}

Engine::Engine(std::unique_ptr<Transport> transport, Options opts, size_t flight_records)
    : link_(std::move(transport), opts), recorder_(flight_records), opts_(opts), worker_([this] { loop(); }) {
  for (auto& m : shm_max_) m.store(SIZE_MAX);  // (read only by choose_algorithm, on callers' threads)
  for (auto& m : shm_from_) m.store(SIZE_MAX);
  // (A transport error while matching, an MPI failure, fails the collective
  // that waits, which aborts the communicator as any transport failure does.)
  link_.set_p2p_progress([this] {
    if (!p2p_pending_.waiting()) return false;
    p2p_pending_.match(link_.transport());
    return p2p_pending_.waiting();
  });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  // Peers still waiting in a call this rank will never join raise at once,
  // naming it, instead of at their deadline (a rank that returns early
  // stays alive in MPI_Finalize, where no liveness check sees it).
  link_.leave(next_seq_);
  link_.set_p2p_progress(nullptr);  // (p2p_pending_ goes before link_)
  if (cross_) cross_->link_.set_p2p_progress(nullptr);  // (cross_ may outlive this engine)
  // Device work of finished collectives may still be queued (Works can hold
  // the device past this point): let it end before the caller frees buffers,
  // but never wait forever on a peer that is gone.
  if (auto dev = device()) {
    try {
      dev->record()->synchronize(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(opts_.timeout_s)));
    } catch (const std::exception&) {
    }
  }
}

void Engine::validate(Task& t) {
  if (int(t.coll) < 0 || t.coll >= Coll::kCount) throw_invalid("unknown collective code");
  if (coll_is_p2p(t.coll)) throw_invalid("send and recv are not queued collectives: use Engine::p2p_send/p2p_recv");
  if (coll_reduces(t.coll)) check_reducer(t.dtype, t.op);
  else dtype_size(t.dtype);
  if (coll_reduces(t.coll) && t.op == Op::avg && !coll_takes_avg(t.coll))
    throw_invalid(std::string("op 'avg' is not defined for ") + coll_name(t.coll) + " (use 'sum' and divide)");
  locate_in_arena(t);
  t.algo = int(choose_algorithm(t));
  last_algo_.store(t.algo, std::memory_order_relaxed);
  if (coll_has_root(t.coll) && (t.root < 0 || t.root >= size()))
    throw_invalid(std::string(coll_name(t.coll)) + " root " + std::to_string(t.root) + " is out of range for " +
                  std::to_string(size()) + " ranks (expected 0 <= root < " + std::to_string(size()) + ")");
  if (!t.counts.empty() || !t.out_counts.empty()) check_counts(t);
  else if (t.coll == Coll::all_to_all && t.count % size_t(size()))
    throw_invalid("all_to_all of " + std::to_string(t.count) + " elements over " + std::to_string(size()) +
                  " ranks: equal blocks need a count divisible by the number of ranks (else pass splits)");
  check_places(t);
  std::lock_guard<std::mutex> g(state_m_);
  if (aborted_) {
    RingError e(ErrKind::aborted, rank(), -1, 0, "communicator was aborted earlier: " + abort_reason_);
    e.origin = abort_origin_;
    e.cause = abort_cause_;
    throw e;
  }
}

// Places of blocks (Task::in_places, out_places): one per rank, where blocks
// are cut: the root's side of gather and scatter, all_to_all with splits.
void Engine::check_places(const Task& t) const {
  const bool a2a = t.coll == Coll::all_to_all && !t.counts.empty(), at_root = t.root == rank();
  auto check = [&](const std::vector<uintptr_t>& p, bool allowed, const char* what) {
    if (p.empty()) return;
    if (!allowed)
      throw_invalid(std::string(coll_name(t.coll)) + ": places of the " + what +
                    "'s blocks are for the root of gather (output) and scatter (input) and for all_to_all with "
                    "splits");
    if (p.size() != size_t(size()))
      throw_invalid(std::string(coll_name(t.coll)) + ": " + std::to_string(p.size()) + " places of the " + what +
                    "'s blocks, expected one per rank (" + std::to_string(size()) + ")");
  };
  check(t.in_places, a2a || (t.coll == Coll::scatter && at_root), "input");
  check(t.out_places, a2a || (t.coll == Coll::gather && at_root), "output");
}

// Per-rank counts: n of them, none negative, summing to the buffer they cut.
void Engine::check_counts(const Task& t) const {
  auto check = [&](const std::vector<int64_t>& c, const char* what, size_t total) {
    if (c.size() != size_t(size()))
      throw_invalid(std::string(coll_name(t.coll)) + " " + what + " has " + std::to_string(c.size()) +
                    " entries, expected one per rank (" + std::to_string(size()) + ")");
    size_t sum = 0;
    for (int64_t x : c) {
      if (x < 0) throw_invalid(std::string(coll_name(t.coll)) + " " + what + " has a negative entry");
      sum += size_t(x);
      if (size_t(x) > kMaxElements || sum > kMaxElements)  // (checked as it grows: it never wraps)
        throw_invalid(std::string(coll_name(t.coll)) + " " + what + " sum to more elements than any array holds");
    }
    if (sum != total)
      throw_invalid(std::string(coll_name(t.coll)) + " " + what + " sum to " + std::to_string(sum) + ", expected " +
                    std::to_string(total));
  };
  if (t.coll == Coll::gather || t.coll == Coll::scatter) {
    if (!t.out_counts.empty()) throw_invalid(std::string(coll_name(t.coll)) + " takes one count list");
    check(t.counts, "counts", t.count);
  } else if (t.coll == Coll::all_to_all) {
    check(t.counts, "splits", t.count);
    size_t out_total = 0;
    for (int64_t x : t.out_counts) out_total += size_t(x < 0 ? 0 : x);
    check(t.out_counts, "out_splits", out_total);
  } else {
    throw_invalid(std::string(coll_name(t.coll)) + " takes no per-rank counts");
  }
}

bool Engine::locate_in_arena(Task& t) const {
  t.arena_in = t.arena_out = -1;
  ShmWindow* w = link_.window();
  if (!w || !w->has_arena() || link_.device()) return false;
  const size_t es = dtype_size(t.dtype);
  const size_t mine = split_size(t.count, size_t(size()), size_t(rank())) * es, all = t.count * es;
  switch (t.coll) {
    case Coll::all_reduce:  // the output too (peers copy the reduced chunks from it)
      t.arena_in = w->arena_offset(t.in, all);
      t.arena_out = t.out == t.in ? t.arena_in : w->arena_offset(t.out, all);
      if (t.arena_in < 0 || t.arena_out < 0) t.arena_in = t.arena_out = -1;
      break;
    case Coll::reduce_scatter: t.arena_in = w->arena_offset(t.in, all); break;
    case Coll::all_gather: t.arena_in = w->arena_offset(t.in, mine); break;
    default: break;
  }
  return t.arena_in >= 0;
}

// The window runs every collective; all_to_all with per-peer splits where a
// slot holds its table and a part per rank (shm_all_to_all_v_fits).
bool Engine::shm_runs(const Task& t) const {
  return t.coll != Coll::all_to_all || t.counts.empty() || (link_.window() && shm_all_to_all_v_fits(*link_.window()));
}

// algorithm="auto": every rank resolves the same way, from the call's size
// and limits all ranks were given alike (a disagreement is still caught:
// the resolved algorithm is part of the fingerprint). Across hosts where the
// layout allows; the arena's arrays zero copy (the caller asked for it:
// comm.empty); the window up to its limits; else the message path's choice.
Algo Engine::auto_algorithm(const Task& t) const {
  const size_t bytes = t.count * dtype_size(t.dtype);
  if (link_.device() || size() == 1) return message_auto(t, false, bytes);
  const AlgoRow* hier = find_algorithm(t.coll, Algo::hierarchical);
  if (cross_ && hier && (hier_halves_ || !(hier->needs & kNeedOrderedHosts))) return Algo::hierarchical;
  if (t.arena_in >= 0) return Algo::zero_copy;
  if (window_auto(t, bytes)) {
    const bool flat = find_algorithm(t.coll, Algo::shm_flat) != nullptr;
    return flat && bytes <= auto_flat_max_.load(std::memory_order_relaxed) ? Algo::shm_flat : Algo::shm;
  }
  return message_auto(t, true, bytes);
}

// Auto runs the window where it may (set_shm_auto's limits: at most shm_max
// bytes, or at least shm_from), for barrier always, and for all_to_all's
// per-peer splits at every size: each rank's own total is unknown to the
// others, and all must choose alike.
bool Engine::window_auto(const Task& t, size_t bytes) const {
  if (!link_.window() || !shm_auto_.load(std::memory_order_relaxed) || !find_algorithm(t.coll, Algo::shm) ||
      !shm_runs(t))
    return false;  // (a collective without a window row runs on the message path there too)
  const bool per_peer = t.coll == Coll::all_to_all && !t.counts.empty();
  return t.coll == Coll::barrier || per_peer || bytes <= shm_max_[int(t.coll)].load(std::memory_order_relaxed) ||
         bytes >= shm_from_[int(t.coll)].load(std::memory_order_relaxed);
}

// The message path: a device communicator runs the ring (`ringcomm tune`
// measures host transports only, so nothing says another algorithm is
// faster on a GPU; they run there when asked for), and the rooted and
// personalized collectives their own. `tuned`: host memory, several ranks.
Algo Engine::message_auto(const Task& t, bool tuned, size_t bytes) const {
  switch (t.coll) {
    case Coll::gather:
    case Coll::scatter: return Algo::linear;
    case Coll::all_to_all: return Algo::pairwise;
    case Coll::reduce:
      return !link_.device() && bytes <= auto_reduce_max_.load(std::memory_order_relaxed) ? Algo::binomial
                                                                                           : Algo::ring;
    case Coll::all_reduce:
      if (tuned && bytes <= auto_rd_max_.load(std::memory_order_relaxed)) return Algo::recursive_doubling;
      if (tuned && bytes <= auto_hd_max_.load(std::memory_order_relaxed)) return Algo::halving_doubling;
      return Algo::ring;
    default: break;
  }
  // The rest by the table: its first auto row on the message path whose limit this buffer fits.
  size_t n = 0;
  const AlgoRow* rows = algorithm_rows(&n);
  for (size_t i = 0; i < n; ++i)
    if (rows[i].coll == t.coll && rows[i].path == AlgoPath::messages && rows[i].auto_ok && bytes <= rows[i].auto_max)
      return rows[i].algo;
  return Algo::ring;  // (no such row: choose_algorithm's check names what runs)
}

Algo Engine::choose_algorithm(const Task& t) const {
  const Algo a = Algo(t.algo);
  if (a == Algo::automatic) return auto_algorithm(t);
  if (int(a) < 0 || a >= Algo::kCount) throw_invalid("unknown algorithm code " + std::to_string(t.algo));
  check_path(t, a);
  const AlgoRow* row = find_algorithm(t.coll, a);
  if (!row) throw_invalid(absent_text(t, a));
  check_needs(t, *row);
  return a;
}

// What the algorithm's path needs of the communicator, before whether it
// runs this collective (the first thing its error says).
void Engine::check_path(const Task& t, Algo a) const {
  const AlgoPath path = algorithm_path(a);
  if (path == AlgoPath::hosts && !cross_) throw_invalid(absent_text(t, a));
  if (path == AlgoPath::window && cross_)
    throw_invalid("algorithm '" + std::string(algo_name(a)) +
                  "' runs on ranks of one host; this communicator's span several (its window holds this host's)");
}

// Why `a` does not run this collective, or this communicator (cross_ unset): the error says where it does.
std::string Engine::absent_text(const Task& t, Algo a) const {
  const std::string name = algo_name(a);
  switch (a) {
    case Algo::hierarchical:
      return "algorithm 'hierarchical' runs all_reduce, reduce_scatter and all_gather on ranks of several "
             "hosts that share memory within each host" +
             std::string(cross_ ? "" : "; this communicator has no such hierarchy");
    case Algo::zero_copy: return zero_copy_text();
    case Algo::shm_flat: return "algorithm 'shm_flat' runs all_reduce and reduce only";
    default: break;
  }
  // From the table: the algorithms this collective runs (when `a` runs other
  // collectives too, or this one has its own few), else where `a` exists.
  auto joined = [](const std::string& list) {
    std::string s = list;
    const size_t last = s.rfind(", ");
    if (last != std::string::npos) s.replace(last, 2, " and ");
    return s;
  };
  std::string runs, where;
  for (int b = 0; b < int(Algo::kCount); ++b)
    if (find_algorithm(t.coll, Algo(b))) runs += std::string(runs.empty() ? "" : ", ") + algo_name(Algo(b));
  for (int c = 0; c < int(Coll::kCount); ++c)
    if (find_algorithm(Coll(c), a)) where += std::string(where.empty() ? "" : ", ") + coll_name(Coll(c));
  if (!find_algorithm(t.coll, Algo::ring) || where.find(',') != std::string::npos || where.empty())
    return "algorithm '" + name + "' does not run " + coll_name(t.coll) + " (" + coll_name(t.coll) + ": " +
           (runs.empty() ? std::string("none") : runs) + ")";
  return "algorithm '" + name + "' exists for " + joined(where) + " only";
}

std::string Engine::zero_copy_text() const {
  return std::string("algorithm 'zero_copy' runs all_reduce, reduce_scatter and all_gather on arrays in "
                     "the shared arena (comm.empty(); all_reduce: its output too), ") +
         (link_.window() && link_.window()->has_arena() ? "and this call's are not there"
                                                         : "and this communicator has none");
}

// A row's needs, in the order the errors name them; then the window of a
// window path. (No std::string unless one fails: this runs on every call.)
void Engine::check_needs(const Task& t, const AlgoRow& row) const {
  const uint32_t needs = row.needs;
  if ((needs & kNeedOrderedHosts) && !hier_halves_)
    throw_invalid("algorithm 'hierarchical' runs " + std::string(coll_name(t.coll)) +
                  " where every local index's ranks grow from host to host (hosts in the order of their first "
                  "rank); this communicator's ranks are placed otherwise (all_reduce runs on any placement)");
  if ((needs & kNeedArena) && t.arena_in < 0) throw_invalid(zero_copy_text());
  if ((needs & kNeedSlotTable) && !shm_runs(t))
    throw_invalid("algorithm 'shm' runs every collective, all_to_all with per-peer splits where a slot holds a "
                  "table of 24 bytes per rank (in whole cache lines) and 64 bytes per rank beside it "
                  "(RINGCOMM_SHM_SLOT)");
  if (row.path == AlgoPath::window && !(needs & kNeedArena) && !link_.window())
    throw_invalid("algorithm '" + std::string(algo_name(row.algo)) +
                  "' needs ranks that share a host (a shared-memory window); this communicator has none "
                  "(RINGCOMM_TRANSPORT=mpi, ranks on several hosts, or payload on a device)");
  if ((needs & kNeedPow2) && (size() & (size() - 1)) != 0)
    throw_invalid("algorithm '" + std::string(algo_name(row.algo)) + "' runs " + coll_name(t.coll) +
                  " on a power-of-two number of ranks only (this communicator has " + std::to_string(size()) +
                  "): its blocks are the split rule's chunks only then; all_reduce folds any number");
}

void Engine::fail_p2p(const RingError& e, const Fingerprint& call, bool by_interrupt) {
  const bool first = !aborted();
  if (first) {  // the abort below tells the ring of this op (execute), not of the link's last collective
    std::lock_guard<std::mutex> g(state_m_);
    if (!p2p_failure_) p2p_failure_ = std::make_unique<P2PFailure>(P2PFailure{e, call});
  }
  record_abort(e.what(), e.origin >= 0 ? e.origin : rank(), e.cause);
  if (first) abort(by_interrupt);  // wakes waits (collective and p2p), then fails the link on the worker
}

void Engine::record_abort(const std::string& reason, int origin, ErrKind cause) {
  std::lock_guard<std::mutex> g(state_m_);
  if (aborted_) return;  // the first failure is the reason
  aborted_ = true;
  abort_reason_ = reason;
  abort_origin_ = origin;
  abort_cause_ = cause;
}

std::shared_ptr<Work> Engine::enqueue(Task& t, bool inline_if_idle, bool* run_here) {
  std::lock_guard<std::mutex> g(m_);
  t.opts = opts_;  // the settings as of this call's issue (set_* take the same lock)
  t.tracer = tracer_;
  const bool here = inline_if_idle && queue_.empty() && !busy_;
  std::shared_ptr<Work> w;
  if (here && spare_work_.use_count() == 1) {
    // The last call run here is over and its caller let go of it: reuse it
    // (no allocation on the small path). Only this engine can hand it out.
    w = spare_work_;
    w->reset();
  } else {
    w = std::make_shared<Work>();
    if (here) spare_work_ = w;
  }
  w->seq_ = t.abort ? 0 : ++next_seq_;
  if (!t.abort && recorder_.capacity()) {
    FlightRecord r;
    r.seq = w->seq_;
    r.coll = int32_t(t.coll);
    r.count = int64_t(t.count);
    r.dtype = int32_t(t.dtype);
    r.op = int32_t(t.op);
    r.root = t.root;
    r.algo = t.algo;
    r.t_issue_ns = wall_ns();
    if (here) {  // runs right now on the caller's thread: issued and started in one record
      r.state = FlightState::running;
      r.t_start_ns = r.t_issue_ns;
    }
    recorder_.issued(r);
  }
  if (here) {
    busy_ = true;
    *run_here = true;
  } else {
    queue_.emplace_back(t, w);
    cv_.notify_one();
  }
  return w;
}

std::shared_ptr<Work> Engine::submit(const Task& t) {
  Task task = t;
  validate(task);
  bool run_here = false;
  return enqueue(task, false, &run_here);
}

std::shared_ptr<Work> Engine::submit_and_wait(const Task& t, const std::function<bool()>* interrupted) {
  Task task = t;  // (interrupted is set below only when it runs here: a queued task runs on the worker)
  validate(task);
  bool run_here = false;
  auto w = enqueue(task, true, &run_here);
  if (run_here) {
    task.interrupted = interrupted;
    task.started = true;  // recorded as running by enqueue()
    inline_thread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    execute(task, *w);
    inline_thread_.store(std::thread::id(), std::memory_order_relaxed);
    bool handed_work;
    {
      std::lock_guard<std::mutex> g(m_);
      busy_ = false;
      handed_work = !queue_.empty() || stop_;
    }
    if (handed_work) cv_.notify_all();  // only then: waking the worker costs a context switch
    return w;  // (execute() has finished it)
  } else if (interrupted) {
    bool fired = false;
    wait_interruptible(*w, -1, *interrupted, &fired);
    return w;
  }
  w->wait(-1);
  return w;
}

bool Engine::wait_interruptible(Work& w, double timeout_s, const std::function<bool()>& interrupted, bool* fired) {
  const auto start = Clock::now();
  for (;;) {
    double slice = 0.1;
    if (timeout_s >= 0) {
      const double left = timeout_s - std::chrono::duration<double>(Clock::now() - start).count();
      if (left <= 0) return w.is_completed();
      slice = std::min(slice, left);
    }
    if (w.wait(slice)) return true;
    if (interrupted()) {
      *fired = true;
      abort(true);  // the waiting collective fails at once and tells the ring
      if (!w.wait(std::min(opts_.timeout_s, 5.0))) w.hold_until_finished();  // still running: keep the arrays
      return false;
    }
  }
}

// The hierarchical collectives' step between hosts: `coll` on the engine
// between hosts, its failure re-raised with this communicator's ranks.
namespace {

Task across_task(const Task& t, Coll coll, const char* in, char* out, size_t count) {
  Task across;
  across.coll = coll;
  across.in = in;
  across.out = out;
  across.count = count;
  across.dtype = t.dtype;
  across.op = t.op == Op::avg ? Op::sum : t.op;  // avg divides once, by every rank, after
  across.algo = int(Algo::automatic);
  return across;
}

}  // namespace

// A step started on the engine between hosts (Across::start).
class Engine::CrossStep : public AcrossStep {
 public:
  CrossStep(Engine& e, std::shared_ptr<Work> w, const Task& t, uint64_t seq) : e_(e), w_(std::move(w)), t_(t), seq_(seq) {}
  void wait() override {
    waited_ = true;
    bool fired = false;
    if (t_.interrupted) e_.cross_->wait_interruptible(*w_, -1, *t_.interrupted, &fired);
    else w_->wait(-1);
    e_.raise_between_hosts(*w_, seq_);
  }
  ~CrossStep() override {
    if (waited_) return;
    // The host's part failed while this step ran: stop it, and let it go of the buffers before the call ends.
    e_.cross_->abort();
    if (!w_->wait(std::min(e_.opts_.timeout_s, 5.0))) w_->hold_until_finished();
  }

 private:
  Engine& e_;
  std::shared_ptr<Work> w_;
  const Task& t_;
  uint64_t seq_;
  bool waited_ = false;
};

void Engine::raise_between_hosts(Work& done, uint64_t seq) {
  const RingError* e = done.error();
  if (!e) return;
  // Its text numbers the ranks among the hosts' peers: say which they are here.
  std::string legend;
  for (size_t i = 0; i < cross_members_.size(); ++i)
    legend += (i ? ", " : "") + std::to_string(i) + " = " + std::to_string(cross_members_[i]);
  auto here = [this](int q) { return q >= 0 && size_t(q) < cross_members_.size() ? cross_members_[size_t(q)] : -1; };
  std::string text = "between hosts (ranks there: " + legend + "): " + e->what();
  // (another host's rank stopped the ring between hosts on news from its own host: what it passed on)
  if (e->about >= 0 && e->origin >= 0)
    text += "; rank " + std::to_string(here(e->origin)) + " passed on that rank " + std::to_string(e->about) +
            (e->peer_died ? " died (or became unreachable)" : " failed");
  RingError err(e->kind, rank(), here(e->peer), seq, text);
  err.cause = e->cause;
  err.peer_died = e->peer_died;
  // (the origin, and the peer it named, in this communicator's ranks, as the peer)
  err.origin = here(e->origin);
  err.origin_peer = e->about >= 0 ? e->about : here(e->origin_peer);
  throw err;
}

Across Engine::between_hosts(const Task& t, uint64_t seq) {
  Across a;
  a.run = [this, &t, seq](Coll coll, const char* in, char* out, size_t count) {
    std::shared_ptr<Work> done = cross_->submit_and_wait(across_task(t, coll, in, out, count), t.interrupted);
    raise_between_hosts(*done, seq);
  };
  a.start = [this, &t, seq](Coll coll, const char* in, char* out, size_t count) -> std::unique_ptr<AcrossStep> {
    return std::make_unique<CrossStep>(*this, cross_->submit(across_task(t, coll, in, out, count)), t, seq);
  };
  return a;
}

std::vector<Counters> Engine::cross_traffic() {
  if (!cross_) return std::vector<Counters>(size_t(Coll::kCount) * size_t(size()) * 2);
  const std::vector<Counters> theirs = cross_->ledger().snapshot();
  const size_t h = cross_members_.size(), n = size_t(size());
  std::vector<Counters> out(size_t(Coll::kCount) * n * 2);
  for (size_t c = 0; c < size_t(Coll::kCount); ++c)
    for (size_t p = 0; p < h; ++p)
      for (size_t k = 0; k < 2; ++k) out[(c * n + size_t(cross_members_[p])) * 2 + k] = theirs[(c * h + p) * 2 + k];
  return out;
}

std::shared_ptr<Work> Engine::abort_for(int about, bool died) {
  {
    std::lock_guard<std::mutex> g(state_m_);
    abort_about_ = about;
    abort_about_died_ = died;
  }
  return abort();
}

std::shared_ptr<Work> Engine::abort(bool by_interrupt) {
  // Interrupt a collective that is waiting now (it fails, and fail() tells the
  // ring), then queue the abort itself for when nothing runs.
  if (by_interrupt) link_.mark_user_interrupt();
  link_.transport().interrupt();
  if (ShmWindow* w = link_.window()) w->wake();  // a wait in the window sees the interrupt at once
  if (cross_) cross_->abort(by_interrupt);  // and one between hosts (which tells the other hosts)
  Task t;
  t.abort = true;
  bool run_here = false;
  return enqueue(t, false, &run_here);
}

void Engine::loop() {
  for (;;) {
    std::pair<Task, std::shared_ptr<Work>> item;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return (stop_ && !busy_) || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stop requested and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    execute(item.first, *item.second);
    {
      std::lock_guard<std::mutex> g(m_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

void Engine::execute(const Task& t, Work& w) {
  std::unique_ptr<RingError> err;
  if (!t.abort && !t.started) recorder_.started(w.seq());
  link_.set_interrupt_check(t.interrupted);
  try {
    perform(t, w);
  } catch (const RingError& e) {
    err = std::make_unique<RingError>(e);
  } catch (const std::exception& e) {
    err = std::make_unique<RingError>(ErrKind::transport, rank(), -1, w.seq(), e.what());
  }
  if (err && t.abort) {  // the abort itself succeeded
    aborted_by(*err);
    err.reset();
  }
  link_.set_interrupt_check(nullptr);
  std::shared_ptr<Hold> stalled = err ? failed(*err, w.seq()) : nullptr;
  if (!t.abort) {
    const std::string text = err ? err->what() : "";
    recorder_.ended(w.seq(), link_.progress(), err ? &text : nullptr);
  }
  if (err) keep_arrays(w, stalled);
  w.finish(std::move(err));
}

// The abort task ran (its RingError says why): the link fails, telling the
// ring, about the failed p2p op that asked for it if one did (fail_p2p).
void Engine::aborted_by(const RingError& why) {
  std::unique_ptr<P2PFailure> p2p;
  {
    std::lock_guard<std::mutex> g(state_m_);
    p2p = std::move(p2p_failure_);
  }
  if (p2p) link_.fail(p2p->error, &p2p->call);  // a p2p op failed: the notice names it
  else link_.fail(why);
  record_abort(why.what(), rank(), ErrKind::aborted);
}

namespace {
// The peer a failure is about, in its communicator's numbering: the one
// this rank waited for or lost (it saw the failure), else the one the
// origin named (heard second-hand); -1: none.
int failed_peer(const RingError& e) { return e.origin < 0 || e.origin == e.rank ? e.peer : e.origin_peer; }

}  // namespace

// A collective failed: fill in where, and unless the call was refused
// (invalid), stop using the ring, whose state is unknown. Returns link_.fail's
// claim for good (a writer into the caller's arrays stalled), if any.
std::shared_ptr<Hold> Engine::failed(RingError& err, uint64_t seq) {
  if (err.seq == 0) err.seq = seq;
  if (err.rank < 0) err.rank = rank();
  if (err.origin < 0) err.origin = err.rank;
  if (err.kind == ErrKind::invalid) return nullptr;
  name_hosts(err);  // (before the link fails: the window and the abort reason tell the same text)
  std::shared_ptr<Hold> stalled = link_.fail(err);
  record_abort(err.what(), err.origin, err.cause);
  // Ranks of other hosts waiting between hosts hear of it, and of the rank it was about.
  if (cross_ && !cross_->aborted()) cross_->abort_for(failed_peer(err), err.peer_died);
  return stalled;
}

void Engine::name_hosts(RingError& e) const {
  if (hosts_.empty()) return;
  const std::string text = e.what();
  std::string note;
  std::vector<int> named_here;
  for (int q : {e.origin, failed_peer(e)}) {
    if (q < 0 || q == e.rank || size_t(q) >= hosts_.size() ||
        std::find(named_here.begin(), named_here.end(), q) != named_here.end())
      continue;
    named_here.push_back(q);
    const std::string r = "rank " + std::to_string(q), h = hosts_[size_t(q)];
    // (heard with a text that names it already: a peer's, through the window)
    if (text.find(r + " is on " + h) != std::string::npos || text.find(r + " on " + h) != std::string::npos) continue;
    note += (note.empty() ? " (" + r + " is on " : ", " + r + " on ") + h;
  }
  if (note.empty()) return;
  e = e.retold(text + note + ")");
}

// A failed collective's claim on the caller's arrays, in its Work.
void Engine::keep_arrays(Work& w, const std::shared_ptr<Hold>& stalled) {
  // Requests that outlived it, or a peer's write into them, may still use the caller's arrays.
  if (auto h = stalled ? stalled : link_.hold()) {
    std::lock_guard<std::mutex> g(w.m_);
    w.hold_ = h;
  }
  // Device work of the failed collective may already be queued (copies,
  // kernels, a peer's copy out of our buffer): the caller must keep its
  // arrays until this point has passed (Python's Work does).
  if (auto dev = device()) {
    try {
      std::lock_guard<std::mutex> g(w.m_);
      w.done_event_ = dev->record();
      w.device_ = dev;
    } catch (const std::exception&) {
    }
  }
}

// Host: the reducer runs here (made once per dtype and op: no allocation
// per call). Device: it enqueues kernels on the device.
const Reducer& Engine::reducer(DType dtype, Op op) {
  auto& slot = reducers_[size_t(dtype) * size_t(Op::kCount) + size_t(op)];
  if (!slot) slot = link_.device() ? link_.device()->reducer(dtype, op) : make_cpu_reducer(dtype, op);
  return *slot;
}

// The abort task (Engine::abort): fails the link as any failure would
// (execute), with this rank's reason; nothing to do when it failed already.
void Engine::perform_abort() {
  if (link_.aborted()) return;
  RingError e(ErrKind::aborted, rank(), -1, link_.seq(),
              "rank " + std::to_string(rank()) +
                  (link_.user_interrupted() ? " was interrupted (KeyboardInterrupt) between calls"
                                            : " aborted the communicator"));
  {
    std::lock_guard<std::mutex> g(state_m_);  // (abort_for: the notice says whom the failure was about)
    e.about = abort_about_;
    e.peer_died = abort_about_died_;
  }
  throw e;
}

// What every rank must agree on for this call. Only what the collective
// uses is compared: the rest stays 0 on every rank.
Fingerprint Engine::fingerprint(const Task& t, uint64_t seq) const {
  Fingerprint fp;
  fp.seq = seq;
  if (t.coll != Coll::barrier) fp.segment_bytes = int64_t(t.opts.segment_bytes);
  fp.coll = int32_t(t.coll);
  fp.count = int64_t(t.count);
  if (t.coll != Coll::barrier) fp.dtype = int32_t(t.dtype);
  if (coll_reduces(t.coll)) fp.op = int32_t(t.op);
  if (coll_has_root(t.coll)) fp.root = t.root;
  // Per-rank counts: every rank passes the same list (gather, scatter);
  // all_to_all's splits differ by rank, and each block's message checks them.
  if (t.coll == Coll::all_to_all && !t.counts.empty()) {
    fp.counts = kPerPeer;
    fp.count = 0;  // each rank's own total
  } else if (!t.counts.empty()) {
    fp.counts = counts_hash(t.counts.data(), t.counts.size());
  }
  fp.algo = t.algo;
  if (Algo(t.algo) == Algo::zero_copy) {  // where peers find this rank's arrays (announced in the window)
    fp.arena_in = t.arena_in;
    fp.arena_out = t.arena_out;
  }
  return fp;
}

// The call's header: announced in the window (its slots at the page offset
// of the call's array: align_slots_to), or sent to the neighbours, or, for
// a pairwise algorithm on two ranks, the stamp of its first message (the
// partner is both neighbours and hears from it at once; stamped transports
// only: not in device memory).
void Engine::begin_call(const Task& t, const AlgoRow& row, const Fingerprint& fp) {
  if (row.path == AlgoPath::messages) {
    link_.begin(fp, row.pair_header && size() == 2 && t.count > 0 && link_.stamped());
    return;
  }
  if (ShmWindow* win = link_.window()) {
    const void* arr = t.in ? t.in : t.out ? t.out : !t.in_places.empty() ? reinterpret_cast<const void*>(t.in_places[0])
                      : !t.out_places.empty() ? reinterpret_cast<const void*>(t.out_places[0]) : nullptr;
    win->align_slots_to(arr);
  }
  link_.begin_shared(fp);
}

// The collective: its row (validate() made sure there is one), the header,
// the algorithm, avg's division where the row's algorithm leaves sums, the
// drain of the link's requests (the window has none).
void Engine::perform(const Task& t, Work& w) {
  if (t.abort) return perform_abort();
  const uint64_t seq = w.seq();
  if (link_.aborted())
    throw RingError(ErrKind::aborted, rank(), -1, seq, "communicator was aborted earlier: " + link_.abort_reason());
  const AlgoRow* row = find_algorithm(t.coll, Algo(t.algo));
  if (!row) throw_invalid("unknown collective");
  Quarantine::instance().reap();  // one atomic load unless an earlier failure left requests behind
  link_.mutable_options() = t.opts;
  link_.set_tracer(t.tracer.get());
  begin_call(t, *row, fingerprint(t, seq));
  Device* dev = link_.device();
  if (dev && t.after) dev->wait(t.after);  // ordered after the caller's queued work
  Across across;  // (made for the hierarchical rows only)
  if (row->path == AlgoPath::hosts) across = between_hosts(t, seq);
  auto data = [](const auto& v) { return v.empty() ? nullptr : v.data(); };
  const AlgoCall call{link_,           coll_reduces(t.coll) ? &reducer(t.dtype, t.op) : nullptr,
                      static_cast<const char*>(t.in), static_cast<char*>(t.out), t.count, dtype_size(t.dtype),
                      link_.options().segment_bytes, t.root, data(t.counts), data(t.out_counts),
                      data(t.in_places), data(t.out_places), t.arena_out, &layout_, &across,
                      t.dtype,         t.op};
  row->run(call);
  if (row->finalize_avg) call.red->finalize(t.out, split_size(t.count, size_t(size()), size_t(rank())), size());
  if (row->path == AlgoPath::messages) link_.drain();  // (the window has no requests)
  link_.end_call();
  if (dev) {
    std::lock_guard<std::mutex> g(w.m_);
    w.done_event_ = dev->record();
    w.device_ = link_.transport().device();
  }
}

std::unique_ptr<RingError> Engine::check_peers() {
  {
    std::lock_guard<std::mutex> g(state_m_);
    if (aborted_) return std::make_unique<RingError>(ErrKind::aborted, rank(), -1, 0, abort_reason_);
  }
  {
    std::lock_guard<std::mutex> g(m_);
    if (busy_ || !queue_.empty()) return nullptr;
    busy_ = true;  // the link is ours until we hand it back
  }
  std::unique_ptr<RingError> err;
  try {
    link_.poll_control();
  } catch (const RingError& e) {
    err = std::make_unique<RingError>(e);
    name_hosts(*err);
    link_.fail(*err);
    record_abort(err->what(), err->origin, err->cause);
  }
  {
    std::lock_guard<std::mutex> g(m_);
    busy_ = false;
  }
  cv_.notify_all();
  return err;
}

// Only the thread that stored it can find its own id there: relaxed is enough.
bool Engine::running_here() const { return inline_thread_.load(std::memory_order_relaxed) == std::this_thread::get_id(); }

bool Engine::aborted() {
  std::lock_guard<std::mutex> g(state_m_);
  return aborted_;
}

std::string Engine::abort_reason() {
  std::lock_guard<std::mutex> g(state_m_);
  return abort_reason_;
}

// Options travel inside each task, so a change applies exactly to the
// collectives submitted after it, never to one already running.
void Engine::set_segment_bytes(size_t bytes) {
  if (bytes == 0 || bytes > (size_t(1) << 30))
    throw_invalid("segment size must be between 1 byte and 1 GiB, got " + std::to_string(bytes));
  {
    std::lock_guard<std::mutex> g(m_);
    opts_.segment_bytes = bytes;
  }
  if (cross_) cross_->set_segment_bytes(bytes);  // (the step between hosts is pipelined in segments too)
}

void Engine::set_timeout(double seconds) {
  if (!(seconds > 0)) throw_invalid("timeout must be positive, got " + std::to_string(seconds));
  {
    std::lock_guard<std::mutex> g(m_);
    opts_.timeout_s = seconds;
  }
  // The step between hosts waits in the engine there: its deadline too (else
  // comm.timeout = T bound the waits in the window only, and a rank waiting
  // for another host kept the deadline it was made with).
  if (cross_) cross_->set_timeout(seconds);
}

void Engine::set_tracer(std::shared_ptr<Tracer> t) {
  std::lock_guard<std::mutex> g(m_);
  tracer_ = std::move(t);
}

Options Engine::options() {
  std::lock_guard<std::mutex> g(m_);
  return opts_;
}

}  // namespace ringcomm
