// UCX transport: host memory between processes over UCP tag matching (one
// UCP context and worker per rank, one endpoint per peer made from the
// peers' worker addresses; no listener, no connection manager). The
// addresses are exchanged by whoever launched the ranks (ringcomm/ucx.py:
// any allgather). UCX itself is loaded at run time (ucx_api.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/transport.h"

namespace ringcomm {

// A UCP context and worker, made before the addresses are exchanged. Opaque
// outside ucx_transport.cpp; shared by the transport and its requests, so a
// request the quarantine keeps past the transport still has its worker.
struct UcxWorker;

// Throws RingError(transport) saying what to install when UCX cannot be
// loaded, or that ringcomm was built without UCX headers.
std::shared_ptr<UcxWorker> make_ucx_worker();
// The worker's address, to hand to every peer (opaque bytes); `net_only`:
// its network devices' part alone, for the peers on other hosts.
std::string ucx_worker_address(const UcxWorker& w, bool net_only = false);
// `addresses[r]`: rank r's worker address (this rank's own included). The
// transport takes the worker over.
std::unique_ptr<Transport> make_ucx_transport(std::shared_ptr<UcxWorker> worker,
                                              const std::vector<std::string>& addresses, int rank);
// "1.22.0", or the clear error.
std::string ucx_version();

}  // namespace ringcomm
