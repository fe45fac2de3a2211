#include "engine/p2p.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include <thread>

#include "engine/engine.h"

namespace ringcomm {

namespace {
constexpr uint64_t kP2PIds = uint64_t(1) << 62;  // flight records of p2p ops: apart from collectives' seq
constexpr uint32_t kDtypeBits = 4;                // DType::kCount == 13
static_assert(int(DType::kCount) <= (1 << kDtypeBits), "dtype codes must fit the wire tag's low bits");

std::string elems(size_t bytes, DType dt) {
  const size_t es = dtype_size(dt);
  return std::to_string(bytes) + " bytes" +
         (bytes % es == 0 ? " (" + std::to_string(bytes / es) + " " + dtype_name(dt) + ")" : "");
}
}  // namespace

P2PLimits p2p_limits(const Transport& t) {
  return P2PLimits{t.p2p_max_tag() >> kDtypeBits, t.p2p_max_bytes()};
}

namespace {
// The argument and communicator checks every p2p op passes first.
// `to_self`: sendrecv's exchange with itself, where the peer may be this rank.
void check_post(Engine& e, bool send, int peer, size_t count, DType dtype, int tag, const Transport& t,
                bool to_self = false) {
  const int n = e.size(), rank = e.rank();
  const char* what = send ? "send" : "recv";
  const size_t es = dtype_size(dtype);  // throws on an unknown code
  if (!(peer == kAnySource && !send) && (peer < 0 || peer >= n))
    throw_invalid(std::string(what) + " peer " + std::to_string(peer) + " is out of range (expected 0 <= peer < " +
                  std::to_string(n) + (send ? ")" : ", or None for any source)"));
  if (peer == rank && !to_self)
    throw_invalid(std::string(what) + " to/from itself (rank " + std::to_string(rank) +
                  "): point-to-point needs another rank (use a copy)");
  const P2PLimits lim = p2p_limits(t);
  if (tag < 0 || uint32_t(tag) > lim.max_tag)
    throw_invalid(std::string(what) + " tag " + std::to_string(tag) + " is out of range (0 <= tag <= " +
                  std::to_string(lim.max_tag) + " on this transport)");
  if (count > lim.max_bytes / es)
    throw_invalid(std::string(what) + " of " + std::to_string(count) + " " + dtype_name(dtype) + " (" +
                  std::to_string(count * es) + " bytes) is larger than this transport's largest message (" +
                  std::to_string(lim.max_bytes) + " bytes): send it in parts");
  if (e.aborted()) {
    RingError err(ErrKind::aborted, rank, peer, 0, "communicator was aborted earlier: " + e.abort_reason());
    throw err;
  }
}

// Its flight record (the peer in `root`, the tag in `algo`: flight_list
// names them peer and tag).
FlightRecord p2p_record(uint64_t id, bool send, int peer, size_t count, DType dtype, int tag, int64_t t_ns) {
  FlightRecord r;
  r.seq = id;
  r.coll = int32_t(send ? Coll::send : Coll::recv);
  r.count = int64_t(count);
  r.dtype = int32_t(dtype);
  r.root = peer;  // the peer (-1: any source)
  r.algo = tag;   // the tag
  r.t_issue_ns = r.t_start_ns = t_ns;
  r.state = FlightState::running;
  return r;
}

// What the ring is told failed (Engine::fail_p2p; describe() names it).
Fingerprint p2p_call(bool send, size_t count, DType dtype, int peer, int tag, int rank) {
  Fingerprint f;
  f.coll = int32_t(send ? Coll::send : Coll::recv);
  f.count = int64_t(count);
  f.dtype = int32_t(dtype);
  f.root = peer;  // -1: any source
  f.algo = tag;
  f.rank = rank;
  return f;
}

// Run `post` (what hands an op to the transport); a transport failure there
// (an MPI error in the send or the matched probe, or any other exception)
// aborts the communicator and tells the ring, as a failure in a wait does,
// so no peer waits for this op until its deadline.
template <class F>
auto posting(Engine& e, bool send, int peer, size_t count, DType dtype, int tag, F&& post) -> decltype(post()) {
  try {
    return post();
  } catch (const RingError& err) {
    if (err.kind != ErrKind::invalid && err.kind != ErrKind::aborted)
      e.fail_p2p(err, p2p_call(send, count, dtype, peer, tag, e.rank()));
    throw;
  } catch (const std::exception& ex) {  // (not the engine's own: told alike, raised as a RingError)
    const RingError err(ErrKind::transport, e.rank(), peer, 0, ex.what());
    e.fail_p2p(err, p2p_call(send, count, dtype, peer, tag, e.rank()));
    throw err;
  }
}
}  // namespace

std::shared_ptr<P2POp> P2POp::make(const std::shared_ptr<Engine>& e, std::shared_ptr<Transport> t, bool send,
                                   int peer, void* buf, size_t count, DType dtype, int tag, uint64_t id,
                                   int64_t t_issue_ns) {
  auto op = std::make_shared<P2POp>();
  op->engine_ = e;
  op->t_ = std::move(t);
  op->is_send_ = send;
  op->peer_ = peer;
  op->source_ = send ? peer : -1;
  op->buf_ = buf;
  op->count_ = count;
  op->bytes_ = count * dtype_size(dtype);
  op->dtype_ = dtype;
  op->tag_ = tag;
  op->wire_ = (uint32_t(tag) << kDtypeBits) | uint32_t(dtype);
  op->rank_ = e->rank();
  op->deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(e->options().timeout_s));
  op->id_ = id;
  FlightRecorder& fr = e->recorder();
  if (fr.capacity()) fr.issued(p2p_record(id, send, peer, count, dtype, tag, t_issue_ns));
  return op;
}

std::shared_ptr<P2POp> p2p_post(const std::shared_ptr<Engine>& e, bool send, int peer, void* buf, size_t count,
                                DType dtype, int tag, uintptr_t stream) {
  std::shared_ptr<Transport> t = e->shared_transport();
  check_post(*e, send, peer, count, dtype, tag, *t);
  auto op = P2POp::make(e, t, send, peer, buf, count, dtype, tag, kP2PIds + e->next_p2p_id(), wall_ns());
  if (auto dev = e->device()) {
    try {
      op->stage(std::move(dev), stream);
    } catch (const std::exception& ex) {  // the copy out failed or missed the deadline: nothing was posted
      const auto* re = dynamic_cast<const RingError*>(&ex);
      RingError err = re ? *re : RingError(ErrKind::transport, e->rank(), peer, 0, ex.what());
      if (err.kind != ErrKind::invalid) e->fail_p2p(err, op->call(), false);  // the ring is told, as of any failed op
      op->finish(std::make_unique<RingError>(err));
      throw err;
    }
  }
  posting(*e, send, peer, count, dtype, tag, [&] {
    if (send) {
      op->req_ = t->p2p_send(peer, op->buf_, op->bytes_, op->wire_);  // (the staging copy on a device)
    } else {
      e->p2p_pending().add(op);
      e->p2p_pending().match(*t);
    }
  });
  return op;
}

namespace {
// The fast lane's send and take: on the spot where the transport is an
// EagerP2P, else posted as p2p_post does (a taken message then comes back
// as pending, as a partly arrived one does).
bool send_now(Transport& t, EagerP2P* eager, int peer, const void* buf, size_t bytes, uint32_t wire,
              RequestPtr* pending) {
  if (eager) return eager->p2p_send_now(peer, buf, bytes, wire, pending);
  *pending = t.p2p_send(peer, buf, bytes, wire);
  return false;
}

int take_now(Transport& t, EagerP2P* eager, int peer, uint32_t wire, void* buf, size_t bytes, RequestPtr* pending) {
  if (eager) return eager->p2p_take_now(peer, wire, buf, bytes, pending);
  *pending = t.p2p_take(peer, wire, buf, bytes);
  return *pending ? EagerP2P::kP2PPending : EagerP2P::kP2PNone;
}
}  // namespace

int p2p_run_now(const std::shared_ptr<Engine>& e, bool send, int peer, void* buf, size_t count, DType dtype, int tag,
                std::shared_ptr<P2POp>* posted) {
  if (e->device()) throw_invalid("p2p_run_now: host communicators only (a device op is staged: p2p_post)");
  const std::shared_ptr<Transport> tp = e->shared_transport();
  Transport& t = *tp;
  check_post(*e, send, peer, count, dtype, tag, t);
  return posting(*e, send, peer, count, dtype, tag, [&]() -> int {
    const size_t bytes = count * dtype_size(dtype);
    const uint32_t wire = (uint32_t(tag) << kDtypeBits) | uint32_t(dtype);
    const uint64_t id = kP2PIds + e->next_p2p_id();
    const int64_t t0 = wall_ns();
    // Done on the spot: the ledger counts it and its record goes in ended
    // (one lock, no search); nothing was allocated.
    auto done = [&](int source) {
      if (send) e->ledger().sent_shared(Coll::send, peer, bytes);
      else e->ledger().received_shared(Coll::recv, source, bytes);
      FlightRecorder& fr = e->recorder();
      if (fr.capacity()) {
        FlightRecord r = p2p_record(id, send, peer, count, dtype, tag, t0);
        r.state = FlightState::done;
        r.t_end_ns = wall_ns();
        fr.issued(r);
      }
      return source;
    };
    RequestPtr pending;
    EagerP2P* eager = e->p2p_pending().eager(t);
    if (send) {
      if (send_now(t, eager, peer, buf, bytes, wire, &pending)) return done(peer);
      *posted = P2POp::make(e, tp, send, peer, buf, count, dtype, tag, id, t0);
      (*posted)->req_ = std::move(pending);
      return -1;
    }
    // A receive takes a message here only while no earlier receive of this
    // communicator waits unmatched (P2PPending's order), under its lock.
    P2PPending& pend = e->p2p_pending();
    // Poll a few microseconds for a message not here yet only on an eager
    // transport: its peers are other processes, whose answer may be that
    // close (in process, the peer needs this thread's core and interpreter lock).
    const bool spin = eager != nullptr;
    Clock::time_point until{};
    for (long i = 0;; ++i) {
      int got = EagerP2P::kP2PNone;
      {
        std::unique_lock<std::mutex> g(pend.m_, std::try_to_lock);
        if (!g.owns_lock() || !pend.idle()) break;
        got = take_now(t, eager, peer, wire, buf, bytes, &pending);
      }
      if (got >= 0) return done(got);
      if (got == EagerP2P::kP2PPending) {  // taken; still arriving, or of another size (wait() says so)
        auto op = P2POp::make(e, tp, send, peer, buf, count, dtype, tag, id, t0);
        op->req_ = std::move(pending);
        op->matched_.store(true, std::memory_order_release);
        *posted = std::move(op);
        return -1;
      }
      // Not here yet: poll a few microseconds (a neighbour's answer), then wait as any receive.
      if (!spin) break;
      if ((i & 15) == 0) {
        const auto now = Clock::now();
        if (i == 0) until = now + std::chrono::microseconds(kSpinUs);
        else if (now >= until) break;
      }
    }
    auto op = P2POp::make(e, tp, send, peer, buf, count, dtype, tag, id, t0);
    pend.add(op);
    pend.match(t);
    *posted = std::move(op);
    return -1;
  });
}

namespace {
// sendrecv's exchange with itself: no message, no ledger entry (no bytes
// between ranks), the copy done before it returns. On a device, after the
// work queued on both arrays' streams; a copy that misses the deadline
// raises and leaves `sr.hold`, as it may still run.
void copy_to_self(Engine& e, const void* from, void* to, size_t bytes, uintptr_t sstream, uintptr_t rstream,
                  SendRecv& sr) {
  if (!bytes) return;
  const auto dev = e.device();
  if (!dev) {
    std::memcpy(to, from, bytes);
    return;
  }
  if (sstream != rstream) dev->wait_external(rstream, dev->record_external(sstream));
  const EventPtr done = dev->copy_external(rstream, to, from, bytes);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(e.options().timeout_s));
  if (done && !done->synchronize(deadline)) {
    sr.hold = std::make_shared<Hold>();
    sr.hold->pending.fetch_add(1);  // never released: nothing tells when a stalled queue runs the copy
    throw RingError(ErrKind::timeout, e.rank(), e.rank(), 0,
                    "sendrecv with itself: the device copy of " + std::to_string(bytes) + " bytes did not finish "
                    "within the timeout");
  }
}
}  // namespace

SendRecv p2p_sendrecv(const std::shared_ptr<Engine>& e, void* sbuf, size_t scount, DType sdtype, int dst, int stag,
                      void* rbuf, size_t rcount, DType rdtype, int src, int rtag, uintptr_t sstream,
                      uintptr_t rstream) {
  const std::shared_ptr<Transport> t = e->shared_transport();
  const int me = e->rank();
  const bool to_self = dst == me;  // the exchange with itself: a copy (MPI_Sendrecv allows it; a ring shift at N = 1)
  const bool from_self = src == me || (to_self && src == kAnySource);
  if (to_self != from_self)
    throw_invalid("sendrecv with itself (rank " + std::to_string(me) + ") needs dst and src both " +
                  std::to_string(me) + " (src None: itself), got dst " + std::to_string(dst) + ", src " +
                  (src == kAnySource ? std::string("None") : std::to_string(src)));
  check_post(*e, true, dst, scount, sdtype, stag, *t, to_self);
  check_post(*e, false, src, rcount, rdtype, rtag, *t, to_self);
  const auto s0 = reinterpret_cast<uintptr_t>(sbuf), r0 = reinterpret_cast<uintptr_t>(rbuf);
  const size_t sb = scount * dtype_size(sdtype), rb = rcount * dtype_size(rdtype);
  if (sb && rb && s0 < r0 + rb && r0 < s0 + sb)
    throw_invalid("sendrecv: the send buffer (" + std::to_string(sb) + " bytes) and the receive buffer (" +
                  std::to_string(rb) + " bytes) overlap: the message may land while the send still reads; use two "
                  "arrays");
  if (to_self) {
    if (stag != rtag || sdtype != rdtype || sb != rb)
      throw_invalid("sendrecv with itself (rank " + std::to_string(me) + "): the send (" + elems(sb, sdtype) +
                    ", tag " + std::to_string(stag) + ") does not match the receive (" + elems(rb, rdtype) +
                    ", tag " + std::to_string(rtag) + "), so it would never be received");
    SendRecv sr;
    sr.source = me;
    try {
      copy_to_self(*e, sbuf, rbuf, sb, sstream, rstream, sr);
    } catch (...) {
      if (!sr.hold) throw;
      sr.error = std::current_exception();  // (raised by wait_sendrecv with the hold attached)
    }
    return sr;
  }
  // One side: done on the spot when it can be (the source), else posted into *op (-1).
  auto post = [&](bool send, int peer, void* buf, size_t count, DType dtype, int tag, uintptr_t stream,
                  std::shared_ptr<P2POp>* op) {
    if (!e->device()) return p2p_run_now(e, send, peer, buf, count, dtype, tag, op);
    *op = p2p_post(e, send, peer, buf, count, dtype, tag, stream);
    return -1;
  };
  SendRecv sr;
  post(true, dst, sbuf, scount, sdtype, stag, sstream, &sr.send);
  try {
    sr.source = post(false, src, rbuf, rcount, rdtype, rtag, rstream, &sr.recv);
  } catch (...) {  // (aborted since the check, or posting failed and aborted it): the send may be in flight
    if (!sr.send) throw;
    sr.error = std::current_exception();
  }
  return sr;
}

bool P2PPending::idle() {
  // Called under m_: drop receives that are gone or done; true when none waits.
  size_t keep = 0;
  for (size_t i = 0; i < recvs_.size(); ++i) {
    std::shared_ptr<P2POp> op = recvs_[i].lock();
    if (!op || op->withdrawn_ || op->matched_.load(std::memory_order_acquire)) continue;
    recvs_[keep++] = recvs_[i];
  }
  recvs_.resize(keep);
  return keep == 0;
}

void P2PPending::add(const std::shared_ptr<P2POp>& op) {
  std::lock_guard<std::mutex> g(m_);
  recvs_.push_back(op);
}

void P2PPending::match(Transport& t) {
  std::unique_lock<std::mutex> g(m_, std::try_to_lock);
  if (!g.owns_lock()) return;  // another thread is matching right now
  if (recvs_.empty()) return;
  // (peer, wire tag) of earlier receives still unmatched: a later one never
  // takes a message that one of them could (MPI's posted-receive order). An
  // any-source receive behind receives from given ranks still takes a
  // message from any other rank.
  std::vector<std::pair<int, uint32_t>> blocked;
  std::vector<int> skip;  // an any-source receive: the ranks whose messages go to earlier receives
  size_t keep = 0;
  for (size_t i = 0; i < recvs_.size(); ++i) {
    std::shared_ptr<P2POp> op = recvs_[i].lock();
    if (!op || op->withdrawn_ || op->matched_.load(std::memory_order_acquire)) continue;  // gone, or done
    bool wait_turn = false;
    skip.clear();
    for (const auto& b : blocked) {
      if (b.second != op->wire_) continue;
      if (b.first == kAnySource || b.first == op->peer_) wait_turn = true;
      else if (op->peer_ == kAnySource) skip.push_back(b.first);
    }
    if (!wait_turn) {
      RequestPtr r;
      if (skip.empty()) {
        r = t.p2p_take(op->peer_, op->wire_, op->buf_, op->bytes_);
      } else {  // any source but the skipped ranks: ask each of the others
        for (int q = 0; q < t.size() && !r; ++q)
          if (q != t.rank() && std::find(skip.begin(), skip.end(), q) == skip.end())
            r = t.p2p_take(q, op->wire_, op->buf_, op->bytes_);
      }
      if (r) {
        op->req_ = std::move(r);
        op->matched_.store(true, std::memory_order_release);
        continue;
      }
    }
    blocked.emplace_back(op->peer_, op->wire_);
    recvs_[keep++] = recvs_[i];
  }
  recvs_.resize(keep);
}

bool P2PPending::awaits(int peer, uint32_t wire) {
  std::lock_guard<std::mutex> g(m_);
  for (const auto& w : recvs_) {
    std::shared_ptr<P2POp> op = w.lock();
    if (op && !op->withdrawn_ && !op->matched_.load(std::memory_order_acquire) && op->wire_ == wire &&
        (op->peer_ == peer || op->peer_ == kAnySource))
      return true;
  }
  return false;
}

bool P2PPending::waiting() {
  std::unique_lock<std::mutex> g(m_, std::try_to_lock);
  return !g.owns_lock() || !recvs_.empty();
}

void P2PPending::withdraw(P2POp& op) {
  std::lock_guard<std::mutex> g(m_);
  op.withdrawn_ = true;
}

bool P2POp::is_completed() { return done_.load(std::memory_order_acquire); }

const RingError* P2POp::error() {
  std::lock_guard<std::mutex> g(m_);
  return err_.get();
}

int P2POp::source() {
  std::lock_guard<std::mutex> g(m_);
  return source_;
}

Fingerprint P2POp::call() const { return p2p_call(is_send_, count_, dtype_, peer_, tag_, rank_); }

void P2POp::fail(ErrKind kind, const std::string& what, bool peer_died) {
  const std::string peer = peer_ == kAnySource ? "any rank" : "rank " + std::to_string(peer_);
  RingError e(kind, rank_, peer_, 0,
              std::string(is_send_ ? "send to " : "recv from ") + peer + " (tag " + std::to_string(tag_) + ", " +
                  elems(bytes_, dtype_) + ") on rank " + std::to_string(rank_) + ": " + what);
  e.peer_died = peer_died && peer_ >= 0;  // (any source: every rank gone, no one peer to name)
  throw e;
}

void P2POp::stage(std::shared_ptr<Device> dev, uintptr_t stream) {
  dev_ = std::move(dev);
  stream_ = stream;
  user_ = buf_;
  if (!bytes_) return;  // nothing to copy (no byte of buf_ is touched)
  staging_ = dev_->host_staging(bytes_);
  buf_ = staging_.get();
  if (!is_send_) return;
  copy_ = dev_->copy_external(stream_, buf_, user_, bytes_);
  if (copy_ && !copy_->synchronize(deadline_))
    fail(ErrKind::timeout, "the device did not copy the send buffer out by the deadline (is the caller's stream stuck?)");
  copy_.reset();
}

// A receive that timed out: what its peer sent instead, when the oldest
// message from it (any source: from some rank) waits here unreceived with
// another tag (the usual cause: ranks that disagree on the tag), or with
// this tag and another dtype (progress() fails a receive from one peer on
// that earlier, but not an any-source one); "" otherwise, and when another
// receive of this rank awaits that message.
std::string P2POp::unreceived() const {
  int src = -1;
  size_t bytes = 0;
  uint32_t wire = 0;
  try {
    if (!t_->p2p_peek(peer_, kAnyTag, &src, &bytes, &wire) || wire == wire_ ||
        engine_->p2p_pending().awaits(src, wire))
      return "";
  } catch (const std::exception&) {  // (the timeout is the error to raise, not the probe's)
    return "";
  }
  const uint32_t code = wire & ((1u << kDtypeBits) - 1), tag = wire >> kDtypeBits;
  const std::string what = code < uint32_t(DType::kCount) ? elems(bytes, DType(code)) : std::to_string(bytes) + " bytes";
  const std::string next = "; rank " + std::to_string(src) + "'s next message to rank " + std::to_string(rank_);
  if (tag == uint32_t(tag_))
    return next + " has this tag but is " + what + " (this receive: " + dtype_name(dtype_) +
           ") and waits unreceived: do the ranks agree on the dtype?";
  return next + " has tag " + std::to_string(tag) + " (" + what +
         ") and waits unreceived: do the ranks agree on the tag?";
}

std::string P2POp::every_peer_dead() const {
  std::string all;
  for (int r = 0; r < engine_->size(); ++r) {
    if (r == engine_->rank()) continue;
    const std::string death = engine_->death_of(r);
    if (death.empty()) return "";
    all += (all.empty() ? "" : "; ") + death;
  }
  return all.empty() ? "" : "every rank that could send it is gone: " + all;
}

bool P2POp::delivered(Clock::time_point until) {
  if (!bytes_) return true;
  if (!delivering_) {
    delivering_ = true;
    copy_ = dev_->copy_external(stream_, user_, buf_, bytes_);
  }
  if (copy_ && !copy_->synchronize(until)) return false;
  copy_.reset();
  return true;
}

bool P2POp::copy_pending() {
  if (!copy_) return false;
  try {
    return !copy_->query();
  } catch (const std::exception&) {  // (a CUDA error: the copy's fate is unknown)
    return true;
  }
}

// An op dropped unfinished (its Work released while a receive's copy in is
// queued, then the communicator closed): the copy may still use the
// staging memory, which then is never given back.
P2POp::~P2POp() {
  if (copy_pending()) new std::shared_ptr<char>(staging_);  // deliberately never deleted
}

// One step: true once the op is done. Blocks at most until `until`.
bool P2POp::progress(Clock::time_point until) {
  // Every wait, a send's too, progresses this communicator's pending receives.
  engine_->p2p_pending().match(*t_);
  const bool waiting_for_message = !is_send_ && !matched_.load(std::memory_order_acquire);
  if (waiting_for_message) {
    ++polls_;
    if (peer_ != kAnySource && polls_ > 64 && (polls_ & 15) == 0) check_other_dtypes();  // another dtype, same tag?
    back_off();
    return false;
  }
  if (!is_send_ && source_ < 0) on_matched();
  // While a receive of this rank waits for its message, come back to
  // match it every few microseconds: a peer's send may need it matched
  // (rendezvous) before that peer can take ours, and matching only between
  // long waits ran the two directions of an exchange one after the other
  // (isend + irecv one after the other instead of together).
  if (until > Clock::now() + std::chrono::microseconds(20) && engine_->p2p_pending().waiting())
    until = Clock::now() + std::chrono::microseconds(20);
  Request* r = req_.get();
  const int i = t_->wait_any(&r, 1, until);
  if (i == 0) return true;
  if (i == kInterrupted) fail(ErrKind::aborted, "the communicator was aborted while waiting");
  return false;
}

// A receive still unmatched: is the peer's next message with this tag of
// another dtype? A message of another dtype is the peer's next one with this
// tag only if ours is not there too: both may have arrived since this wait
// last tried to match (ours first: a peer's messages arrive in order), and
// then the next match takes ours. So look for ours after finding the other
// one, never before. Nor is it a mismatch when a receive of this rank awaits it.
void P2POp::check_other_dtypes() {
  for (int d = 0; d < int(DType::kCount); ++d) {
    int src = -1, own_src = -1;
    size_t b = 0, own_bytes = 0;
    const uint32_t other = (uint32_t(tag_) << kDtypeBits) | uint32_t(d);
    if (d != int(dtype_) && t_->p2p_peek(peer_, other, &src, &b, nullptr) &&
        !t_->p2p_peek(peer_, wire_, &own_src, &own_bytes, nullptr) && !engine_->p2p_pending().awaits(peer_, other))
      fail(ErrKind::mismatch, "rank " + std::to_string(src) + " sent " + std::to_string(b) + " bytes of " +
                                  dtype_name(DType(d)) + " with this tag, but this receive is " +
                                  dtype_name(dtype_));
  }
}

// A receive just matched: its source, and whether the message fits.
void P2POp::on_matched() {
  source_ = req_->peer;
  if (req_->wrong_message)
    fail(ErrKind::mismatch, "rank " + std::to_string(source_) + " sent " + elems(req_->bytes, dtype_) +
                                ", but the receive buffer has " + elems(bytes_, dtype_) +
                                " (sizes must match exactly); the message was discarded, none of it landed");
}

// Back off: spin first (the message may be microseconds away), then yield,
// then sleep (a receive posted long before its send should not cost a core).
void P2POp::back_off() const {
  if (polls_ <= 64 || polling_) return;
  if (polls_ < 2000) sched_yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(polls_ < 4000 ? 20 : 200));
}

bool P2POp::wait(double timeout_s, const std::function<bool()>* interrupted, bool* fired) {
  std::lock_guard<std::mutex> g(m_);
  return wait_locked(timeout_s, interrupted, fired);
}

bool P2POp::poll() {
  std::unique_lock<std::mutex> g(m_, std::try_to_lock);
  if (!g.owns_lock()) return false;
  polling_ = true;  // no back-off: a sweep polls many ops in turn, none may sleep
  struct Reset {
    bool& b;
    ~Reset() { b = false; }
  } reset{polling_};
  return wait_locked(0.0, nullptr, nullptr);
}

bool P2POp::wait_locked(double timeout_s, const std::function<bool()>* interrupted, bool* fired) {
  if (done_.load(std::memory_order_relaxed)) return true;
  const auto start = Clock::now();
  const auto mine = timeout_s < 0 ? Clock::time_point::max()
                                  : start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(timeout_s));
  auto last_check = start;
  for (;;) {
    try {
      if (wait_step(Clock::now(), mine))
        break;  // done: booked and finished below, outside the try (a throw there must not finish it twice)
      const auto now = Clock::now();
      if (now - last_check >= std::chrono::milliseconds(100) || now >= deadline_ || now >= mine) {
        last_check = now;
        check_ending(now, interrupted, fired);
      }
      if (now >= mine) return false;
    } catch (const std::exception& ex) {
      // Any failure, not only the engine's own (a device copy may throw
      // another exception): the op ends failed and the ring is told, so no
      // peer waits for it until its deadline.
      const auto* re = dynamic_cast<const RingError*>(&ex);
      auto err = std::make_unique<RingError>(re ? *re : RingError(ErrKind::transport, rank_, peer_, 0, ex.what()));
      if (err->kind != ErrKind::invalid) engine_->fail_p2p(*err, call(), by_interrupt_);  // the ring is told of this op
      finish(std::move(err));
      return true;
    }
  }
  Ledger& l = engine_->ledger();
  if (is_send_) l.sent_shared(Coll::send, peer_, bytes_);
  else l.received_shared(Coll::recv, source_, bytes_);
  finish(nullptr);
  return true;
}

// One progress step, blocking at most 100 ms (an unmatched receive: not at
// all); true once the op is done, a device receive's copy in included.
bool P2POp::wait_step(Clock::time_point now, Clock::time_point mine) {
  const auto until = std::min({deadline_, mine, now + std::chrono::milliseconds(100)});
  return progress(is_send_ || matched_.load(std::memory_order_acquire) ? until : now) &&
         (!dev_ || is_send_ || delivered(until));
}

// What ends a wait early, checked every 100 ms and at the deadlines: a
// Ctrl-C, an abort, a peer's failure told along the ring, a peer's process
// gone, the communicator's deadline. Each throws (fail()).
void P2POp::check_ending(Clock::time_point now, const std::function<bool()>* interrupted, bool* fired) {
  if (interrupted && (*interrupted)()) {
    if (fired) *fired = true;
    by_interrupt_ = true;  // the abort (fail_p2p, in wait_locked) says so to the ring
    fail(ErrKind::aborted, "interrupted (Ctrl-C)");
  }
  if (engine_->aborted()) fail(ErrKind::aborted, "the communicator was aborted: " + engine_->abort_reason());
  if (auto heard = engine_->check_peers())  // a peer's failure, told along the ring
    fail(ErrKind::aborted, std::string("a peer failed: ") + heard->what());
  check_peer_gone();
  // (Not in poll(): a Work dropped unwaited fails no one at its deadline;
  // a receive that never matches just stays, as in MPI.)
  if (now >= deadline_ && !polling_)
    fail(ErrKind::timeout, "timed out after " + std::to_string(engine_->options().timeout_s) + " s waiting for " +
                               timeout_text() + (is_send_ || matched_.load() ? "" : unreceived()));
}

// A peer of this host whose process is gone (a send not yet taken, or a
// receive whose message has not come). An any-source receive fails only
// once every other rank is gone: a living one may still send.
void P2POp::check_peer_gone() {
  if (!is_send_ && matched_.load(std::memory_order_acquire)) return;
  const std::string death = peer_ >= 0 ? engine_->death_of(peer_) : every_peer_dead();
  if (!death.empty()) fail(ErrKind::transport, death + " (its process is gone)", true);
}

// What a timed-out op was waiting for.
std::string P2POp::timeout_text() const {
  if (is_send_) return "rank " + std::to_string(peer_) + " to receive it";
  if (delivering_)
    return "the device to copy the message from rank " + std::to_string(source_) +
           " in (is the caller's stream stuck?)";
  if (peer_ == kAnySource) return "a message from any rank";
  return "a message from rank " + std::to_string(peer_);
}

void P2POp::finish(std::unique_ptr<RingError> err) {
  if (!is_send_) engine_->p2p_pending().withdraw(*this);  // after this, req_ is ours alone
  if (copy_pending()) {
    // A staging copy still queued on the caller's stream (it missed the
    // deadline) may yet read or write the staging memory and the caller's
    // buffer: neither is ever given back (the caller's array stays held).
    new std::shared_ptr<char>(staging_);  // deliberately never deleted
    hold_ = std::make_shared<Hold>();
    hold_->pending.fetch_add(1);  // never released
  }
  if (req_ && !t_->test(*req_) && !t_->cancel(*req_)) {
    // A send MPI may still read (or a receive still arriving): the quarantine
    // keeps it; the caller's Python side keeps the array (like a collective).
    if (!hold_) hold_ = std::make_shared<Hold>();
    hold_->pending.fetch_add(1);
    Quarantine::instance().add(t_, std::move(req_), staging_, hold_);  // (a device op's staging memory too)
  }
  req_.reset();
  const std::string text = err ? err->what() : "";
  engine_->recorder().ended(id_, Progress(), err ? &text : nullptr);
  err_ = std::move(err);
  done_.store(true, std::memory_order_release);
  engine_.reset();  // a closed communicator's engine goes once its last op ends
}

}  // namespace ringcomm
