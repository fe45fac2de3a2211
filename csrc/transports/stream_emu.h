// The emulated device: a Device (device.h) whose "stream" is a host thread
// running the enqueued copies and reductions in order, on host memory.
//
// It exists so the device path (asynchronous, stream-ordered execution of the
// same ring algorithms, events between ranks' queues, the stream semantics of
// Work) is exercised on machines without a GPU: if an ordering edge were
// missing, the emulated queues run ahead exactly as a GPU's would, and
// `jitter_us` (a random delay before every operation) makes such races show.
// It is a test and teaching tool, not a performance path.
#pragma once

#include <memory>

#include "core/device.h"
#include "core/transport.h"

namespace ringcomm {

class InprocWorld;

std::shared_ptr<Device> make_emulated_device(int id, double jitter_us);

// The NCCL transport's emulation: GroupedTransport (grouped_transport.h,
// the very code the NCCL transport runs) over an emulated device, whose
// groups behave as NCCL's do on a stream: a group, queued on the rank's
// transfer queue, posts its sends and receives to `payload` (in-process, host
// memory) and blocks that queue until all of them have matched. A grouping
// that could deadlock on NCCL deadlocks here (reported after 60 s on stderr,
// and raised by the rank's next wait). Control messages go through `control`.
std::unique_ptr<Transport> make_emulated_grouped_transport(std::shared_ptr<InprocWorld> control,
                                                           std::shared_ptr<InprocWorld> payload, int rank,
                                                           double jitter_us);
// The same over any two transports of this rank: a store launch's two UCX
// transports (one worker each) across processes, as the NCCL transport runs
// there (control over UCX, payload in groups). `payload` is used only from
// the device's transfer queue once made. A group that has not completed
// after `group_timeout_s` (60 in process) ends, and the rank's next wait
// raises it (check_async), as one whose transport raised.
std::unique_ptr<Transport> make_emulated_grouped_transport(std::unique_ptr<Transport> control,
                                                           std::unique_ptr<Transport> payload, int rank,
                                                           double jitter_us, double group_timeout_s);

}  // namespace ringcomm
