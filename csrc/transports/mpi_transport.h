// MPI transport: host memory between processes (one node or many), through
// MPI_Isend / MPI_Irecv on a private duplicate of the caller's communicator,
// so ringcomm's messages never match the application's.
#pragma once

#include <memory>

#include "core/transport.h"

namespace ringcomm {

// `comm_handle` is the C handle of an MPI communicator (mpi4py: comm.handle).
// Requires MPI_THREAD_MULTIPLE: ringcomm calls MPI from its own worker thread
// while the application may call MPI too.
std::unique_ptr<Transport> make_mpi_transport(uintptr_t comm_handle);

// "Open MPI v5.0.11, ..." (first line of MPI_Get_library_version) and the
// standard version, for `ringcomm info`.
std::string mpi_library_version();

}  // namespace ringcomm
