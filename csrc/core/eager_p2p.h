// EagerP2P: the blocking point-to-point fast lane (p2p_run_now in
// engine/p2p.h), an optional interface beside Transport. Transport carries
// what every transport does (p2p_send, p2p_take, p2p_peek); a transport
// whose peers are other processes and that can finish a send, or take an
// arrived message, on the spot without allocating a request (MPI, UCX) also
// implements this. The engine finds it once per communicator
// (P2PPending::eager, a dynamic_cast) and otherwise posts requests through
// Transport as for any transport, so a new transport needs nothing here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/transport.h"

namespace ringcomm {

class EagerP2P {
 public:
  // p2p_send_now: true when the send has completed (the buffer may be
  // reused); else *pending holds its request, as p2p_send's.
  virtual bool p2p_send_now(int peer, const void* buf, size_t bytes, uint32_t tag, RequestPtr* pending) = 0;
  // p2p_take_now: kP2PNone when no message has arrived (nothing taken); the
  // sender's rank when a message of exactly `bytes` has landed in `buf`;
  // kP2PPending when *pending holds the taken message's request (still
  // arriving, or discarded with wrong_message set), as p2p_take's.
  static constexpr int kP2PNone = -1, kP2PPending = -2;
  virtual int p2p_take_now(int peer, uint32_t tag, void* buf, size_t bytes, RequestPtr* pending) = 0;

 protected:
  ~EagerP2P() = default;  // never owned through this interface: the Transport is
};

}  // namespace ringcomm
