#include "transports/inproc_transport.h"
#include "transports/recycled.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

namespace ringcomm {

namespace {
constexpr size_t kEagerBytes = 256;

// One per rank: the thread of that rank sleeps here while waiting.
struct Waker {
  std::mutex m;
  std::condition_variable cv;
};

struct InprocRequest;

// A device message (payload between ranks that have a Device): matching
// happens on the host, the copy on the receiver's device. Shared by both
// requests, so either may go away first.
//   sender:   `ready` = point after the work that produced the data (isend);
//   receiver: waits for `ready`, enqueues the copy, records `consumed`, sets `copied`;
//   sender:   waits (on its device) for `consumed` before anything that
//             may overwrite its buffer: its request is done once `copied`.
struct DeviceHandoff {
  const void* src = nullptr;
  EventPtr ready, consumed;
  std::atomic<bool> copied{false};
  Waker* sender = nullptr;
};

// A message waiting for its receive: small ones own a copy of their bytes
// (their send request is already complete and may be gone); large ones point
// at the sender's request and buffer; device ones carry the handoff.
struct Message {
  InprocRequest* sender = nullptr;  // null for an eager or device message
  const void* src = nullptr;
  size_t bytes = 0;
  uint32_t stamp = 0;
  std::unique_ptr<char[]> copy;
  std::shared_ptr<DeviceHandoff> handoff;
};

// Unmatched sends and receives of one (sender, receiver, channel).
struct Queue {
  std::mutex m;
  std::deque<Message> sends;
  std::deque<InprocRequest*> recvs;
};

struct InprocRequest : Request, Recycled<InprocRequest> {
  void* dst = nullptr;  // recv: where the message goes
  Waker* owner = nullptr;
  Queue* queue = nullptr;
  std::atomic<bool> complete{false};  // host: transfer done; device recv: matched
  std::atomic<bool> size_error{false};  // matched a message of another size or stamp
  uint32_t expect = 0;                  // the stamp its message must carry
  std::shared_ptr<DeviceHandoff> handoff;  // device messages only
  EventPtr posted;  // device receive: the receiver's main queue when it was posted (the buffer is free after it)
};

void finish(InprocRequest* r) {
  std::lock_guard<std::mutex> g(r->owner->m);
  r->complete.store(true, std::memory_order_release);
  r->owner->cv.notify_all();
}

// Called with the queue's lock held: move the message, complete both sides.
// A device message is only paired here; its receiver enqueues the copy.
void match(const Message& msg, InprocRequest* recv) {
  recv->stamp = msg.stamp;
  if (msg.bytes != recv->bytes || msg.stamp != recv->expect) {
    recv->size_error = true;  // another call's message: none of it lands
    recv->found_bytes = msg.bytes;
  } else if (msg.handoff) {
    recv->handoff = msg.handoff;
  } else if (msg.bytes) {
    std::memcpy(recv->dst, msg.src, msg.bytes);
  }
  if (msg.sender) finish(msg.sender);
  finish(recv);
}
}  // namespace

class InprocWorld {
 public:
  explicit InprocWorld(int n) : n(n), wakers(n), queues(size_t(n) * n * size_t(Channel::kCount)) {
    for (auto& w : wakers) w = std::make_unique<Waker>();
    for (auto& q : queues) q = std::make_unique<Queue>();
  }
  Queue* queue(int src, int dst, Channel ch) {
    return queues[(size_t(src) * n + dst) * size_t(Channel::kCount) + size_t(ch)].get();
  }
  int n;
  std::vector<std::unique_ptr<Waker>> wakers;
  std::vector<std::unique_ptr<Queue>> queues;
};

std::shared_ptr<InprocWorld> make_inproc_world(int nranks) {
  if (nranks < 1) throw_invalid("in-process world needs at least one rank, got " + std::to_string(nranks));
  return std::make_shared<InprocWorld>(nranks);
}

namespace {
class InprocTransport final : public Transport {
 public:
  InprocTransport(std::shared_ptr<InprocWorld> w, int rank, std::shared_ptr<Device> dev)
      : w_(std::move(w)), rank_(rank), dev_(std::move(dev)) {}
  int rank() const override { return rank_; }
  int size() const override { return w_->n; }
  std::string name() const override { return dev_ ? "inproc(" + dev_->name() + ")" : "inproc"; }
  std::shared_ptr<Device> device() const override { return dev_; }
  uint32_t stamp_mask() const override { return 0xffffffffu; }

  RequestPtr isend(int peer, Channel ch, const void* buf, size_t bytes, int /*unit*/, uint32_t stamp) override {
    auto r = make(peer, true, bytes, w_->queue(rank_, peer, ch));
    Message msg;
    msg.src = buf;
    msg.bytes = bytes;
    msg.stamp = stamp;
    msg.sender = r.get();
    if (on_device(ch, bytes)) {
      // Paired on the host, copied by the receiver on its device (see DeviceHandoff).
      r->handoff = std::make_shared<DeviceHandoff>();
      r->handoff->src = buf;
      r->handoff->ready = dev_->record();
      r->handoff->sender = r->owner;
      msg.handoff = r->handoff;
      msg.sender = nullptr;
    }
    Queue* q = r->queue;
    std::lock_guard<std::mutex> g(q->m);
    if (!q->recvs.empty()) {
      InprocRequest* peer_recv = q->recvs.front();
      q->recvs.pop_front();
      match(msg, peer_recv);
    } else {
      if (bytes <= kEagerBytes && !msg.handoff) {  // buffered: the sender may reuse its buffer now
        msg.copy.reset(new char[bytes ? bytes : 1]);
        if (bytes) std::memcpy(msg.copy.get(), buf, bytes);
        msg.src = msg.copy.get();
        msg.sender = nullptr;
        finish(r.get());
      }
      q->sends.push_back(std::move(msg));
    }
    return r;
  }

  RequestPtr irecv(int peer, Channel ch, void* buf, size_t bytes, int /*unit*/, uint32_t stamp) override {
    auto r = make(peer, false, bytes, w_->queue(peer, rank_, ch));
    r->dst = buf;
    r->expect = stamp;
    if (on_device(ch, bytes)) r->posted = dev_->record();
    Queue* q = r->queue;
    std::lock_guard<std::mutex> g(q->m);
    if (!q->sends.empty()) {
      match(q->sends.front(), r.get());
      q->sends.pop_front();
    } else {
      q->recvs.push_back(r.get());
    }
    return r;
  }

  // ---- point-to-point: queued like any send; a receive takes the oldest
  // message of its tag, under the queue's lock (copied there: nothing is
  // left in flight) ----
  RequestPtr p2p_send(int peer, const void* buf, size_t bytes, uint32_t tag) override {
    auto r = make(peer, true, bytes, w_->queue(rank_, peer, Channel::p2p));
    Message msg;
    msg.src = buf;
    msg.bytes = bytes;
    msg.stamp = tag;
    msg.sender = r.get();
    {
      std::lock_guard<std::mutex> g(r->queue->m);
      if (bytes <= kEagerBytes) {  // buffered: the sender may reuse its buffer now
        msg.copy.reset(new char[bytes ? bytes : 1]);
        if (bytes) std::memcpy(msg.copy.get(), buf, bytes);
        msg.src = msg.copy.get();
        msg.sender = nullptr;
        finish(r.get());
      }
      r->queue->sends.push_back(std::move(msg));
    }
    Waker& w = *w_->wakers[peer];  // a receiver may be waiting for it (p2p_wait)
    std::lock_guard<std::mutex> g(w.m);
    w.cv.notify_all();
    return r;
  }

  RequestPtr p2p_take(int peer, uint32_t tag, void* buf, size_t bytes) override {
    const int n = w_->n;
    const int first = peer == kAnySource ? int(next_source_++ % unsigned(n)) : peer;
    for (int i = 0; i < (peer == kAnySource ? n : 1); ++i) {
      const int src = (first + i) % n;
      Queue* q = w_->queue(src, rank_, Channel::p2p);
      std::lock_guard<std::mutex> g(q->m);
      for (auto it = q->sends.begin(); it != q->sends.end(); ++it) {
        if (it->stamp != tag) continue;
        auto r = make(src, false, it->bytes, q);
        if (it->bytes == bytes) {
          if (bytes) std::memcpy(buf, it->src, bytes);
        } else {
          r->wrong_message = true;  // discarded: none of it lands
        }
        r->done = true;
        r->complete.store(true, std::memory_order_release);
        if (it->sender) finish(it->sender);
        q->sends.erase(it);
        return r;
      }
    }
    return nullptr;
  }

  bool p2p_peek(int peer, uint32_t tag, int* src, size_t* bytes, uint32_t* found) override {
    for (int s = 0; s < w_->n; ++s) {
      if (peer != kAnySource && s != peer) continue;
      Queue* q = w_->queue(s, rank_, Channel::p2p);
      std::lock_guard<std::mutex> g(q->m);
      for (const Message& m : q->sends)
        if (tag == kAnyTag || m.stamp == tag) {
          *src = s;
          *bytes = m.bytes;
          if (found) *found = m.stamp;
          return true;
        }
    }
    return false;
  }

  int wait_any(Request* const* reqs, int n, Clock::time_point deadline) override {
    Waker& w = *w_->wakers[rank_];
    std::unique_lock<std::mutex> lk(w.m);
    for (;;) {
      for (int i = 0; i < n; ++i) {
        auto* r = static_cast<InprocRequest*>(reqs[i]);
        if (!r) continue;
        if (r->done) return i;
        if (r->is_send && r->handoff) {  // device send: done once the receiver enqueued its copy
          if (!r->handoff->copied.load(std::memory_order_acquire)) continue;
          lk.unlock();  // device calls and the peer's waker lock: never under ours
          dev_->wait(r->handoff->consumed);  // later writes to the buffer wait for the copy
          r->done = true;
          return i;
        }
        if (r->complete.load(std::memory_order_acquire)) {
          if (r->size_error) {
            r->done = true;  // matched: the transport is done with its buffer
            r->wrong_message = true;
            throw RingError(ErrKind::transport, rank_, r->peer, 0,
                            "in-process message of another size or stamp from rank " + std::to_string(r->peer));
          }
          if (r->handoff) {
            lk.unlock();
            receive_on_device(*r);
          }
          r->done = true;
          return i;
        }
      }
      if (interrupted()) return kInterrupted;
      if (Clock::now() >= deadline) return -1;
      w.cv.wait_until(lk, deadline);
    }
  }

  void wake() override {
    Waker& w = *w_->wakers[rank_];
    std::lock_guard<std::mutex> g(w.m);
    w.cv.notify_all();
  }

  // In-process matching copies under the queue's lock, so an unmatched
  // request is withdrawn exactly and a matched one is already complete: the
  // buffer is never touched after this returns. (A device message's copy is
  // enqueued by the receiver on its own device; the Engine keeps the arrays
  // until queued device work has passed.)
  bool test(Request& req) override {
    auto& r = static_cast<InprocRequest&>(req);
    return r.done || r.complete.load(std::memory_order_acquire) || !queued(r);
  }

  bool cancel(Request& req) override {
    auto& r = static_cast<InprocRequest&>(req);
    std::lock_guard<std::mutex> g(r.queue->m);
    if (r.is_send) {
      for (auto it = r.queue->sends.begin(); it != r.queue->sends.end(); ++it)
        if (it->sender == &r || (r.handoff && it->handoff == r.handoff)) {
          r.queue->sends.erase(it);
          break;
        }
    } else {
      for (auto it = r.queue->recvs.begin(); it != r.queue->recvs.end(); ++it)
        if (*it == &r) {
          r.queue->recvs.erase(it);
          break;
        }
    }
    return true;
  }

 private:
  bool queued(InprocRequest& r) {
    std::lock_guard<std::mutex> g(r.queue->m);
    if (r.is_send) {
      for (const Message& m : r.queue->sends)
        if (m.sender == &r || (r.handoff && m.handoff == r.handoff)) return true;
      return false;
    }
    for (InprocRequest* q : r.queue->recvs)
      if (q == &r) return true;
    return false;
  }
  std::unique_ptr<InprocRequest> make(int peer, bool is_send, size_t bytes, Queue* q) {
    if (peer < 0 || peer >= w_->n) throw_invalid("peer rank out of range: " + std::to_string(peer));
    auto r = std::make_unique<InprocRequest>();
    r->peer = peer;
    r->is_send = is_send;
    r->bytes = bytes;
    r->owner = w_->wakers[rank_].get();
    r->queue = q;
    return r;
  }
  bool on_device(Channel ch, size_t bytes) const { return dev_ && ch == Channel::data && bytes > 0; }

  // The receiving half of a device message, on the receiver's thread (so its
  // device work stays in program order). The copy goes on the transfer queue,
  // after the sender's data is ready and after the receiver's last use of the
  // buffer (when the receive was posted), so it overlaps the reductions the
  // main queue is doing meanwhile; the main queue then waits for it, and the
  // sender learns when its buffer is free.
  void receive_on_device(InprocRequest& r) {
    DeviceHandoff& h = *r.handoff;
    dev_->transfer_wait(h.ready);
    dev_->transfer_wait(r.posted);
    dev_->transfer_copy(r.dst, h.src, r.bytes);
    EventPtr copied = dev_->transfer_record();
    dev_->wait(copied);
    h.consumed = copied;
    std::lock_guard<std::mutex> g(h.sender->m);
    h.copied.store(true, std::memory_order_release);
    h.sender->cv.notify_all();
  }

  std::shared_ptr<InprocWorld> w_;
  int rank_;
  std::shared_ptr<Device> dev_;
  std::atomic<unsigned> next_source_{0};  // any-source receives start at a rotating rank (fairness)
};
}  // namespace

std::unique_ptr<Transport> make_inproc_transport(std::shared_ptr<InprocWorld> world, int rank,
                                                 std::shared_ptr<Device> device) {
  if (rank < 0 || rank >= world->n) throw_invalid("in-process rank out of range: " + std::to_string(rank));
  return std::make_unique<InprocTransport>(std::move(world), rank, std::move(device));
}

}  // namespace ringcomm
