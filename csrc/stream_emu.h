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

#include "device.h"

namespace ringcomm {

std::shared_ptr<Device> make_emulated_device(int id, double jitter_us);

}  // namespace ringcomm
