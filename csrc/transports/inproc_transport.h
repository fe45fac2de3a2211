// In-process transport: n ranks as threads of one process (tests, teaching,
// and the in-process engine of run_local). Messages are matched in FIFO
// order per (sender, receiver, channel) like MPI. A large message is copied
// once, straight from the sender's buffer into the receiver's (the sender's
// request completes when that copy is done: rendezvous, no staging buffer);
// a small one (control messages, tokens) is copied at send time, so the
// send completes at once (eager).
//
// With a Device per rank (device.h: GPUs, or their CPU emulation), payload is
// paired on the host as above but copied on the receiver's device, ordered
// with events after the sender's producing work; the sender's later work
// waits for the copy. No host thread ever waits for a device.
#pragma once

#include <memory>

#include "core/transport.h"

namespace ringcomm {

class InprocWorld;  // shared state of one group of in-process ranks

std::shared_ptr<InprocWorld> make_inproc_world(int nranks);
std::unique_ptr<Transport> make_inproc_transport(std::shared_ptr<InprocWorld> world, int rank,
                                                 std::shared_ptr<Device> device = nullptr);

}  // namespace ringcomm
