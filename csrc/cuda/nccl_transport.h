// NCCL transport: payload between GPUs with ncclSend/ncclRecv on the rank's
// CUDA stream (device_cuda.h); control messages (headers, ABORT notices) and
// zero-byte tokens stay on an MPI transport in host memory.
//
// NCCL point-to-point operations only progress when the peer's matching
// operation is running, and operations on one stream run in order. The ring
// algorithms post the sends of a whole step before the matching receives
// (fine for MPI, a deadlock for NCCL if issued as posted). So posts are only
// recorded, and issued when the algorithm first waits for one of them: every
// pending operation of a unit up to that one, one ncclGroupStart/End per unit
// (the unit's send to the right and receive from the left), in unit order.
// A rank's unit-u send is received by its right neighbour's unit-u receive
// (transport.h), so group u on every rank matches group u on its neighbours,
// and no rank's stream waits on a group a neighbour has queued later.
// "Done" then means "issued on the stream": the reduction kernels that
// follow on the same stream see the data, and nothing waits on the host.
#pragma once

#include <memory>

#include "../transport.h"
#include "device_cuda.h"

namespace ringcomm {

// Collective over `comm_handle` (an MPI_Comm as an integer): rank 0 makes the
// NCCL unique id and broadcasts it; every rank joins on GPU `gpu`.
std::unique_ptr<Transport> make_nccl_transport(uintptr_t comm_handle, int gpu);

}  // namespace ringcomm
