#include "core/link.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ringcomm {

namespace {
constexpr uint32_t kMagic = 0x52434d31;  // "RCM1"
enum : uint32_t { kHeader = 1, kAbort = 2, kLeft = 3 };
constexpr int kUserInterrupt = -3;  // wait_for(): the interrupt check said stop (Ctrl-C)
constexpr int kControl = 1;         // wait_or_control(): a control message came, and was handled
// How often a blocked wait polls the interrupt check (Ctrl-C is seen within this).
constexpr auto kInterruptSlice = std::chrono::milliseconds(100);
// How often a wait matches the rank's pending p2p receives (set_p2p_progress):
// after 1 ms, then at doubling intervals up to kInterruptSlice (a message
// usually arrives within the first; a long wait should not spin up the
// transport's back-off again every millisecond).
constexpr auto kP2PSlice = std::chrono::milliseconds(1);
constexpr size_t kFpBytes = sizeof(Fingerprint);
// How long a rank that found a message of another call waits for that
// peer's fingerprint, to name its call (throw_foreign_message).
constexpr double kNameWaitS = 2.0;
}  // namespace

// Every control message has this one fixed size, so the always-posted
// control receive matches whatever comes next.
struct Link::ControlMsg {
  uint32_t magic = kMagic;
  uint32_t type = kHeader;
  Fingerprint fp;      // header: the sender's call; abort: the call that failed at `origin`
  Fingerprint other;   // abort after a mismatch: the disagreeing call `origin` saw
  int32_t origin = -1; // abort: the rank that detected the failure
  int32_t kind = 0;    // abort: ErrKind
  int32_t peer = -1;   // abort: the peer involved (for a timeout: the one waited for)
  int32_t interrupted = 0;  // abort: `origin` was interrupted (Ctrl-C), not aborted by a call
  int32_t peer_died = 0;    // abort: a transport error because `peer`'s process is gone (RingError::peer_died)
  int32_t left = 0;         // abort: `origin` closed its communicator (RingError::peer_left)
  int32_t about = -1;       // abort between hosts: the failed rank of the communicator above (RingError::about)
};

Link::Link(std::shared_ptr<Transport> t, Options opts)
    : t_(std::move(t)), device_(t_->device()), opts_(opts), rank_(t_->rank()), size_(t_->size()), ledger_(t_->size()) {
  stamp_mask_ = device_ ? 0 : t_->stamp_mask();
  for (auto& in : ctrl_in_) in = std::make_shared<ControlMsg>();
  if (size_ > 1) post_control_recv(0);
  if (size_ > 2) post_control_recv(1);
}

// Whatever the transport cannot withdraw outlives the Link in the quarantine.
Link::~Link() {
  for (auto& r : live_)
    if (r && !r->done && !t_->cancel(*r)) quarantine(std::move(r), true);
  for (auto& r : ctrl_req_)
    if (r && !r->done && !t_->cancel(*r)) quarantine(std::move(r), false);
  for (auto& p : ctrl_out_)
    if (p.second && !p.second->done && !t_->test(*p.second) && !t_->cancel(*p.second))
      quarantine(std::move(p.second), false);
  for (auto& r : fp_sends_)
    if (r && !r->done && !t_->test(*r) && !t_->cancel(*r)) quarantine(std::move(r), false);
}

void Link::quarantine(RequestPtr r, bool payload) {
  // The request may point into any memory the Link handed the transport:
  // keep all of it (it is small next to the payload, and only failures pay).
  struct Kept {
    std::shared_ptr<Memory> mem;
    std::shared_ptr<ControlMsg> in[2];
    std::vector<std::shared_ptr<ControlMsg>> out;
  };
  auto kept = std::make_shared<Kept>();
  kept->mem = mem_;
  kept->in[0] = ctrl_in_[0];
  kept->in[1] = ctrl_in_[1];
  for (auto& p : ctrl_out_) kept->out.push_back(p.first);
  std::shared_ptr<Hold> hold;
  if (payload) {  // payload requests may use the caller's arrays
    if (!hold_) hold_ = std::make_shared<Hold>();
    hold = hold_;
  }
  Quarantine::instance().add(t_, std::move(r), std::move(kept), std::move(hold));
}

void Link::post_control_recv(int side) {
  ctrl_req_[side] = t_->irecv(side ? right() : left(), Channel::control, ctrl_in_[side].get(), sizeof(ControlMsg));
}

const Request& Link::control_request(int side) {
  if (ctrl_req_[side]) return *ctrl_req_[side];
  left_side_.peer = side ? right() : left();  // (the neighbour left: a request that names it, for the text)
  return left_side_;
}

void Link::take_control(int side) {
  ControlMsg m = *ctrl_in_[side];
  // A neighbour that left sends nothing more, and its process may exit at
  // once: a receive still posted to it would then fail this rank's call,
  // which it may still be finishing (its last messages came before).
  if (m.magic == kMagic && m.type == kLeft)
    ctrl_req_[side].reset();
  else
    post_control_recv(side);
  handle_control(m, side);
}

void Link::send_control(const ControlMsg& m, int peer) {
  // Reap control sends that have completed (they are tiny and complete
  // eagerly); keep their messages for reuse (no allocation per call).
  size_t reaped = 0;
  while (reaped < ctrl_out_.size()) {
    auto& [msg, req] = ctrl_out_[reaped];
    if (!req->done && !t_->test(*req)) break;
    req.reset();
    if (msg.use_count() == 1) ctrl_spare_.push_back(std::move(msg));  // else a quarantine holds it
    ++reaped;
  }
  ctrl_out_.erase(ctrl_out_.begin(), ctrl_out_.begin() + long(reaped));
  std::shared_ptr<ControlMsg> msg;
  if (ctrl_spare_.empty()) {
    msg = std::make_shared<ControlMsg>(m);
  } else {
    msg = std::move(ctrl_spare_.back());
    ctrl_spare_.pop_back();
    *msg = m;
  }
  RequestPtr req = t_->isend(peer, Channel::control, msg.get(), sizeof(ControlMsg));
  req->counted = true;  // control bytes: not payload progress
  ledger_.sent(Coll(m.fp.coll), peer, true, sizeof(ControlMsg));
  ctrl_out_.emplace_back(std::move(msg), std::move(req));
}

namespace {

std::string rank_text(int r) { return "rank " + std::to_string(r); }

}  // namespace

// ": transport error with rank P (rank P died)" where a notice names a peer
// other than its origin, else nothing.
std::string Link::transport_peer_text(const ControlMsg& m) {
  if (ErrKind(m.kind) != ErrKind::transport || m.peer < 0 || m.peer == m.origin) return std::string();
  return ": transport error with " + rank_text(m.peer) +
         (m.peer_died ? " (" + rank_text(m.peer) + " died)" : std::string());
}

// A send or recv that failed at the origin (fail_p2p).
std::string Link::p2p_abort_text(const ControlMsg& m) {
  const ErrKind kind = ErrKind(m.kind);
  const bool send = Coll(m.fp.coll) == Coll::send;
  const std::string op = rank_text(m.origin) + "'s " + describe(m.fp);
  const std::string other = m.peer >= 0 ? rank_text(m.peer) : std::string("any rank");
  if (kind == ErrKind::mismatch)
    return op + " failed: the message from " + other + " did not match it (size and dtype must be equal)";
  if (kind == ErrKind::timeout)
    return op + " timed out waiting for " + (send ? other + " to receive it" : "a message from " + other);
  if (kind == ErrKind::aborted && m.interrupted) return op + " was interrupted (KeyboardInterrupt)";
  if (kind == ErrKind::aborted) return op + " ended when " + rank_text(m.origin) + " aborted the communicator";
  return op + " failed (" + std::string(kind == ErrKind::transport ? "transport error" : "error") + ")";
}

// Passed on by a rank that heard it through the shared-memory window
// (fail()): the notice carries that rank's call, not the origin's.
std::string Link::relayed_abort_text(const ControlMsg& m) {
  const ErrKind kind = ErrKind(m.kind);
  const char* what = kind == ErrKind::mismatch ? " found that the ranks disagree on a call"
                     : m.left                   ? " closed its communicator"
                     : kind == ErrKind::timeout ? " timed out"
                     : kind == ErrKind::aborted ? " aborted the communicator"
                                                : " failed";
  return rank_text(m.origin) + what + transport_peer_text(m) + " (" + rank_text(m.fp.rank) + " heard of it in " +
         describe(m.fp) + ")";
}

// A collective's failure at the origin, other than a mismatch.
std::string Link::origin_abort_text(const ControlMsg& m) {
  const ErrKind kind = ErrKind(m.kind);
  const std::string origin = rank_text(m.origin);
  if (kind == ErrKind::timeout)
    return origin + " timed out in " + describe(m.fp) +
           (m.peer >= 0 ? " waiting for " + rank_text(m.peer) : std::string());
  if (kind == ErrKind::aborted && m.interrupted)
    return origin + " was interrupted (KeyboardInterrupt) in " + describe(m.fp);
  if (kind == ErrKind::aborted)
    return origin + " aborted the communicator (" +
           (m.fp.seq ? "its last collective was " + describe(m.fp) : std::string("before its first collective")) +
           ")";
  // (a transport error with a peer, e.g. the peer died: the ranks that hear of it are told which peer)
  return origin + " failed in " + describe(m.fp) + transport_peer_text(m);
}

// What an ABORT notice says happened at its origin (for the ranks that hear
// of it, through the ring or the shared-memory window).
std::string Link::abort_text(const ControlMsg& m) const {
  if (coll_is_p2p(Coll(m.fp.coll)) && m.fp.rank == m.origin) return p2p_abort_text(m);
  if (m.fp.rank != m.origin) return relayed_abort_text(m);
  if (ErrKind(m.kind) != ErrKind::mismatch) return origin_abort_text(m);
  if (m.other.coll != 0 || m.other.seq != 0) return mismatch_text(m.fp, m.other);
  // The other call is unknown (found by a message, not a fingerprint).
  if (m.peer == rank_) return mismatch_text(m.fp, fp_);  // the message of another call was ours: we know both
  return rank_text(m.origin) + " in " + describe(m.fp) + " got a message from " + rank_text(m.peer) +
         " that belongs to another call: the ranks disagree on the call";
}

void Link::handle_control(const ControlMsg& m, int side) {
  const int from = side ? right() : left();
  if (m.magic != kMagic)
    throw RingError(ErrKind::transport, rank_, from, fp_.seq,
                    "corrupt control message from rank " + std::to_string(from));
  ledger_.received(Coll(m.fp.coll), from, true, sizeof(ControlMsg));
  if (m.type == kHeader) {
    left_seq_ = m.fp.seq;
    // We expected this call's header inside the left neighbour's first
    // payload message, but it came on its own: the left runs another call.
    if (header_inline_ && side == 0 && m.fp.seq == fp_.seq) check_call(m.fp, from);
    early_headers_.push_back(m);
    return;
  }
  if (m.type == kLeft) {  // a neighbour closed its communicator after its call m.fp.seq
    if (m.origin >= 0 && m.origin < size_) {
      if (peer_left_.empty()) peer_left_.assign(size_t(size_), 0);
      peer_left_[size_t(m.origin)] = m.fp.seq + 1;
    }
    throw_if_left();  // (in a later call only: one still finishing its last call goes on)
    return;
  }
  // An ABORT notice travelling around the ring: fail with the origin's reason.
  received_abort_ = std::make_unique<ControlMsg>(m);
  abort_from_ = from;
  const ErrKind kind = ErrKind(m.kind);
  const std::string why = abort_text(m);
  RingError e(kind == ErrKind::mismatch ? ErrKind::mismatch : ErrKind::aborted, rank_, m.origin, fp_.seq,
              why + " (reported to rank " + std::to_string(rank_) + " through the ring)");
  e.origin = m.origin;
  e.cause = kind;
  // (the peer the origin named, second-hand, as the window tells it)
  if (m.peer != m.origin) e.origin_peer = m.peer;
  e.peer_died = m.peer_died != 0;
  e.about = m.about;
  throw e;
}

void Link::throw_if_left() {
  for (size_t p = 0; p < peer_left_.size(); ++p)
    if (peer_left_[p] != 0 && fp_.seq >= peer_left_[p]) throw_left(int(p), peer_left_[p]);
}

void Link::throw_left(int peer, uint64_t left) {
  throw_peer_left(rank_, peer, fp_.seq, left_words(peer, left, fp_.seq), describe(fp_));
}

void Link::leave(uint64_t last_seq) noexcept {
  if (aborted_ || size_ == 1) return;
  try {
    if (window_) {
      window_->leave(last_seq);
      return;
    }
    ControlMsg notice;
    notice.type = kLeft;
    notice.fp = fp_;
    notice.fp.seq = last_seq;
    notice.fp.rank = rank_;
    notice.origin = rank_;
    for (int side = 0; side < (size_ == 2 ? 1 : 2); ++side) send_control(notice, side ? left() : right());
    // Sent, not only posted (a transport may hold a message until progressed
    // again, and nothing of this link runs after this): within a bound, as
    // a neighbour that is gone never takes it.
    const auto deadline = Clock::now() + std::chrono::milliseconds(500);
    for (auto& out : ctrl_out_)
      while (out.second && !out.second->done && !t_->test(*out.second) && Clock::now() < deadline) {
      }
  } catch (const std::exception&) {
  }
}

void Link::begin(const Fingerprint& fp, bool header_inline) {
  if (aborted_) throw RingError(ErrKind::aborted, rank_, -1, fp.seq, "communicator was aborted: " + abort_reason_);
  fp_ = fp;
  fp_.rank = rank_;
  stamp_ = stamp_of(fp_) & stamp_mask_;
  coll_ = Coll(fp.coll);
  header_inline_ = header_inline;
  if (window_) window_->announce(fp_);
  // Normally empty (drain() or fail() emptied it); a request left by a
  // collective that ended some other way must still not be freed under MPI.
  bool kept = false;
  for (auto& r : live_)
    if (r && !r->done && !t_->cancel(*r)) {
      quarantine(std::move(r), true);
      kept = true;
    }
  // The quarantined requests keep the old memory; this call must not reuse
  // (or resize) any of it.
  if (kept) mem_ = std::make_shared<Memory>();
  live_.clear();
  told_.clear();
  heard_.clear();
  fp_told_.clear();
  fp_used_ = fp_sent_ = 0;
  progress_.reset();
  if (size_ == 1) return;
  throw_if_left();
  // A failure the ring reported while this rank was away (a straggler):
  // raise it now, before anything is posted. Only after a pause: polling
  // costs an MPI progress call, and a rank issuing back to back hears of a
  // failure within its next wait anyway.
  const auto now = Clock::now();
  if (now - last_end_ > std::chrono::milliseconds(1)) poll_control();

  if (header_inline) {
    // The stamps are the header; but a left neighbour that runs another
    // call may have sent one on its own, already here (it arrived while we
    // waited in an earlier call): check it now, or nothing would.
    check_early_header();
    return;
  }
  ControlMsg mine;
  mine.type = kHeader;
  mine.fp = fp_;
  send_control(mine, right());
  header_checked_ = false;  // checked lazily: see await_header()
}

void Link::await_header() {
  if (header_checked_ || size_ == 1) return;
  header_checked_ = true;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.timeout_s));
  while (early_headers_.empty()) {
    const auto now = Clock::now();
    publish_wait(left(), 1, "its header", now);
    // Still waiting while the message is handled: an ABORT throws in there,
    // and the flight record must say what this rank was waiting for when
    // the ring failed (the left neighbour's header), not that it waited for none.
    const int got = wait_or_control(nullptr, now, now + timeout);
    if (got < 0) throw_wait_failure(got, control_request(0), "its header", -1, -1);
    progress_.waiting.store(0, std::memory_order_relaxed);
  }
  ControlMsg theirs = early_headers_.front();
  early_headers_.erase(early_headers_.begin());
  check_call(theirs.fp, left());
}

// A header of this call that the left neighbour sent on its own and that
// is already here (early_headers_): take it and check it.
void Link::check_early_header() {
  for (size_t i = 0; i < early_headers_.size(); ++i)
    if (early_headers_[i].fp.seq == fp_.seq) {
      const Fingerprint theirs = early_headers_[i].fp;
      early_headers_.erase(early_headers_.begin() + long(i));
      check_call(theirs, left());
      return;
    }
}

void Link::poll_control() {
  if (aborted_) return;
  t_->check_async();
  if (size_ == 1) return;
  progress_p2p();
  if (t_->interrupted()) throw_aborted(control_request(0), false);
  // One test per message and side: cheap enough for the start of a collective.
  for (int side = 0; side < (size_ > 2 ? 2 : 1); ++side)
    while (ctrl_req_[side] && t_->test(*ctrl_req_[side])) take_control(side);
}

void Link::check_call(const Fingerprint& theirs, int peer) {
  if (same_call(fp_, theirs)) return;
  throw_mismatch(peer, &theirs, mismatch_text(fp_, theirs));
}

// Per-peer all_to_all: `peer` sends a block of `theirs` bytes where this
// rank expects `mine` (none of it landed).
[[noreturn]] void Link::throw_block_sizes(int peer, size_t theirs, size_t mine) {
  throw_mismatch(peer, nullptr,
                 "ranks disagree on an all_to_all block: rank " + std::to_string(peer) + " sends " +
                     std::to_string(theirs) + " bytes to rank " + std::to_string(rank_) + ", which expects " +
                     std::to_string(mine) + " bytes from it (its out_splits[" + std::to_string(peer) + "]) in " +
                     describe(fp_) + "; none of it landed");
}

// The ABORT notice fail() forwards (with the other call when known), then the error.
[[noreturn]] void Link::throw_mismatch(int peer, const Fingerprint* theirs, const std::string& text) {
  ControlMsg notice;
  notice.type = kAbort;
  notice.fp = fp_;
  if (theirs) notice.other = *theirs;
  notice.origin = rank_;
  notice.kind = int32_t(ErrKind::mismatch);
  notice.peer = peer;
  received_abort_ = std::make_unique<ControlMsg>(notice);
  throw RingError(ErrKind::mismatch, rank_, peer, fp_.seq, text);
}

bool Link::first_to(int peer, bool exact) {
  if (peer == right() && !header_inline_ && !stamp_mask_ && !exact) return false;  // our header vouches for us there
  for (int p : told_)
    if (p == peer) return false;
  told_.push_back(peer);
  return true;
}

bool Link::first_from(int peer, bool exact) {
  if (peer == left() && !header_inline_ && !exact) return false;  // checked by await_header()
  for (int p : heard_)
    if (p == peer) return false;
  heard_.push_back(peer);
  return true;
}

// Fingerprints live in Link memory (never the stack), which a quarantined
// request keeps alive if the collective fails meanwhile; a deque, so earlier
// slots stay put.
Fingerprint* Link::fp_slot(std::deque<Fingerprint>& slots, size_t& used) {
  if (slots.size() <= used) slots.resize(used + 1);
  return &slots[used++];
}

Request* Link::send(int peer, const void* buf, size_t bytes, int unit) {
  if (bytes == 0) return nullptr;
  return send_exact_impl(peer, buf, bytes, unit, false);
}

Request* Link::send_exact(int peer, const void* buf, size_t bytes, int unit) {
  return send_exact_impl(peer, buf, bytes, unit, true);
}

// A hash of the call's stamp and the size: a block of another size carries
// another stamp (a 1 in 2^32 chance, or the transport's stamp bits, that
// two sizes share one, as two calls may).
uint32_t Link::pair_stamp(size_t bytes) const {
  uint64_t h = (uint64_t(stamp_) << 32) ^ uint64_t(bytes) ^ 0x9e3779b97f4a7c15ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return uint32_t(h) & stamp_mask_;
}

Request* Link::send_exact_impl(int peer, const void* buf, size_t bytes, int unit, bool exact) {
  const bool first = first_to(peer, exact);  // (with stamps too: told_ lists every peer sent to)
  if (first && !stamp_mask_) {
    // On its own, in host memory on the check channel, just before the
    // payload; the receiver reads it before it posts the payload's receive
    // (recv()). An exact message's size goes with it (to the neighbours too:
    // their header does not know it).
    Fingerprint* f = fp_slot(mem_->fp_out, fp_sent_);
    *f = fp_;
    if (exact) f->block_bytes = int64_t(bytes);
    live_.push_back(t_->isend(peer, Channel::check, f, kFpBytes));
    live_.back()->counted = true;  // control bytes: not payload progress
    ledger_.sent(coll_, peer, true, kFpBytes);
  }
  live_.push_back(t_->isend(peer, Channel::data, buf, bytes, unit, exact ? pair_stamp(bytes) : stamp_));
  ledger_.sent(coll_, peer, false, bytes);
  return live_.back().get();
}

Request* Link::recv(int peer, void* buf, size_t bytes, int unit) {
  if (bytes == 0) return nullptr;
  return recv_exact_impl(peer, buf, bytes, unit, false);
}

Request* Link::recv_exact(int peer, void* buf, size_t bytes, int unit) {
  return recv_exact_impl(peer, buf, bytes, unit, true);
}

Request* Link::recv_exact_impl(int peer, void* buf, size_t bytes, int unit, bool exact) {
  await_header();
  if (!stamp_mask_ && first_from(peer, exact)) {
    // No stamps (device memory): wait for the peer's fingerprint (host
    // memory, check channel) and check it before the payload's receive is
    // posted, like the left neighbour's header (a device transfer of another
    // size could not be stopped once issued). The left neighbour's header
    // was checked above, so a disagreement there is caught before this
    // waits. This blocks until the peer posts its first send to us: every
    // schedule (pairwise.h, naive.cpp) posts its sends to a peer before its
    // receives from it, or has nothing else to post; one that received first
    // from a peer doing the same would wait here until the deadline.
    Fingerprint* f;
    Request* fr = recv_fingerprint(peer, &f);
    wait(fr, "its call's fingerprint");
    if (!plausible(*f, peer))
      throw_mismatch(peer, nullptr,
                     "ranks disagree on a collective call: rank " + std::to_string(rank_) + " in " + describe(fp_) +
                         " got a message from rank " + std::to_string(peer) +
                         " that does not belong to this call (it runs another count or algorithm)");
    check_call(*f, peer);
    if (exact && f->block_bytes != int64_t(bytes)) throw_block_sizes(peer, size_t(f->block_bytes), bytes);
  }
  // With stamps the transport takes only a message of this call (no byte of
  // another call's lands here); one of another call fails the wait.
  live_.push_back(t_->irecv(peer, Channel::data, buf, bytes, unit, exact ? pair_stamp(bytes) : stamp_));
  ledger_.received(coll_, peer, false, bytes);
  return live_.back().get();
}

// A fingerprint sent on its own: into a slot of Link memory, counted as control.
Request* Link::recv_fingerprint(int peer, Fingerprint** slot) {
  *slot = fp_slot(mem_->fp_in, fp_used_);
  live_.push_back(t_->irecv(peer, Channel::check, *slot, kFpBytes));
  live_.back()->counted = true;  // control bytes: not payload progress
  ledger_.received(coll_, peer, true, kFpBytes);
  return live_.back().get();
}

// Our fingerprint to `peer` on the check channel, once per call (with
// stamps: after a failure, or when its message was found to be another call's).
void Link::send_fingerprint(int peer) {
  for (int p : fp_told_)
    if (p == peer) return;
  fp_told_.push_back(peer);
  Fingerprint* f = fp_slot(mem_->fp_out, fp_sent_);
  *f = fp_;
  fp_sends_.push_back(t_->isend(peer, Channel::check, f, kFpBytes));
  ledger_.sent(coll_, peer, true, kFpBytes);
}

// A payload message from `peer` belongs to another call (its stamp, or its
// size): exchange fingerprints with it on the check channel, so the error,
// and the ABORT notice every other rank hears it from, name both calls.
// The peer sends its own when it finds ours foreign too (two ranks: each
// finds the other's), or when it fails, which a rank whose left neighbour
// disagrees does at its header check. Bounded: without it within
// kNameWaitS, the error names our call only.
[[noreturn]] void Link::throw_foreign_message(const Request& r, const std::string& unnamed) {
  const int peer = r.peer;
  Fingerprint* f = nullptr;
  RequestPtr in;
  int got = -1;
  auto withdraw = [&] {
    if (in && !in->done && !t_->cancel(*in)) quarantine(std::move(in), false);
  };
  try {
    // A left neighbour that sent its header on its own (it runs another
    // algorithm) is named by it: already here, or while we wait
    // (handle_control); an ABORT notice ends the wait too.
    if (peer == left()) check_early_header();
    send_fingerprint(peer);
    f = fp_slot(mem_->fp_in, fp_used_);
    in = t_->irecv(peer, Channel::check, f, kFpBytes);
    const auto now = Clock::now();
    const auto deadline = now + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(std::min(opts_.timeout_s, kNameWaitS)));
    do got = wait_or_control(in.get(), Clock::now(), deadline);  // polls Ctrl-C
    while (got == kControl);
  } catch (const RingError&) {
    withdraw();
    if (received_abort_) throw;  // named by a header, or an ABORT notice
  } catch (const std::exception&) {
  }
  withdraw();
  if (got == 0) {
    ledger_.received(coll_, peer, true, kFpBytes);
    if (plausible(*f, peer) && !same_call(fp_, *f)) check_call(*f, peer);  // throws, naming both
  }
  throw_mismatch(peer, nullptr, unnamed);
}

// A receive that failed on a message of another call (transport.h:
// wrong_message): its stamp, or its size, is not this call's.
[[noreturn]] void Link::throw_wrong_message(const Request& r, const RingError& e) {
  // An exact message (per-peer all_to_all) of this call, but of another size
  // than this rank expects from that peer: its stamp is this call's mixed
  // with its own size (pair_stamp).
  if (stamp_mask_ && fp_.counts == kPerPeer && r.found_bytes != r.bytes && r.stamp == pair_stamp(r.found_bytes))
    throw_block_sizes(r.peer, r.found_bytes, r.bytes);
  if (stamp_mask_ && r.stamp != stamp_ && !(fp_.counts == kPerPeer && r.stamp == pair_stamp(r.bytes))) {
    char stamps[64];
    std::snprintf(stamps, sizeof stamps, "call stamp %08x, this call's %08x", unsigned(r.stamp), unsigned(stamp_));
    throw_foreign_message(r, "ranks disagree on a collective call: rank " + std::to_string(rank_) + " in " +
                                 describe(fp_) + " got a message from rank " + std::to_string(r.peer) +
                                 " that belongs to another call (" + stamps + ")");
  }
  // Both sides of a message derive its size from the call, so a message of
  // another size means the sender runs another call (or another algorithm).
  const std::string text = "ranks disagree on a collective call: rank " + std::to_string(rank_) + " in " +
                           describe(fp_) + " got a message of another size from rank " + std::to_string(r.peer) +
                           " (" + e.what() +
                           "): every rank must issue the same collectives with the same count, dtype and algorithm";
  if (stamp_mask_) throw_foreign_message(r, text);  // names the peer's call
  // A left neighbour that sent its header on its own (another algorithm):
  // it was sent first, so it is usually here by now.
  if (r.peer == left() && size_ > 1) {
    poll_control();
    check_early_header();
  }
  throw_mismatch(r.peer, nullptr, text);
}

void Link::counted(const Request& r) {
  if (r.counted) return;
  const_cast<Request&>(r).counted = true;
  // A payload message of this call from the left neighbour: it has started
  // this call (only this call's messages complete a receive: its stamp, or
  // the fingerprint checked first). peer_note() says so.
  if (!r.is_send && r.peer == left()) left_data_seq_ = fp_.seq;
  // Only this thread writes: a plain read-modify-write, no locked instruction.
  auto& c = r.is_send ? progress_.bytes_sent : progress_.bytes_received;
  c.store(c.load(std::memory_order_relaxed) + r.bytes, std::memory_order_relaxed);
}

int Link::wait_for(Request* const* reqs, int n, Clock::time_point now, Clock::time_point deadline) {
  // Ranks of one host are watched too: a peer process that died is named
  // within a slice, not at the deadline (a transport between processes of
  // one host, UCX's shared memory for one, may never notice).
  const bool watch = window_ || !pids_.empty();  // (an in-process window tells a peer that left)
  // Not one wait to the deadline even when no receive is pending now: another
  // thread may post one meanwhile (an irecv while an async collective waits).
  if (!interrupt_check_ && !watch && !p2p_progress_) return t_->wait_any(reqs, n, deadline);
  progress_p2p();
  auto next_check = now + kInterruptSlice;
  Clock::duration p2p_slice = kP2PSlice;
  auto next_p2p = now + p2p_slice;
  for (;;) {
    int i = t_->wait_any(reqs, n, std::min({deadline, next_check, p2p_progress_ ? next_p2p : next_check}));
    if (i != -1) return i;
    now = Clock::now();
    if (now >= deadline) return i;
    if (p2p_progress_ && now >= next_p2p) {
      progress_p2p();
      p2p_slice = std::min<Clock::duration>(2 * p2p_slice, kInterruptSlice);
      next_p2p = now + p2p_slice;
    }
    if (now < next_check) continue;
    next_check = now + kInterruptSlice;
    if (interrupt_check_ && (*interrupt_check_)()) return kUserInterrupt;
    if (watch) throw_if_dead(reqs, n);
  }
}

void Link::throw_if_dead(Request* const* reqs, int n) {
  for (int i = 0; i < n; ++i) {
    if (!reqs[i] || reqs[i]->done || reqs[i]->peer < 0) continue;
    const std::string death = death_of(reqs[i]->peer);
    if (!death.empty())
      throw_peer_died(rank_, reqs[i]->peer, fp_.seq,
                      death + " while rank " + std::to_string(rank_) + " waited for it in " + describe(fp_) +
                          " (its process is gone)");
    // A peer that closed its communicator (ShmWindow::leave): alive, but
    // it will never join this call. (Point-to-point ops are numbered apart
    // from the collectives, and one may wait for a message sent before.)
    const std::string left = window_ && !coll_is_p2p(coll_) ? window_->left_note(reqs[i]->peer, fp_.seq) : "";
    if (!left.empty()) throw_peer_left(rank_, reqs[i]->peer, fp_.seq, left, describe(fp_));
  }
}

void Link::watch_processes(std::vector<int> pids) {
  if (!pids_.empty() || fp_.seq != 0) throw_invalid("watch_processes: once, before the first collective");
  for (int pid : pids)
    if (pid > 0) {
      pids_ = std::move(pids);
      return;
    }
}

std::string Link::death_of(int peer) const {
  if (window_) return window_->death_of(peer);
  if (peer < 0 || size_t(peer) >= pids_.size() || pids_[peer] <= 0 || !process_gone(pids_[peer])) return "";
  return died(peer, pids_[peer]);
}

int Link::wait_or_control(Request* r, Clock::time_point now, Clock::time_point deadline) {
  Request* reqs[3] = {r, ctrl_req_[0].get(), ctrl_req_[1].get()};
  const int got = wait_for(reqs, 3, now, deadline);
  if (got < 1) return got;
  take_control(got - 1);  // a neighbour said something: header of a later call, or ABORT
  return kControl;
}

void Link::publish_wait(int peer, int waiting, const char* what, Clock::time_point since) {
  progress_.peer.store(peer, std::memory_order_relaxed);
  progress_.waiting.store(waiting, std::memory_order_relaxed);
  progress_.what.store(what, std::memory_order_relaxed);
  progress_.wait_since.store(since.time_since_epoch().count(), std::memory_order_relaxed);
}

void Link::wait(Request* r, const char* what, int step, int segment) {
  if (!r) return;
  if (!r->done && !quick_wait(r)) slow_wait(r, what, step, segment);
  counted(*r);
}

// The small-message case: the request completes within the transport's
// first polls. No clock, no progress stores; false when it did not. Only
// the request itself is polled: the control streams (a later call's header,
// an ABORT) are posted receives that progress on their own and are rare, so
// slow_wait() and the next begin() see to them; testing them here too cost
// each poll two more MPI progress calls. With 4 ranks on 2 cores, where a
// small collective costs the CPU every waiting rank burns, 8 B took 9.6-11.4
// against 11.2-11.4 us per call (bench/cpu_per_call.py, alternated).
bool Link::quick_wait(Request* r) {
  int i;
  try {
    i = t_->wait_any(&r, 1, Clock::time_point::min());
  } catch (const RingError& e) {
    rethrow_wait_error(*r, e);
  }
  return i == 0;  // else -1 (not yet) or kInterrupted: the full wait sees to it
}

void Link::slow_wait(Request* r, const char* what, int step, int segment) {
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.timeout_s));
  auto now = Clock::now();
  progress_.step.store(step, std::memory_order_relaxed);
  progress_.segment.store(segment, std::memory_order_relaxed);
  publish_wait(r->peer, r->is_send ? 2 : 1, what, now);
  for (;;) {
    int got;
    try {
      got = wait_or_control(r, now, now + timeout);
    } catch (const RingError& e) {
      rethrow_wait_error(*r, e);
    }
    now = Clock::now();
    if (got == 0) break;
    if (got < 0) throw_wait_failure(got, *r, what, step, segment);
  }
  progress_.waiting.store(0, std::memory_order_relaxed);
}

std::string Link::peer_report(int peer) {
  if (peer_state_) {
    std::string s = peer_state_(peer);
    if (!s.empty()) return " Rank " + std::to_string(peer) + ": " + s + ".";
  }
  return "";
}

// What is known of the left neighbour's progress, from what came from it:
// its header (sent at the start of a call), a payload message of this call
// (counted()), its announcements in the window (every call, at its start).
// Only what these show is said: with inline headers (two ranks, pairwise
// algorithms) no header comes, and "has not announced any collective yet"
// was said of a rank 73 calls in; a rank in this call that stopped was
// said to have announced #74 but "not reached #74".
std::string Link::peer_note(int peer) {
  std::string report = peer_report(peer);
  if (!report.empty()) return report;
  if (peer != left() || !fp_.seq) return "";
  const std::string who = "Rank " + std::to_string(peer);
  if (left_seq_ > fp_.seq) return " " + who + " has gone on to #" + std::to_string(left_seq_) + " (its header arrived).";
  if (left_seq_ == fp_.seq) return " " + who + " has started this call (its header arrived).";
  if (left_data_seq_ == fp_.seq) return " " + who + " has started this call (a message of it arrived).";
  if (window_ && window_->has_member(peer))
    return ShmWindow::announced(peer, window_->latest_call_of(peer), fp_.seq, "(announced in shared memory)");
  const uint64_t seen = std::max(left_seq_, left_data_seq_);
  if (seen == 0) return " No header or message from rank " + std::to_string(peer) + " has arrived in any collective yet.";
  return " The newest call rank " + std::to_string(peer) + " is known to have started is #" + std::to_string(seen) +
         " (a header or message of it arrived); nothing shows it has started #" + std::to_string(fp_.seq) + ".";
}

// A receive that failed on a message of another size or call is a mismatch
// (the ranks disagree on the call); anything else goes on as it is.
[[noreturn]] void Link::rethrow_wait_error(const Request& r, const RingError& e) {
  if (e.kind == ErrKind::transport && !r.is_send && r.wrong_message) throw_wrong_message(r, e);
  throw;  // (called from a handler: rethrows e)
}

// A wait ended without its request: the deadline passed, the communicator
// was aborted (Engine::abort), or Ctrl-C.
[[noreturn]] void Link::throw_wait_failure(int why, const Request& r, const char* what, int step, int segment) {
  if (why == kInterrupted) throw_aborted(r, false);
  if (why == kUserInterrupt) throw_aborted(r, true);
  throw_timeout(r, what, step, segment);
}

void Link::throw_timeout(const Request& r, const char* what, int step, int segment) {
  char where[96] = "";
  if (step >= 0) std::snprintf(where, sizeof where, " (step %d, segment %d)", step, segment);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", opts_.timeout_s);
  std::string msg = "timed out after " + std::string(secs) + " s in " + describe(fp_) + ": rank " +
                    std::to_string(rank_) + " waited for rank " + std::to_string(r.peer) + " to " +
                    (r.is_send ? "receive " : "send ") + what + where +
                    "; is that rank alive and calling the same collective?" + peer_note(r.peer);
  throw RingError(ErrKind::timeout, rank_, r.peer, fp_.seq, msg);
}

// Aborted while waiting on r: on purpose (Engine::abort), or by Ctrl-C
// (by_ctrl_c here, or marked earlier: mark_user_interrupt), which the ring
// is then told (fail()).
void Link::throw_aborted(const Request& r, bool by_ctrl_c) {
  if (by_ctrl_c) user_interrupted_ = true;
  throw RingError(ErrKind::aborted, rank_, r.peer, fp_.seq,
                  "rank " + std::to_string(rank_) +
                      (user_interrupted_ ? " was interrupted (KeyboardInterrupt) while " : " aborted the communicator while ") +
                      describe(fp_) + " waited for rank " + std::to_string(r.peer));
}

void Link::drain() {
  await_header();
  for (auto& r : live_) wait(r.get(), "the rest of this collective");
  live_.clear();
  // Our header must have left too, not only been posted: a transport may
  // keep a message until it is progressed again (UCX queues a send behind a
  // connection's first handshake), and the next call may wait elsewhere (in
  // the shared-memory window, or the engine between hosts of a hierarchical
  // collective) without progressing this transport, while the neighbour
  // waits for the header: a deadlock until the deadline. Done at once when
  // the send completed eagerly, as it nearly always has.
  for (auto& out : ctrl_out_)
    if (out.second && !out.second->done) wait(out.second.get(), "its header");
  last_end_ = Clock::now();
}

Request* Link::send_token(int peer) {
  live_.push_back(t_->isend(peer, Channel::data, nullptr, 0, -1, stamp_));
  ledger_.sent(coll_, peer, false, 0);
  return live_.back().get();
}

Request* Link::recv_token(int peer) {
  await_header();
  live_.push_back(t_->irecv(peer, Channel::data, nullptr, 0, -1, stamp_));
  ledger_.received(coll_, peer, false, 0);
  return live_.back().get();
}

void Link::begin_shared(const Fingerprint& fp) {
  if (aborted_) throw RingError(ErrKind::aborted, rank_, -1, fp.seq, "communicator was aborted: " + abort_reason_);
  fp_ = fp;
  fp_.rank = rank_;
  coll_ = Coll(fp.coll);
  progress_.reset();
  window_->announce(fp_);
}

std::shared_ptr<Hold> Link::fail(const RingError& e, const Fingerprint* call) {
  if (aborted_) return nullptr;
  aborted_ = true;
  abort_reason_ = e.what();
  t_->on_fail();
  withdraw_live();
  if (size_ == 1) return nullptr;
  const ControlMsg notice = abort_notice(e, call);
  publish_failure(notice, e, call);
  send_abort_notices(notice);
  std::shared_ptr<Hold> stalled = await_window_writers();
  send_fingerprints_to_told();
  return stalled;
}

// Withdraw everything still posted, so no late message lands in a buffer
// the caller gets back; what cannot be withdrawn keeps its memory in the
// quarantine (and holds the caller's arrays: hold()).
void Link::withdraw_live() {
  for (auto& r : live_)  // one that matched another call's message drains elsewhere: no hold on the caller's arrays
    if (r && !r->done && !t_->cancel(*r)) {
      const bool holds_caller_memory = !r->wrong_message;  // read before the move (argument order is unspecified)
      quarantine(std::move(r), holds_caller_memory);
    }
  live_.clear();
}

// The ABORT notice this rank sends: the one it received, else its own.
Link::ControlMsg Link::abort_notice(const RingError& e, const Fingerprint* call) const {
  if (received_abort_) return *received_abort_;
  // Heard elsewhere (through the shared-memory window, which names the
  // origin in e): pass the news on as the origin's, not as ours, so the
  // ranks that hear it from us first still name the rank it began at.
  const bool heard = !call && e.origin >= 0 && e.origin != rank_;
  ControlMsg notice;
  notice.type = kAbort;
  notice.fp = call ? *call : fp_;
  notice.fp.rank = rank_;
  notice.origin = heard ? e.origin : rank_;
  notice.kind = int32_t(heard ? e.cause : e.kind);
  notice.peer = heard ? e.origin_peer : e.peer;
  notice.interrupted = !heard && user_interrupted_ ? 1 : 0;  // (a Ctrl-C here is not the origin's)
  notice.peer_died = e.peer_died ? 1 : 0;
  notice.left = e.peer_left ? 1 : 0;
  notice.about = e.about;
  return notice;
}

// Ranks waiting in the shared-memory window hear it there (the first
// failure published wins), in the words the ring would use for news it
// passes on or a point-to-point op; a collective's own failure in full.
void Link::publish_failure(const ControlMsg& notice, const RingError& e, const Fingerprint* call) {
  if (!window_) return;
  const bool told = received_abort_ || call;
  window_->fail(told ? notice.origin : (e.origin >= 0 ? e.origin : rank_), told ? ErrKind(notice.kind) : e.cause,
                told ? abort_text(notice) : std::string(e.what()), fp_.seq, notice.peer, notice.peer_died != 0);
}

// Both ways round the ring (each rank forwards away from where it heard
// it), so one rank that is away (asleep, computing, a straggler) cannot
// hold the news back from the ranks beyond it: every waiting rank hears
// within one trip.
void Link::send_abort_notices(const ControlMsg& notice) {
  for (int side = 0; side < (size_ == 2 ? 1 : 2); ++side) {  // with two ranks, both sides are one peer
    const int peer = side ? left() : right();
    if (peer == notice.origin || peer == abort_from_) continue;
    try {
      send_control(notice, peer);  // best effort: the ring may already be broken
    } catch (const std::exception&) {
    }
  }
}

// Then (the notices need not wait for it) until no peer writes into this
// rank's arrays any more, so none lands after the failed call returns.
// Past the bound a stopped writer may still write: that call's arrays are
// held for good (its own claim: later calls, which fail at once, keep theirs).
std::shared_ptr<Hold> Link::await_window_writers() {
  if (!window_ || window_->await_writers()) return nullptr;
  auto stalled = std::make_shared<Hold>();
  stalled->pending.fetch_add(1);  // never released
  return stalled;
}

// With stamps, a peer that got a payload message from us may have found it
// belongs to another call: our fingerprint lets it name ours
// (throw_foreign_message). Host memory only, where the check channel is
// otherwise unused.
void Link::send_fingerprints_to_told() {
  if (!stamp_mask_) return;
  for (int peer : told_) {
    try {
      send_fingerprint(peer);
    } catch (const std::exception&) {
    }
  }
}

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void Link::trace_start_impl(Phase phase, int step, int send_peer, int send_chunk, size_t send_bytes,
                            int recv_peer, int recv_chunk, size_t recv_bytes) {
  open_step_ = TraceStep{};
  open_step_.seq = fp_.seq;
  open_step_.coll = fp_.coll;
  open_step_.dtype = fp_.dtype;
  open_step_.phase = int32_t(phase);
  open_step_.step = step;
  open_step_.rank = rank_;
  open_step_.send_peer = send_peer;
  open_step_.send_chunk = send_chunk;
  open_step_.send_bytes = send_bytes;
  open_step_.recv_peer = recv_peer;
  open_step_.recv_chunk = recv_chunk;
  open_step_.recv_bytes = recv_bytes;
  open_step_.t_start_ns = now_ns();
}

void Link::trace_finish_impl(const void* values, size_t bytes) {
  open_step_.t_end_ns = now_ns();
  if (tracer_->values() && values && bytes && !device_)  // device memory: not readable here
    open_step_.values.assign(static_cast<const char*>(values), static_cast<const char*>(values) + bytes);
  tracer_->add(std::move(open_step_));
}

void Link::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (device_)
    device_->copy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

char* Link::scratch(int which, size_t bytes) {
  if (device_) return device_->scratch(which, bytes);
  auto& s = mem_->scratch[which];
  if (s.size() < bytes) s.resize(bytes);
  return s.data();
}

}  // namespace ringcomm
