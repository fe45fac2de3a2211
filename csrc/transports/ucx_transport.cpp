#include "transports/ucx_transport.h"

#include "transports/ucx_api.h"
#include "core/eager_p2p.h"

#ifdef RINGCOMM_HAVE_UCX

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

namespace ringcomm {

namespace {

// A UCP tag, 64 bits:
//
//   63..62   61 .............. 32   31 ............... 0
//   channel  sender's rank          stamp (data) / user tag (p2p) / 0
//
// The sender's rank is in the tag because UCP matches on the tag alone, not
// on the endpoint a message came through: a receive from one peer uses the
// full mask, an any-source p2p receive masks the rank out and reads the
// sender back from the tag it got. Channels never match each other's
// receives (a collective's receive never takes a p2p message), and on the
// data channel the stamp is part of the match: a message of another call
// never lands in this call's buffer.
constexpr int kChannelShift = 62;
constexpr int kRankShift = 32;
constexpr ucp_tag_t kRankMask = ((ucp_tag_t(1) << 30) - 1) << kRankShift;
constexpr ucp_tag_t kLowMask = 0xffffffffull;
constexpr ucp_tag_t kFullMask = ~ucp_tag_t(0);
constexpr int kMaxRanks = 1 << 30;

ucp_tag_t make_tag(Channel ch, int sender, uint32_t low) {
  return (ucp_tag_t(ch) << kChannelShift) | (ucp_tag_t(sender) << kRankShift) | low;
}
int tag_sender(ucp_tag_t t) { return int((t & kRankMask) >> kRankShift); }

constexpr long kMinPolls = 64;  // polls before the clock is consulted at all
constexpr auto kYieldFor = std::chrono::milliseconds(2);  // of a wait, before it sleeps on the event fd

}  // namespace

// One mutex guards every UCP call on the worker (it is created
// UCS_THREAD_MODE_SERIALIZED). Why not UCS_THREAD_MODE_MULTI: it needs a UCX
// built with --enable-mt (the worker silently falls back otherwise), and our
// own sequences must be atomic anyway: a data receive's probe-then-cancel,
// a p2p take's probe-then-receive, the list of drains. The lock is held only
// for non-blocking calls (progress, post, probe), never across a wait, so the
// engine's thread and a user thread's point-to-point share it briefly.
// ucp_worker_signal (interrupt) is documented safe from any thread, unlocked.
struct UcxWorker {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int efd = -1;  // the worker's event fd (-1: none; waits then sleep in short steps)
  std::string address;      // every transport: for the peers on this host
  std::string net_address;  // network devices only: for the peers on other hosts
  std::mutex mu;
  // Messages discarded (a p2p message of the wrong size, a data message of
  // another call): received into a sink so that their sender's send
  // completes (a rendezvous send waits for a receive), freed once done.
  struct Drain {
    void* req;
    std::vector<char> sink;
  };
  std::vector<Drain> drains;  // guarded by mu
  // failed[p]: the status UCX reported when the endpoint to rank p failed
  // (UCS_OK while it works). Written by on_ep_error, which UCX calls inside
  // worker_progress, so under mu like every read. Sized once, before the
  // endpoints exist, and kept here rather than in the transport: the
  // callbacks' arguments point into it, and the worker outlives the transport.
  std::vector<ucs_status_t> failed;

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t st) {
    auto* slot = static_cast<ucs_status_t*>(arg);
    if (*slot == UCS_OK) *slot = st;  // the first error is the one that tells
  }

  ~UcxWorker() {
    const ucx::Api& a = ucx::api();
    for (auto& d : drains) a.request_free(d.req);  // UCX releases it when it ends (or with the worker)
    if (worker) a.worker_destroy(worker);
    drains.clear();  // only now: nothing writes into a sink after the worker is gone
    if (context) a.cleanup(context);
  }

  // Progress under mu: a bounded number of rounds, so a stream of arrivals
  // cannot hold the lock (and a user thread's p2p call) for long.
  void progress_locked() {
    const ucx::Api& a = ucx::api();
    for (int i = 0; i < 32 && a.worker_progress(worker) != 0; ++i) {
    }
    if (!drains.empty()) {
      auto done = [&](Drain& d) {
        if (a.request_check_status(d.req) == UCS_INPROGRESS) return false;
        a.request_free(d.req);
        return true;
      };
      drains.erase(std::remove_if(drains.begin(), drains.end(), done), drains.end());
    }
  }

  // Receive `msg` (probed with remove=1) into a sink and forget it.
  void drain_locked(ucp_tag_message_h msg, size_t bytes) {
    const ucx::Api& a = ucx::api();
    std::vector<char> sink(bytes + 1);
    ucp_request_param_t p{};
    void* r = a.tag_msg_recv_nbx(worker, sink.data(), bytes, msg, &p);
    if (r && !UCS_PTR_IS_ERR(r)) drains.push_back({r, std::move(sink)});
  }
};

namespace {

struct UcxRequest : Request {
  enum Kind { send, recv, take } kind = send;
  std::shared_ptr<UcxWorker> w;
  void* req = nullptr;            // UCX's request while in flight
  ucs_status_t status = UCS_OK;   // its final status once req is null
  size_t got = 0;                 // a receive: bytes of the message it took
  ucp_tag_t tag = 0;              // a receive: its full tag
  bool stamped = false;           // a data receive (can meet another call's message)
  // A message of another stamp is next from the peer: the receive was
  // cancelled, and if the cancel takes, that message is another call's.
  bool withdrawing = false;
  bool foreign = false;           // wrong_message for a message of another call (thrown again if asked)
  uint32_t foreign_stamp = 0;
  size_t foreign_bytes = 0;

  ~UcxRequest() override {
    if (!req) return;
    // Only reached once cancel() returned true or test() said done
    // (transport.h); freeing an unfinished one lets UCX release it later.
    std::lock_guard<std::mutex> g(w->mu);
    ucx::api().request_free(req);
  }

  // Under w->mu. True once complete (req released, status and got set).
  bool poll_locked() {
    if (!req) return true;
    const ucx::Api& a = ucx::api();
    ucs_status_t st;
    ucp_tag_recv_info_t info{};
    if (kind == recv) {
      st = a.tag_recv_request_test(req, &info);
    } else {
      st = a.request_check_status(req);
      info.length = bytes;
    }
    if (st == UCS_INPROGRESS) return false;
    a.request_free(req);
    req = nullptr;
    status = st;
    got = info.length;
    return true;
  }
};

class UcxTransport final : public Transport, public EagerP2P {
 public:
  UcxTransport(std::shared_ptr<UcxWorker> w, const std::vector<std::string>& addresses, int rank)
      : w_(std::move(w)), rank_(rank), size_(int(addresses.size())) {
    if (size_ < 1 || size_ >= kMaxRanks) throw_invalid("UCX transport: bad number of ranks " + std::to_string(size_));
    if (rank_ < 0 || rank_ >= size_) throw_invalid("UCX transport: rank out of range");
    const ucx::Api& a = ucx::api();
    std::lock_guard<std::mutex> g(w_->mu);
    eps_.assign(size_, nullptr);
    w_->failed.assign(size_, UCS_OK);
    for (int p = 0; p < size_; ++p) {
      ucp_ep_params_t ep{};
      // PEER error handling: a peer that dies (its connection reset, its
      // process gone) fails this endpoint and UCX calls on_ep_error, so a
      // wait for that peer ends at once instead of at the deadline. It also
      // limits UCP to transports that can report a failed peer.
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(addresses[p].data());
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &UcxWorker::on_ep_error;
      ep.err_handler.arg = &w_->failed[p];
      ucs_status_t st = a.ep_create(w_->worker, &ep, &eps_[p]);
      if (st != UCS_OK) {
        // No transport to that peer can report its failure (the user's
        // UCX_TLS / UCX_*_ERROR_HANDLING ruled them out; UCX says which on
        // stderr): an endpoint without, and the deadline as before.
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        st = a.ep_create(w_->worker, &ep, &eps_[p]);
      }
      if (st != UCS_OK) {
        close_endpoints_locked();
        throw RingError(ErrKind::transport, rank_, p, 0,
                        "ucp_ep_create to rank " + std::to_string(p) + " failed: " + ucx::status_text(st));
      }
    }
    // Spin before blocking only when every rank could have a core of its
    // own (the world's size bounds the ranks on this host): then a message
    // answers within microseconds and sleeping costs more. Ranks that
    // outnumber cores block at once, leaving the core to the peer.
    cpu_set_t cpus;
    long cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    spin_ = size_ <= cores ? std::chrono::microseconds(50) : std::chrono::microseconds(0);
    name_ = describe_locked();
  }

  ~UcxTransport() override {
    std::lock_guard<std::mutex> g(w_->mu);
    discard_unexpected_locked();
    close_endpoints_locked();
    discard_unexpected_locked();  // what arrived while the endpoints flushed (over TCP: often the last of it)
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  uint32_t stamp_mask() const override { return 0xffffffffu; }

  RequestPtr isend(int peer, Channel ch, const void* buf, size_t bytes, int /*unit*/, uint32_t stamp) override {
    auto r = make(peer, UcxRequest::send, bytes);
    post_send(*r, buf, make_tag(ch, rank_, ch == Channel::data ? stamp : 0));
    return r;
  }

  RequestPtr irecv(int peer, Channel ch, void* buf, size_t bytes, int /*unit*/, uint32_t stamp) override {
    auto r = make(peer, UcxRequest::recv, bytes);
    r->stamped = ch == Channel::data;
    r->tag = make_tag(ch, peer, r->stamped ? stamp : 0);
    const ucx::Api& a = ucx::api();
    ucp_tag_recv_info_t info{};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO;
    p.recv_info.tag_info = &info;
    std::lock_guard<std::mutex> g(w_->mu);
    // A peer that is gone sends nothing more; but what it sent before (its
    // last messages, then its process exited) is still taken.
    if (w_->failed[peer] != UCS_OK && !a.tag_probe_nb(w_->worker, r->tag, kFullMask, 0, &info))
      throw_peer_failed(peer, "posted a receive from it");
    void* q = a.tag_recv_nbx(w_->worker, buf, bytes, r->tag, kFullMask, &p);
    if (UCS_PTR_IS_ERR(q)) fail(peer, "ucp_tag_recv_nbx", UCS_PTR_STATUS(q));
    if (q) {
      r->req = q;
    } else {  // matched a message that had already arrived in full
      r->got = info.length;
    }
    return r;
  }

  // ---- point-to-point: a message is taken once it has arrived (probe with
  // remove, then receive exactly that message), never posted blind ----
  RequestPtr p2p_send(int peer, const void* buf, size_t bytes, uint32_t tag) override {
    auto r = make(peer, UcxRequest::send, bytes);
    post_send(*r, buf, make_tag(Channel::p2p, rank_, tag));
    return r;
  }

  RequestPtr p2p_take(int peer, uint32_t tag, void* buf, size_t bytes) override {
    std::lock_guard<std::mutex> g(w_->mu);
    return take_locked(peer, tag, buf, bytes);
  }

  bool p2p_peek(int peer, uint32_t tag, int* src, size_t* bytes, uint32_t* found) override {
    std::lock_guard<std::mutex> g(w_->mu);
    w_->progress_locked();
    ucp_tag_recv_info_t info{};
    // Any tag: only the channel and (for a given peer) the sender's bits must match.
    const ucp_tag_t mask = tag == kAnyTag ? p2p_mask(peer) & ~kLowMask : p2p_mask(peer);
    if (!ucx::api().tag_probe_nb(w_->worker, p2p_tag(peer, tag == kAnyTag ? 0 : tag), mask, 0, &info)) return false;
    *src = tag_sender(info.sender_tag);
    *bytes = info.length;
    if (found) *found = uint32_t(info.sender_tag & kLowMask);
    return true;
  }

  bool p2p_send_now(int peer, const void* buf, size_t bytes, uint32_t tag, RequestPtr* pending) override {
    auto r = make(peer, UcxRequest::send, bytes);
    post_send(*r, buf, make_tag(Channel::p2p, rank_, tag));  // (raises on an immediate failure)
    if (!r->req) return true;
    *pending = std::move(r);
    return false;
  }

  int p2p_take_now(int peer, uint32_t tag, void* buf, size_t bytes, RequestPtr* pending) override {
    std::lock_guard<std::mutex> g(w_->mu);
    auto r = take_locked(peer, tag, buf, bytes);
    if (!r) return kP2PNone;
    auto& u = static_cast<UcxRequest&>(*r);
    if (!u.wrong_message && u.poll_locked() && u.status == UCS_OK) return u.peer;
    *pending = std::move(r);  // still arriving, discarded, or failed: wait_any says which
    return kP2PPending;
  }

  // Progress the worker; spin briefly (a peer on its own core answers in
  // microseconds), then yield the core for a while (a peer that shares it,
  // ranks outnumbering cores, runs at once: sleeping instead would make
  // every message pay a wake-up), then sleep on the worker's event fd in short slices, so a
  // rank far behind its peers does not cost them a core. interrupt()
  // signals the worker, which wakes the fd.
  int wait_any(Request* const* reqs, int n, Clock::time_point deadline) override {
    Clock::time_point start{};
    for (long iter = 0;; ++iter) {
      const int i = poll_once(reqs, n, iter);
      if (i >= 0) return i;
      if (iter < kMinPolls) continue;
      if (interrupted()) return kInterrupted;
      const auto now = Clock::now();
      if (iter == kMinPolls) start = now;
      if (now >= deadline) return -1;
      if (now - start < spin_) continue;
      if (now - start < kYieldFor) {
        sched_yield();
        continue;
      }
      block(deadline);
    }
  }

  // One poll of wait_any's: progress the worker, then the first request
  // complete (its index), else -1.
  int poll_once(Request* const* reqs, int n, long iter) {
    std::lock_guard<std::mutex> g(w_->mu);
    w_->progress_locked();
    for (int i = 0; i < n; ++i) {
      auto* r = static_cast<UcxRequest*>(reqs[i]);
      if (r && complete_locked(*r)) return i;
    }
    // Waiting longer than a message takes: is a message of another call
    // what comes next from a peer we wait for? (Not on every poll: a
    // probe walks the unexpected queue.)
    if (iter >= kMinPolls && (iter & 15) == 0)
      for (int i = 0; i < n; ++i) {
        auto* r = static_cast<UcxRequest*>(reqs[i]);
        if (r && !r->done && r->stamped && r->req && !r->withdrawing) look_for_foreign_locked(*r);
      }
    return -1;
  }

  // Whether `r` is complete (finishing it if it just completed); throws
  // what ended it where that was a failure.
  bool complete_locked(UcxRequest& r) {
    if (r.foreign) throw_foreign(r);  // asked again
    if (r.done) return true;
    if (!r.poll_locked()) {
      // A posted receive belongs to the worker, not to an endpoint:
      // the peer's failure does not end it, so look at the peer.
      if (w_->failed[r.peer] != UCS_OK) throw_peer_failed(r.peer, "waited for it");
      return false;
    }
    finish_locked(r);  // throws on a failure or a wrong message
    return true;
  }

  // A send cannot be withdrawn (UCX may be reading its buffer, and a
  // cancelled send would leave its receiver waiting): false until complete.
  // A receive is cancelled; it ends at once unless a message already
  // matched it and is still arriving.
  bool cancel(Request& req) override {
    auto& r = static_cast<UcxRequest&>(req);
    std::lock_guard<std::mutex> g(r.w->mu);
    auto ended = [&] {
      r.w->progress_locked();
      if (!r.poll_locked()) return false;
      if (r.withdrawing && r.status == UCS_ERR_CANCELED) drain_foreign_locked(r);
      return true;
    };
    if (ended()) return true;
    if (r.kind == UcxRequest::send) return false;
    if (!r.withdrawing) ucx::api().request_cancel(r.w->worker, r.req);  // (a withdrawing one is cancelled already)
    const auto until = Clock::now() + std::chrono::milliseconds(100);
    while (Clock::now() < until)
      if (ended()) return true;
    return false;  // the quarantine tests it later
  }

  bool test(Request& req) override {
    auto& r = static_cast<UcxRequest&>(req);
    std::lock_guard<std::mutex> g(r.w->mu);
    r.w->progress_locked();  // never throws: the library is loaded, and no call here reports by exception
    if (!r.poll_locked()) return false;
    if (r.withdrawing && r.status == UCS_ERR_CANCELED) drain_foreign_locked(r);
    return true;
  }

 protected:
  void wake() override { ucx::api().worker_signal(w_->worker); }

 private:
  std::unique_ptr<UcxRequest> make(int peer, UcxRequest::Kind kind, size_t bytes) {
    if (peer < 0 || peer >= size_) throw_invalid("peer rank out of range: " + std::to_string(peer));
    auto r = std::make_unique<UcxRequest>();
    r->w = w_;
    r->kind = kind;
    r->peer = peer;
    r->is_send = kind == UcxRequest::send;
    r->bytes = bytes;
    return r;
  }

  void post_send(UcxRequest& r, const void* buf, ucp_tag_t tag) {
    ucp_request_param_t p{};
    std::lock_guard<std::mutex> g(w_->mu);
    if (w_->failed[r.peer] != UCS_OK) throw_peer_failed(r.peer, "posted a send to it");
    void* q = ucx::api().tag_send_nbx(eps_[r.peer], buf, r.bytes, tag, &p);
    if (UCS_PTR_IS_ERR(q)) fail(r.peer, "ucp_tag_send_nbx", UCS_PTR_STATUS(q));
    r.req = q;  // null: sent at once (the buffer may be reused)
  }

  static ucp_tag_t p2p_tag(int peer, uint32_t tag) {
    return make_tag(Channel::p2p, peer == kAnySource ? 0 : peer, tag);
  }
  static ucp_tag_t p2p_mask(int peer) { return peer == kAnySource ? ~kRankMask : kFullMask; }

  RequestPtr take_locked(int peer, uint32_t tag, void* buf, size_t bytes) {
    if (peer != kAnySource && (peer < 0 || peer >= size_)) throw_invalid("peer rank out of range: " + std::to_string(peer));
    const ucx::Api& a = ucx::api();
    w_->progress_locked();
    ucp_tag_recv_info_t info{};
    // remove=1: the message is ours alone (another thread's any-source take
    // cannot receive it between the probe and the receive).
    ucp_tag_message_h msg = a.tag_probe_nb(w_->worker, p2p_tag(peer, tag), p2p_mask(peer), 1, &info);
    if (!msg) {
      // Nothing from that peer, and nothing will come. (A message it sent
      // before it died is taken above first.)
      if (peer != kAnySource && w_->failed[peer] != UCS_OK) throw_peer_failed(peer, "waited for a message from it");
      return nullptr;
    }
    auto r = make(tag_sender(info.sender_tag), UcxRequest::take, info.length);
    if (info.length != bytes) {  // none of it reaches buf
      w_->drain_locked(msg, info.length);
      r->done = true;
      r->wrong_message = true;
      return r;
    }
    ucp_request_param_t p{};
    void* q = a.tag_msg_recv_nbx(w_->worker, buf, bytes, msg, &p);
    if (UCS_PTR_IS_ERR(q)) fail(r->peer, "ucp_tag_msg_recv_nbx", UCS_PTR_STATUS(q));
    r->req = q;
    r->got = bytes;
    return r;
  }

  // r just completed: its outcome, as wait_any reports it.
  void finish_locked(UcxRequest& r) {
    r.done = true;
    // A request UCX ended because its peer failed (a send on the failed
    // endpoint ends with its error, or UCS_ERR_CANCELED) names the peer.
    if (r.status != UCS_OK && r.status != UCS_ERR_MESSAGE_TRUNCATED &&
        (w_->failed[r.peer] != UCS_OK || peer_lost(r.status)))
      throw_peer_failed(r.peer, "waited for it", r.status);
    if (r.kind == UcxRequest::send) {
      if (r.status != UCS_OK) fail(r.peer, "send", r.status);
      return;
    }
    if (r.withdrawing && r.status == UCS_ERR_CANCELED) {
      drain_foreign_locked(r);
      throw_foreign(r);
    }
    r.stamp = uint32_t(r.tag & kLowMask);
    if (r.status == UCS_ERR_MESSAGE_TRUNCATED) {  // a larger message than posted (its first bytes landed)
      r.wrong_message = true;
      throw RingError(ErrKind::transport, rank_, r.peer, 0,
                      "UCX message from rank " + std::to_string(r.peer) + " larger than the " +
                          std::to_string(r.bytes) + " bytes expected (truncated)");
    }
    if (r.status != UCS_OK) fail(r.peer, "receive", r.status);
    if (r.got != r.bytes) {
      r.wrong_message = true;
      throw RingError(ErrKind::transport, rank_, r.peer, 0,
                      "UCX message of " + std::to_string(r.got) + " bytes from rank " + std::to_string(r.peer) +
                          ", expected " + std::to_string(r.bytes));
    }
  }

  // The oldest unmatched data message from r's peer carries another stamp
  // while r waits: the peer has moved past this call's message to r, or
  // never sent it. Which, only a cancel tells: it takes only if no message
  // matched r (one that matched, its data still arriving, completes r as
  // usual). UCP keeps one sender's messages in order, so a message of this
  // call sent before the other would have matched r first.
  void look_for_foreign_locked(UcxRequest& r) {
    ucp_tag_recv_info_t info{};
    const ucp_tag_t mask = kFullMask & ~kLowMask;
    if (!ucx::api().tag_probe_nb(w_->worker, make_tag(Channel::data, r.peer, 0), mask, 0, &info)) return;
    const uint32_t stamp = uint32_t(info.sender_tag & kLowMask);
    if (stamp == uint32_t(r.tag & kLowMask)) return;
    r.withdrawing = true;
    r.foreign_stamp = stamp;
    r.foreign_bytes = info.length;
    r.found_bytes = info.length;
    ucx::api().request_cancel(w_->worker, r.req);
  }

  // r was cancelled before any message matched it: the message found is
  // another call's. It drains into a sink (so its sender's send completes),
  // never into r's buffer. Never throws (test() calls it).
  void drain_foreign_locked(UcxRequest& r) {
    r.withdrawing = false;
    r.foreign = true;
    r.wrong_message = true;
    r.stamp = r.foreign_stamp;
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg =
        ucx::api().tag_probe_nb(r.w->worker, make_tag(Channel::data, r.peer, r.foreign_stamp), kFullMask, 1, &info);
    if (msg) r.w->drain_locked(msg, info.length);
  }

  [[noreturn]] void throw_foreign(UcxRequest& r) {
    r.done = true;
    char what[200];
    std::snprintf(what, sizeof what,
                  "UCX message of %zu bytes and stamp %u from rank %d, expected %zu bytes and stamp %u "
                  "(it did not touch the buffer)",
                  r.foreign_bytes, unsigned(r.foreign_stamp), r.peer, r.bytes, unsigned(r.tag & kLowMask));
    throw RingError(ErrKind::transport, rank_, r.peer, 0, what);
  }

  // Statuses that say the peer, not this request, is the problem.
  static bool peer_lost(ucs_status_t st) {
    return st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT || st == UCS_ERR_UNREACHABLE;
  }

  // Under mu. The words the shared-memory window uses for a dead peer, with
  // what UCX saw (the endpoint's error; else that of the request).
  [[noreturn]] void throw_peer_failed(int peer, const char* doing, ucs_status_t st = UCS_OK) {
    if (w_->failed[peer] != UCS_OK) st = w_->failed[peer];
    throw_peer_died(rank_, peer, 0,
                    "rank " + std::to_string(peer) + " died (or became unreachable) while rank " +
                        std::to_string(rank_) + " " + doing + ": UCX reported " + ucx::status_text(st) +
                        " on the endpoint to rank " + std::to_string(peer));
  }

  // Under mu (the statuses the calls above return are read under it).
  [[noreturn]] void fail(int peer, const char* what, ucs_status_t st) {
    if (peer >= 0 && (w_->failed[peer] != UCS_OK || peer_lost(st))) throw_peer_failed(peer, "waited for it", st);
    throw RingError(ErrKind::transport, rank_, peer, 0,
                    std::string("UCX ") + what + " with rank " + std::to_string(peer) + " failed: " +
                        ucx::status_text(st));
  }

  // Sleep until the worker has an event, a slice passes, or the deadline.
  // Arm under the lock (UCS_ERR_BUSY: events are pending, progress again),
  // poll without it, so a user thread's p2p call is never held up.
  void block(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int slice = int(std::max<long long>(0, std::min<long long>(left, 2)));  // a missed event costs 2 ms at most
    if (w_->efd < 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      return;
    }
    ucs_status_t st;
    {
      std::lock_guard<std::mutex> g(w_->mu);
      st = ucx::api().worker_arm(w_->worker);
    }
    if (st == UCS_ERR_BUSY) return;
    if (st != UCS_OK) {  // no wake-ups after all: short sleeps
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      return;
    }
    if (interrupted()) return;  // signalled before the arm: do not sleep through it
    pollfd pfd{w_->efd, POLLIN, 0};
    poll(&pfd, 1, slice);
  }

  // Messages no receive will take (a failed call's, a peer's after an
  // abort): received into sinks, so no sender's rendezvous waits for them
  // and UCX does not warn about unmatched descriptors at worker_destroy.
  void discard_unexpected_locked() {
    w_->progress_locked();
    ucp_tag_recv_info_t info{};
    for (int i = 0; i < 100000; ++i) {
      ucp_tag_message_h msg = ucx::api().tag_probe_nb(w_->worker, 0, 0, 1, &info);
      if (!msg) break;
      w_->drain_locked(msg, info.length);
    }
  }

  // Close every endpoint with a flush (messages still queued are sent), but
  // never wait long: a peer that is gone would make exit hang. A failed
  // endpoint has nothing to flush to: it is released at once (FORCE). Under mu.
  void close_endpoints_locked() {
    const ucx::Api& a = ucx::api();
    std::vector<void*> closing;
    for (size_t i = 0; i < eps_.size(); ++i) {
      ucp_ep_h& ep = eps_[i];
      if (!ep) continue;
      ucp_request_param_t p{};
      if (i < w_->failed.size() && w_->failed[i] != UCS_OK) {
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      }
      void* q = a.ep_close_nbx(ep, &p);
      if (q && !UCS_PTR_IS_ERR(q)) closing.push_back(q);
      ep = nullptr;
    }
    const auto until = Clock::now() + std::chrono::seconds(1);
    while (!closing.empty() && Clock::now() < until) {
      w_->progress_locked();
      closing.erase(std::remove_if(closing.begin(), closing.end(),
                                   [&](void* q) {
                                     if (a.request_check_status(q) == UCS_INPROGRESS) return false;
                                     a.request_free(q);
                                     return true;
                                   }),
                    closing.end());
    }
    for (void* q : closing) a.request_free(q);  // UCX finishes (or drops) them with the worker
  }

  // "ucx(1.22.0, tcp/sysv/posix)": the version and the transports UCP chose
  // for the endpoints to the other ranks, in first-seen order.
  std::string describe_locked() {
    const ucx::Api& a = ucx::api();
    std::vector<std::string> tls;
    for (size_t p = 0; p < eps_.size(); ++p) {
      ucp_ep_h ep = eps_[p];
      if (int(p) == rank_ || !ep) continue;  // (this rank's own endpoint: whatever UCX picks for itself)
      ucp_transport_entry_t entries[16];
      ucp_ep_attr_t attr{};
      attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
      attr.transports.entries = entries;
      attr.transports.num_entries = 16;
      attr.transports.entry_size = sizeof(ucp_transport_entry_t);
      if (a.ep_query(ep, &attr) != UCS_OK) continue;
      for (unsigned i = 0; i < attr.transports.num_entries; ++i) {
        const char* t = entries[i].transport_name;
        if (t && *t && std::find(tls.begin(), tls.end(), t) == tls.end()) tls.push_back(t);
      }
    }
    std::string s = "ucx(" + std::string(a.get_version_string());
    for (size_t i = 0; i < tls.size(); ++i) s += (i ? "/" : ", ") + tls[i];
    return s + ")";
  }

  std::shared_ptr<UcxWorker> w_;
  std::vector<ucp_ep_h> eps_;  // eps_[p]: to rank p (this rank's own: UCX's self transport)
  int rank_, size_;
  Clock::duration spin_{0};
  std::string name_;
};

}  // namespace

namespace {

// Settings for this context only (Open MPI's own UCX context in the process
// keeps its own), each unless the user set its UCX_ variable: UCX's own
// variables win.
//
// The endpoints ask for PEER error handling (UcxTransport), and UCP then
// uses only transports that can report a failed peer. The shared-memory
// ones (sysv, posix) say they can only when told to (UCX 1.20: their
// ERROR_HANDLING setting, off by default), so without it two ranks of one
// host would talk over loopback TCP. They learn of a dead peer from UCP's
// keepalive, which checks each endpoint once an interval (20 s by default),
// set to 1 s here, for a check per endpoint and second. It watches only
// endpoints that have carried traffic from this side: over sysv/cma (UCX
// 1.20) a ring's left neighbour, to which a rank never sends, went
// unreported for the whole 5 s deadline. So the engine watches the pids of
// this host's ranks itself (Link::watch_processes, from shm.attach). (TCP
// sees a dead process at once: its kernel resets the connection.)
//
// cma (a process reading another's memory directly: large messages within a
// host, 2 to 5 times faster here at 4 to 16 MiB than through sysv) is kept
// by CMA_MEMORY_INVALIDATE: in PEER mode UCP uses a zero-copy transport only
// if it can revoke the peer's access to a buffer whose request ended in
// error, which cma cannot really do (a peer reads or writes by pid, with no
// key to revoke). It does not need to here: a cma peer is on this host and
// is only declared failed when its process is gone (keepalive's check), and
// a process that is gone touches no memory; a cma copy is a system call
// that ends before the call returns, never a transfer left running.
void peer_failure_config(ucp_config_t* config) {
  static const char* const kSettings[][2] = {{"SYSV_ERROR_HANDLING", "y"},
                                             {"POSIX_ERROR_HANDLING", "y"},
                                             {"CMA_MEMORY_INVALIDATE", "y"},
                                             {"KEEPALIVE_INTERVAL", "1s"}};
  const ucx::Api& a = ucx::api();
  for (const auto& kv : kSettings) {
    if (std::getenv(("UCX_" + std::string(kv[0])).c_str())) continue;
    // An older UCX without the setting refuses it: it then lacks what the
    // setting turns on, and the deadline remains the fallback.
    (void)a.config_modify(config, kv[0], kv[1]);
  }
}

// The worker's address with `flags`: 0 for every transport it has, or
// UCP_WORKER_ADDRESS_FLAG_NET_ONLY for its network devices alone (what a
// peer on another host is given: an endpoint made from it can use no
// shared-memory transport, even where both "hosts" share one kernel).
std::string query_address(ucp_worker_h worker, unsigned flags) {
  const ucx::Api& a = ucx::api();
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
  attr.address_flags = flags;
  ucs_status_t st = a.worker_query(worker, &attr);
  if (st != UCS_OK) throw RingError(ErrKind::transport, -1, -1, 0, "ucp_worker_query failed: " + ucx::status_text(st));
  std::string out(reinterpret_cast<const char*>(attr.address), attr.address_length);
  a.worker_release_address(worker, attr.address);
  return out;
}

}  // namespace

std::shared_ptr<UcxWorker> make_ucx_worker() {
  const ucx::Api& a = ucx::api();
  auto w = std::make_shared<UcxWorker>();
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  // ucp_init is an inline wrapper of ucp_init_version; a null config reads
  // UCX_* from the environment. The API version asked for is the older of
  // our headers' and the library's: Open MPI's wheel brings UCX 1.20, whose
  // tag API is all we use, and asking it for 1.22 only prints a warning.
  unsigned major = 0, minor = 0, release = 0;
  a.get_version(&major, &minor, &release);
  if (major > UCP_API_MAJOR || (major == UCP_API_MAJOR && minor > UCP_API_MINOR)) {
    major = UCP_API_MAJOR;
    minor = UCP_API_MINOR;
  }
  ucp_config_t* config = nullptr;
  ucs_status_t st = a.config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) throw RingError(ErrKind::transport, -1, -1, 0, "ucp_config_read failed: " + ucx::status_text(st));
  peer_failure_config(config);
  st = a.init_version(major, minor, &params, config, &w->context);
  a.config_release(config);
  if (st != UCS_OK) throw RingError(ErrKind::transport, -1, -1, 0, "ucp_init failed: " + ucx::status_text(st));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // UcxWorker::mu serializes every call
  st = a.worker_create(w->context, &wp, &w->worker);
  if (st != UCS_OK) throw RingError(ErrKind::transport, -1, -1, 0, "ucp_worker_create failed: " + ucx::status_text(st));
  if (a.worker_get_efd(w->worker, &w->efd) != UCS_OK) w->efd = -1;
  w->address = query_address(w->worker, 0);
  w->net_address = query_address(w->worker, UCP_WORKER_ADDRESS_FLAG_NET_ONLY);
  return w;
}

std::string ucx_worker_address(const UcxWorker& w, bool net_only) { return net_only ? w.net_address : w.address; }

std::unique_ptr<Transport> make_ucx_transport(std::shared_ptr<UcxWorker> worker,
                                              const std::vector<std::string>& addresses, int rank) {
  if (!worker) throw_invalid("this UCX worker was already given to an engine");
  return std::make_unique<UcxTransport>(std::move(worker), addresses, rank);
}

std::string ucx_version() { return ucx::version(); }

}  // namespace ringcomm

#else  // !RINGCOMM_HAVE_UCX: every entry point says why there is no UCX

namespace ringcomm {

struct UcxWorker {};

namespace {
[[noreturn]] void no_ucx() {
  std::string why;
  ucx::available(&why);
  throw RingError(ErrKind::transport, -1, -1, 0, "UCX is not available: " + why);
}
}  // namespace

std::shared_ptr<UcxWorker> make_ucx_worker() { no_ucx(); }
std::string ucx_worker_address(const UcxWorker&, bool) { no_ucx(); }
std::unique_ptr<Transport> make_ucx_transport(std::shared_ptr<UcxWorker>, const std::vector<std::string>&, int) {
  no_ucx();
}
std::string ucx_version() { return ucx::version(); }

}  // namespace ringcomm

#endif
