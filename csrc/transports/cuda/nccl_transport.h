// NCCL transport: payload between GPUs with ncclSend/ncclRecv on the rank's
// CUDA stream (device_cuda.h); control messages (headers, ABORT notices) and
// zero-byte tokens stay on an MPI transport in host memory.
//
// The grouping of operations per (step, segment) unit that NCCL needs, and
// their ordering with events, are GroupedTransport's (grouped_transport.h);
// this file only issues the groups: ncclGroupStart, ncclSend/ncclRecv on the
// rank's transfer stream, ncclGroupEnd.
#pragma once


#include <memory>
#include <string>

#include "core/transport.h"
#include "cuda/device_cuda.h"
#include "cuda/nccl_api.h"

namespace ringcomm {

// Collective over `comm_handle` (an MPI_Comm as an integer): rank 0 makes the
// NCCL unique id and broadcasts it; every rank joins on GPU `gpu`.
std::unique_ptr<Transport> make_nccl_transport(uintptr_t comm_handle, int gpu);

// Without MPI (a store launch): control messages over `host` (UCX), payload
// over NCCL among the same ranks, joined with `unique_id` (nccl_unique_id()
// of one rank, handed to every rank by the launcher's store, as torch does).
std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport> host, int gpu,
                                               const std::string& unique_id);

// A new NCCL unique id, as bytes.
std::string nccl_unique_id();

// A NCCL communicator over the ranks of `comm_handle` on GPU `gpu` (rank 0
// makes the unique id and broadcasts it over MPI; collective).
ncclComm_t nccl_comm_init(uintptr_t comm_handle, int gpu);

}  // namespace ringcomm
