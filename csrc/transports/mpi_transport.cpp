#include "transports/mpi_transport.h"
#include "transports/recycled.h"
#include "core/eager_p2p.h"

#include <mpi.h>
#include <sched.h>

#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace ringcomm {

namespace {

// Every MPI call goes through this check: a failure becomes a RingError that
// names the call, the rank and the peer.
#define RC_MPI(call, peer)                                                                      \
  do {                                                                                          \
    int rc_ = (call);                                                                           \
    if (rc_ != MPI_SUCCESS) throw RingError(ErrKind::transport, rank_, (peer), 0,               \
                                            mpi_error(#call, rc_, __FILE__, __LINE__));         \
  } while (0)

std::string mpi_error(const char* call, int rc, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "error %d", rc);
  return std::string(call) + " failed: " + std::string(text, len) + " (" + file + ":" + std::to_string(line) + ")";
}

struct MpiRequest : Request, Recycled<MpiRequest> {
  MPI_Request req = MPI_REQUEST_NULL;
  int tag = -1;  // a data receive: the one tag (its call's stamp) it matches
  // A message of another tag is next from the peer: the receive was
  // cancelled, and if the cancel takes, that message is another call's.
  bool withdrawing = false;
  int foreign_tag = -1;
  int foreign_bytes = 0;
  std::vector<char> sink;  // the other call's message drains here
};

constexpr long kMinPolls = 64;  // polls before the clock is consulted at all
// control and check; data messages travel on a communicator of their own
// with their call's stamp as the tag, and a receive names the tag: the
// messages of one call from one peer match in order, and a message of
// another call matches no receive of this one.
constexpr int kTag[int(Channel::kCount)] = {0, 0x5244, 0x5245, 0};  // data, control, check, p2p (unused: own comm)
constexpr size_t kMaxMessage = size_t(1) << 30;

class MpiTransport final : public Transport, public EagerP2P {
 public:
  explicit MpiTransport(MPI_Comm parent) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) throw_invalid("MPI is not initialized (import mpi4py.MPI first)");
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
      throw_invalid("ringcomm needs MPI_THREAD_MULTIPLE (mpi4py's default), but MPI was initialized with "
                    "thread level " + std::to_string(provided) +
                    "; do not lower mpi4py.rc.thread_level before importing mpi4py.MPI");
    rank_ = -1;
    RC_MPI(MPI_Comm_dup(parent, &comm_), -1);
    RC_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), -1);
    RC_MPI(MPI_Comm_dup(comm_, &data_), -1);
    RC_MPI(MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN), -1);
    // Point-to-point on a communicator of its own: a collective's receive
    // (which probes its peer for messages of other calls) never sees one.
    RC_MPI(MPI_Comm_dup(comm_, &p2p_), -1);
    RC_MPI(MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN), -1);
    // Stamps are tags: as many low bits as every tag up to MPI_TAG_UB allows
    // (at least 15 by the standard; 31 in Open MPI and MPICH).
    int* ub = nullptr;
    int found = 0;
    RC_MPI(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found), -1);
    const uint32_t tag_ub = found && ub ? uint32_t(*ub) : 32767u;
    tag_ub_ = tag_ub;
    while (stamp_mask_ * 2 + 1 <= tag_ub && stamp_mask_ < 0x7fffffffu) stamp_mask_ = stamp_mask_ * 2 + 1;
    // Fewer bits would let a mismatch of equal message sizes pass too often
    // (1 in 2^bits): then no stamps, and Link sends fingerprints instead.
    if (stamp_mask_ < 0xffffffu) stamp_mask_ = 0;
    RC_MPI(MPI_Comm_rank(comm_, &rank_), -1);
    RC_MPI(MPI_Comm_size(comm_, &size_), -1);
    // Busy-poll only when every rank on this node has a core of its own:
    // then a yield (a syscall and a trip through the scheduler) costs more than
    // the message. When ranks outnumber cores, spinning steals the core the
    // peer needs, so yield at once.
    MPI_Comm node;
    RC_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), -1);
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    cpu_set_t cpus;
    long cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    spin_ = local <= cores ? std::chrono::microseconds(50) : std::chrono::microseconds(0);
  }
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm_free(&p2p_);
      MPI_Comm_free(&data_);
      MPI_Comm_free(&comm_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  RequestPtr isend(int peer, Channel ch, const void* buf, size_t bytes, int /*unit*/, uint32_t stamp) override {
    auto r = make(peer, true, bytes);
    if (ch == Channel::data)
      RC_MPI(MPI_Isend(buf, int(bytes), MPI_BYTE, peer, int(stamp & stamp_mask_), data_, &r->req), peer);
    else
      RC_MPI(MPI_Isend(buf, int(bytes), MPI_BYTE, peer, kTag[int(ch)], comm_, &r->req), peer);
    return r;
  }
  RequestPtr irecv(int peer, Channel ch, void* buf, size_t bytes, int /*unit*/, uint32_t stamp) override {
    auto r = make(peer, false, bytes);
    if (ch == Channel::data) {
      // Only a message of this call can match: one of another call, whatever
      // its size, never touches the buffer (a posted receive that matched a
      // larger message would be overrun: Open MPI's single-copy path writes
      // it in full).
      r->tag = int(stamp & stamp_mask_);
      RC_MPI(MPI_Irecv(buf, int(bytes), MPI_BYTE, peer, r->tag, data_, &r->req), peer);
    } else {
      RC_MPI(MPI_Irecv(buf, int(bytes), MPI_BYTE, peer, kTag[int(ch)], comm_, &r->req), peer);
    }
    return r;
  }
  uint32_t stamp_mask() const override { return stamp_mask_; }

  // ---- point-to-point: the tag is MPI's tag on p2p_; matched probes ----
  RequestPtr p2p_send(int peer, const void* buf, size_t bytes, uint32_t tag) override {
    auto r = make(peer, true, bytes);
    RC_MPI(MPI_Isend(buf, int(bytes), MPI_BYTE, peer, int(tag), p2p_, &r->req), peer);
    return r;
  }
  RequestPtr p2p_take(int peer, uint32_t tag, void* buf, size_t bytes) override {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    // Matched probe: the message is ours alone (another thread's any-source
    // receive cannot take it between the probe and the receive).
    RC_MPI(MPI_Improbe(peer == kAnySource ? MPI_ANY_SOURCE : peer, int(tag), p2p_, &flag, &msg, &st), peer);
    if (!flag) return nullptr;
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (size_t(got) != bytes) return discard(msg, st.MPI_SOURCE, got);  // none of it reaches buf
    auto r = make(st.MPI_SOURCE, false, size_t(got));
    RC_MPI(MPI_Imrecv(buf, got, MPI_BYTE, &msg, &r->req), r->peer);
    return r;
  }
  // A matched message of the wrong size: received into a sink and dropped;
  // the request comes back done, with wrong_message set.
  RequestPtr discard(MPI_Message& msg, int src, int got) {
    auto r = make(src, false, size_t(got));
    r->sink.resize(size_t(got) + 1);
    RC_MPI(MPI_Mrecv(r->sink.data(), got, MPI_BYTE, &msg, MPI_STATUS_IGNORE), r->peer);
    r->sink = std::vector<char>();
    r->done = true;
    r->wrong_message = true;
    return r;
  }
  bool p2p_send_now(int peer, const void* buf, size_t bytes, uint32_t tag, RequestPtr* pending) override {
    check(peer, bytes);
    MPI_Request q = MPI_REQUEST_NULL;
    RC_MPI(MPI_Isend(buf, int(bytes), MPI_BYTE, peer, int(tag), p2p_, &q), peer);
    int flag = 0;
    if (MPI_Test(&q, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) return true;
    auto r = make(peer, true, bytes);  // still in flight (or an error wait_any reports)
    r->req = q;
    *pending = std::move(r);
    return false;
  }
  int p2p_take_now(int peer, uint32_t tag, void* buf, size_t bytes, RequestPtr* pending) override {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    RC_MPI(MPI_Improbe(peer == kAnySource ? MPI_ANY_SOURCE : peer, int(tag), p2p_, &flag, &msg, &st), peer);
    if (!flag) return kP2PNone;
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (size_t(got) != bytes) {  // discarded as p2p_take does: none of it reaches buf
      *pending = discard(msg, st.MPI_SOURCE, got);
      return kP2PPending;
    }
    MPI_Request q = MPI_REQUEST_NULL;
    RC_MPI(MPI_Imrecv(buf, got, MPI_BYTE, &msg, &q), st.MPI_SOURCE);
    int done = 0;
    if (MPI_Test(&q, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) return st.MPI_SOURCE;
    auto r = make(st.MPI_SOURCE, false, size_t(got));
    r->req = q;
    *pending = std::move(r);
    return kP2PPending;
  }
  bool p2p_peek(int peer, uint32_t tag, int* src, size_t* bytes, uint32_t* found) override {
    int flag = 0;
    MPI_Status st;
    RC_MPI(MPI_Iprobe(peer == kAnySource ? MPI_ANY_SOURCE : peer, tag == kAnyTag ? MPI_ANY_TAG : int(tag), p2p_,
                      &flag, &st),
           peer);
    if (!flag) return false;
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    *src = st.MPI_SOURCE;
    *bytes = size_t(got);
    if (found) *found = uint32_t(st.MPI_TAG);
    return true;
  }
  uint32_t p2p_max_tag() const override { return tag_ub_; }
  size_t p2p_max_bytes() const override { return kMaxMessage; }

  // Poll with backoff: spin first (a neighbour on another core answers in
  // microseconds), then yield the core (ranks may outnumber cores), then
  // sleep briefly (a rank that is far behind should not cost a whole core).
  int wait_any(Request* const* reqs, int n, Clock::time_point deadline) override {
    Clock::time_point start{};  // taken once polling alone did not do (no clock on the fast path)
    for (long iter = 0;; ++iter) {
      for (int i = 0; i < n; ++i) {
        auto* r = static_cast<MpiRequest*>(reqs[i]);
        if (r && poll_request(*r)) return i;
      }
      if (iter < kMinPolls) continue;
      // Waiting longer than a message takes: is a message of another call
      // what comes next from a peer we wait for? (Not on every poll: a probe
      // that finds nothing is a progress call, and with more ranks than
      // cores each one may yield the core.)
      if ((iter & 15) == 0) look_for_foreign(reqs, n);
      if (interrupted()) return kInterrupted;
      const auto now = Clock::now();
      if (iter == kMinPolls) start = now;
      if (now >= deadline) return -1;
      back_off(now - start);
    }
  }

  // Whether `r` is complete, testing it once if it was not yet; throws what
  // ended it where that was a failure.
  bool poll_request(MpiRequest& r) {
    if (r.wrong_message && r.foreign_tag >= 0) throw_wrong_message(r);  // asked again
    if (r.done) return true;
    int flag = 0;
    MPI_Status st;
    st.MPI_TAG = -1;  // read below only where MPI set it (-1: no stamp)
    const int rc = MPI_Test(&r.req, &flag, &st);
    check_truncated(r, rc, st);
    RC_MPI(rc, r.peer);
    if (!flag) return false;
    r.done = true;
    if (!r.is_send) check_received(r, st);
    return true;
  }

  // A larger message than posted: it is over (its first bytes landed).
  void check_truncated(MpiRequest& r, int rc, const MPI_Status& st) {
    int cls = MPI_SUCCESS;
    if (rc != MPI_SUCCESS) MPI_Error_class(rc, &cls);
    if (cls != MPI_ERR_TRUNCATE && !(rc == MPI_ERR_IN_STATUS && st.MPI_ERROR == MPI_ERR_TRUNCATE)) return;
    r.done = true;
    r.wrong_message = true;
    r.stamp = uint32_t(st.MPI_TAG);
    throw RingError(ErrKind::transport, rank_, r.peer, 0,
                    "MPI message from rank " + std::to_string(r.peer) + " larger than the " +
                        std::to_string(r.bytes) + " bytes expected (truncated)");
  }

  // A receive that completed: withdrawn in time (a foreign message drained),
  // its stamp, and its size (a smaller message than posted is a failure).
  void check_received(MpiRequest& r, MPI_Status& st) {
    if (r.withdrawing) {
      int cancelled = 0;
      MPI_Test_cancelled(&st, &cancelled);
      if (cancelled) drain_foreign(r);  // throws
    }
    r.stamp = uint32_t(st.MPI_TAG);
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (size_t(got) == r.bytes) return;
    r.wrong_message = true;
    r.found_bytes = size_t(got);
    throw RingError(ErrKind::transport, rank_, r.peer, 0,
                    "MPI message of " + std::to_string(got) + " bytes from rank " + std::to_string(r.peer) +
                        ", expected " + std::to_string(r.bytes));
  }

  // look_for_foreign() for every receive still waiting on a stamped call.
  void look_for_foreign(Request* const* reqs, int n) {
    if (!stamp_mask_) return;
    for (int i = 0; i < n; ++i) {
      auto* r = static_cast<MpiRequest*>(reqs[i]);
      if (r && !r->done && r->tag >= 0 && !r->withdrawing) look_for_foreign(*r);
    }
  }

  // After the spin: yield the core for 2 ms, then sleep between polls.
  void back_off(Clock::duration waited) const {
    if (waited < spin_) return;
    if (waited < std::chrono::milliseconds(2)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  bool cancel(Request& req) override {
    auto& r = static_cast<MpiRequest&>(req);
    if (r.req == MPI_REQUEST_NULL || test(r)) return true;
    // A send cannot be withdrawn (MPI 4 deprecates MPI_Cancel for sends and
    // Open MPI's ob1 ignores it): once posted, the library reads the buffer
    // whenever the receiver asks for the data, however late. The caller
    // quarantines it with its memory.
    if (r.is_send) return false;
    MPI_Cancel(&r.req);
    // A cancelled receive completes at once, unless it already matched a
    // message still arriving; progress it briefly, then leave it to the
    // quarantine (never free a request MPI may still write through).
    const auto until = Clock::now() + std::chrono::milliseconds(100);
    while (Clock::now() < until) {
      if (test(r)) return true;
      sched_yield();
    }
    return false;
  }

  bool test(Request& req) override {
    auto& r = static_cast<MpiRequest&>(req);
    if (r.req == MPI_REQUEST_NULL) return true;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return false;  // MPI is gone: the request can never be freed
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&r.req, &flag, &st) != MPI_SUCCESS) {
      // An error completes the request as far as the buffer is concerned
      // only if MPI released it; otherwise keep it.
      return r.req == MPI_REQUEST_NULL;
    }
    if (flag && r.withdrawing) {  // cancelled after a probe, and wait_any did not see it end
      int cancelled = 0;
      MPI_Test_cancelled(&st, &cancelled);
      if (cancelled && start_drain(r)) return false;  // the other call's message drains: test again
    }
    return flag != 0;
  }

 private:
  // The next message from r's peer carries another tag while r waits:
  // the peer has moved past this call's message to r, or never sent it.
  // Which, only a cancel tells: it takes only if no message matched r (one
  // that matched, its data still arriving, completes r as usual). MPI keeps
  // one sender's messages in order for a probe that matches them all, so a
  // message of this call sent before the other would have been found first.
  void look_for_foreign(MpiRequest& r) {
    int flag = 0;
    MPI_Status st;
    RC_MPI(MPI_Iprobe(r.peer, MPI_ANY_TAG, data_, &flag, &st), r.peer);
    if (!flag || st.MPI_TAG == r.tag) return;
    r.withdrawing = true;
    r.foreign_tag = st.MPI_TAG;
    MPI_Get_count(&st, MPI_BYTE, &r.foreign_bytes);
    r.found_bytes = size_t(r.foreign_bytes);
    RC_MPI(MPI_Cancel(&r.req), r.peer);
  }
  // r was cancelled before any message matched it: the message found is
  // another call's. Receive it into r's own sink, so its sender's send
  // completes instead of waiting forever for a receive. False: nothing to
  // drain (it went since the probe). Never throws (test() calls it).
  bool start_drain(MpiRequest& r) {
    r.withdrawing = false;
    r.wrong_message = true;
    r.stamp = uint32_t(r.foreign_tag);
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(r.peer, r.foreign_tag, data_, &flag, &msg, &st) != MPI_SUCCESS || !flag) return false;
    MPI_Get_count(&st, MPI_BYTE, &r.foreign_bytes);
    r.found_bytes = size_t(r.foreign_bytes);
    r.sink.resize(size_t(r.foreign_bytes) + 1);
    return MPI_Imrecv(r.sink.data(), r.foreign_bytes, MPI_BYTE, &msg, &r.req) == MPI_SUCCESS;
  }
  [[noreturn]] void drain_foreign(MpiRequest& r) {
    r.done = !start_drain(r);  // draining: not done until the sink has it
    throw_wrong_message(r);
  }
  // A message of another call, draining into the sink.
  [[noreturn]] void throw_wrong_message(MpiRequest& r) {
    char what[200];
    std::snprintf(what, sizeof what,
                  "MPI message of %zu bytes and tag %u from rank %d, expected %zu bytes and tag %u "
                  "(it did not touch the buffer)",
                  size_t(r.foreign_bytes), unsigned(r.stamp), r.peer, r.bytes, unsigned(r.tag));
    int flag = 0;
    if (!r.done) MPI_Test(&r.req, &flag, MPI_STATUS_IGNORE);
    if (flag) r.done = true;
    throw RingError(ErrKind::transport, rank_, r.peer, 0, what);
  }

  void check(int peer, size_t bytes) const {
    if (peer < 0 || peer >= size_) throw_invalid("peer rank out of range: " + std::to_string(peer));
    if (bytes > kMaxMessage) throw_invalid("message larger than 1 GiB; lower the segment size");
  }
  std::unique_ptr<MpiRequest> make(int peer, bool is_send, size_t bytes) {
    check(peer, bytes);
    auto r = std::make_unique<MpiRequest>();
    r->peer = peer;
    r->is_send = is_send;
    r->bytes = bytes;
    return r;
  }
  MPI_Comm comm_ = MPI_COMM_NULL;  // control and check
  MPI_Comm data_ = MPI_COMM_NULL;  // payload, tagged with stamps
  MPI_Comm p2p_ = MPI_COMM_NULL;   // point-to-point, tagged with the user's tag (and dtype)
  uint32_t tag_ub_ = 32767u;
  uint32_t stamp_mask_ = 0;
  int rank_ = -1, size_ = 0;
  Clock::duration spin_{0};  // how long a wait busy-polls before yielding
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(uintptr_t comm_handle) {
  MPI_Comm comm;
  static_assert(sizeof(MPI_Comm) <= sizeof(uintptr_t), "MPI_Comm must fit in a pointer-sized handle");
  std::memcpy(&comm, &comm_handle, sizeof(MPI_Comm));
  return std::make_unique<MpiTransport>(comm);
}

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, len);
  auto nl = s.find_first_of("\n,");
  if (nl != std::string::npos) s.resize(nl);
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return s + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")";
}

}  // namespace ringcomm
