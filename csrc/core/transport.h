// Transport: how bytes move between two ranks. This is all an algorithm's
// messages go through (via Link, which adds the ledger, the deadlines and the
// control stream). A transport fills exactly these methods; it knows nothing
// about rings or collectives.
//
// Matching rule (MPI's): messages from one sender on one channel (on the
// data channel: with one stamp) are received in the order they were sent,
// and a receive posted for `bytes` gets a message of exactly `bytes` (Link
// guarantees both sides agree on sizes).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <string>

#include "core/vocabulary.h"
#include "core/device.h"

namespace ringcomm {

// data: payload (the Device's memory, if any); control: headers and ABORT
// notices between ring neighbours; check: a call's fingerprint sent on its
// own to a peer beyond the neighbours. control and check are host memory.
// p2p: point-to-point messages (engine/p2p.h), matched by (sender, tag)
// and never by a collective's receive.
enum class Channel : int { data = 0, control = 1, check = 2, p2p = 3, kCount };

// A point-to-point receive from any rank.
constexpr int kAnySource = -1;
// p2p_peek for a message with any tag (a receive never asks for it).
constexpr uint32_t kAnyTag = 0xffffffffu;

// wait_any's answer when interrupt() was called.
constexpr int kInterrupted = -2;

// An outstanding send or receive. Owned by whoever posted it; destroying an
// incomplete request is only allowed once Transport::cancel returned true or
// Transport::test reports it done.
struct Request {
  virtual ~Request() = default;
  int peer = -1;
  bool is_send = false;
  size_t bytes = 0;
  bool done = false;  // set by Transport::wait_any once complete
  bool counted = false;  // its bytes are in the Link's progress (flight.h)
  uint32_t stamp = 0;    // a completed data receive: the stamp its message carried
  // A receive met a message of another size or stamp and the transport
  // threw: none of it reached the buffer when the stamp differed. The
  // request may still be draining the message elsewhere (then not `done`).
  bool wrong_message = false;
  size_t found_bytes = 0;  // wrong_message: the size of the message met (when known)
};

// A receive's stamp (data channel): the receive takes only a message that
// carries it, so a message of another call never lands in its buffer (nor
// past it: Open MPI 5.0's single-copy path writes a message larger than the
// posted receive in full, tests/scripts/mpi_truncation.py). How a transport
// reports a message of another stamp waiting where this receive's belongs
// is its own (MPI: a probe, then a cancelled receive proves it, see
// mpi_transport.cpp); it then throws with the request's wrong_message set
// and its stamp that of the message found. Unstamped links pass 0 and send 0.
using RequestPtr = std::unique_ptr<Request>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Short human description, e.g. "mpi(Open MPI v5.0.11)" or "inproc".
  virtual std::string name() const = 0;

  // `unit`: which (step, segment) of the algorithm the message belongs to
  // (-1: none). A rank's send and receive of one unit are matched, on its two
  // neighbours, by their sends and receives of the same unit. Host transports
  // ignore it; NCCL must issue each unit's send and receive together in one
  // group (nccl_transport.cpp), and this is how it knows which belong together.
  // `stamp` (data channel, stamping transports only): a number carried with
  // the message outside its bytes and reported on the receive
  // (Request::stamp); Link stamps every payload message with its call's
  // identity, so a receiver checks the call of each message without a byte
  // added to it (an extra byte can cost a protocol step: Open MPI sends up
  // to 256 bytes inline).
  virtual RequestPtr isend(int peer, Channel ch, const void* buf, size_t bytes, int unit = -1,
                           uint32_t stamp = 0) = 0;
  virtual RequestPtr irecv(int peer, Channel ch, void* buf, size_t bytes, int unit = -1,
                           uint32_t stamp = 0) = 0;
  // The bits of a stamp this transport carries (0: it carries none; Link then
  // sends a call's fingerprint on its own, on Channel::check).
  virtual uint32_t stamp_mask() const { return 0; }

  // Where payload (Channel::data) lives and is ordered: null for host memory
  // (requests complete on the host), else the rank's Device (device.h):
  // a request is then "done" once its transfer is ordered on that device.
  // Control messages are always host memory.
  virtual std::shared_ptr<Device> device() const { return nullptr; }

  // Block until at least one of reqs[0..n) is done (already-done requests
  // count) or `deadline` passes. Returns the index of a done request, -1 on
  // timeout, kInterrupted once interrupt() was called. Null entries are ignored.
  virtual int wait_any(Request* const* reqs, int n, Clock::time_point deadline) = 0;

  // Make every current and future wait_any return kInterrupted (thread-safe:
  // called by Engine::abort from any thread, while a collective may be waiting).
  void interrupt() {
    interrupted_.store(true, std::memory_order_release);
    wake();
  }
  bool interrupted() const { return interrupted_.load(std::memory_order_acquire); }

  // ---- point-to-point (Channel::p2p, host memory; engine/p2p.h) ----
  // Messages carry a `tag` outside their bytes (MPI's tag; a field in
  // process) and are matched by (sender, tag) in the order they were sent.
  // A receive is never posted blind: it takes a message that has arrived
  // (p2p_take), so its size is known before a byte lands and a larger
  // message can never overrun the buffer. Thread-safe (callers' threads
  // use it while a collective runs on the engine's). Transports that do
  // not carry point-to-point messages throw RingError(invalid).
  virtual RequestPtr p2p_send(int peer, const void* buf, size_t bytes, uint32_t tag);
  // Take the oldest arrived message from `peer` (kAnySource: any rank) with
  // `tag`; null when none has arrived yet. The request's `peer` is the
  // sender. A message of exactly `bytes` is received into `buf` (wait_any
  // completes the request); one of another size is discarded, none of it
  // landing, and the request comes back done, with `wrong_message` set and
  // `bytes` the message's size.
  virtual RequestPtr p2p_take(int peer, uint32_t tag, void* buf, size_t bytes);
  // Has a message from `peer` (kAnySource: any) with `tag` (kAnyTag: any;
  // then its sender's oldest) arrived? Leaves it there (for error
  // messages); fills *src, *bytes and *found (its tag; may be null) when true.
  virtual bool p2p_peek(int peer, uint32_t tag, int* src, size_t* bytes, uint32_t* found);
  // The largest tag p2p_send carries (MPI_TAG_UB).
  virtual uint32_t p2p_max_tag() const { return 0x7fffffffu; }
  // The largest message p2p_send carries (MPI: 1 GiB, its counts are ints).
  virtual size_t p2p_max_bytes() const { return SIZE_MAX; }
  // (The blocking fast lane's on-the-spot send and take: core/eager_p2p.h,
  // an optional interface beside this one.)

  // The collective failed and the link is being abandoned (Link::fail).
  // Transports whose operations cannot be withdrawn one by one (NCCL) tear
  // down here, so nothing queued on a device waits forever for a peer.
  virtual void on_fail() {}

  // Raise a failure the transport learned of asynchronously (NCCL's async
  // error), as a RingError. Called while waiting and between collectives.
  virtual void check_async() {}

  // Withdraw a request that will not be waited for (after an error).
  // Returns true when the transport will never touch the request's buffer
  // again (it completed, or was withdrawn); false when it may still read or
  // write it (an MPI send cannot be withdrawn; a receive that already matched
  // a message still arriving): the caller must then keep the request and its
  // memory alive until test() says it is done (quarantine.h).
  virtual bool cancel(Request& r) = 0;
  // Has `r` completed? Never blocks and never throws: for requests whose
  // collective has already failed (the quarantine), where only "is the
  // memory free yet" matters.
  virtual bool test(Request& r) = 0;

 protected:
  // Wake waits blocked in wait_any so they notice interrupt() (polling transports need nothing).
  virtual void wake() {}

 private:
  std::atomic<bool> interrupted_{false};
};

}  // namespace ringcomm
