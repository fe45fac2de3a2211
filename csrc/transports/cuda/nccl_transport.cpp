#include "transports/cuda/nccl_transport.h"

#include <mpi.h>

#include <cstring>
#include <vector>

#include "transports/grouped_transport.h"
#include "transports/mpi_transport.h"
#include "cuda/checks.h"

namespace ringcomm {

namespace {

class NcclTransport final : public GroupedTransport {
 public:
  // `join(rank, size)` makes this rank's NCCL communicator (collective).
  template <class Join>
  NcclTransport(int gpu, std::unique_ptr<Transport> host, Join join)
      : GroupedTransport(std::move(host), std::make_shared<CudaDevice>(gpu)),
        cuda_(static_cast<CudaDevice*>(dev_.get())),
        comm_(join(rank(), size())) {}

  // The Engine has already waited (bounded) for the device work of finished
  // collectives. Anything still pending now waits for a peer that will not
  // come: abort instead of finalizing, which would wait forever.
  ~NcclTransport() override {
    if (!comm_) return;
    DeviceGuard g(cuda_->gpu(), std::nothrow);
    if (interrupted() || cudaStreamQuery(cuda_->transfer_stream()) != cudaSuccess ||
        cudaStreamQuery(cuda_->stream()) != cudaSuccess) {
      ncclCommAbort(comm_);
    } else {
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
    }
    cudaGetLastError();
  }

  std::string name() const override { return "nccl(" + dev_->name() + ")"; }

 protected:
  void issue_group(const std::vector<GroupedOp*>& group) override {
    DeviceGuard g(cuda_->gpu());
    const cudaStream_t xs = cuda_->transfer_stream();
    NcclGroup grp;  // ended on every path: an exception must not leave this thread inside the group
    for (GroupedOp* r : group) {
      if (r->is_send)
        RC_NCCL(ncclSend(r->buf, r->bytes, ncclUint8, r->peer, comm_, xs));
      else
        RC_NCCL(ncclRecv(r->buf, r->bytes, ncclUint8, r->peer, comm_, xs));
    }
    grp.end();
  }

  // NCCL reports failures of queued operations (a peer's network error, a
  // remote abort) only through this; without the poll they would surface as
  // a timeout. Called while waiting and between collectives (check_peers).
  void check_async() override {
    if (!comm_) return;
    ncclResult_t err = ncclSuccess;
    DeviceGuard g(cuda_->gpu());
    RC_NCCL(ncclCommGetAsyncError(comm_, &err));
    if (err != ncclSuccess && err != ncclInProgress)
      throw RingError(ErrKind::transport, rank(), -1, 0,
                      std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(err));
  }

  // Issued NCCL operations cannot be cancelled one by one; a failed link is
  // never used again, so abort the NCCL communicator: operations stuck
  // waiting for a peer end (with an error) instead of blocking the streams.
  void abort_groups() override {
    if (!comm_) return;
    DeviceGuard g(cuda_->gpu());
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  CudaDevice* cuda_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

namespace {
ncclComm_t join_nccl(const ncclUniqueId& id, int rank, int size, int gpu) {
  DeviceGuard g(gpu);
  ncclComm_t c = nullptr;
  RC_NCCL(ncclCommInitRank(&c, size, id, rank));
  return c;
}
}  // namespace

ncclComm_t nccl_comm_init(uintptr_t comm_handle, int gpu) {
  MPI_Comm comm;
  std::memcpy(&comm, &comm_handle, sizeof(MPI_Comm));
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ncclUniqueId id;
  if (rank == 0) RC_NCCL(ncclGetUniqueId(&id));
  if (MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm) != MPI_SUCCESS)
    throw RingError(ErrKind::transport, rank, 0, 0, "MPI_Bcast of the NCCL unique id failed");
  return join_nccl(id, rank, size, gpu);
}

std::unique_ptr<Transport> make_nccl_transport(uintptr_t comm_handle, int gpu) {
  return std::make_unique<NcclTransport>(gpu, make_mpi_transport(comm_handle),
                                         [&](int, int) { return nccl_comm_init(comm_handle, gpu); });
}

std::string nccl_unique_id() {
  ncclUniqueId id;
  RC_NCCL(ncclGetUniqueId(&id));
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport> host, int gpu,
                                               const std::string& unique_id) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id)
    throw_invalid("a NCCL unique id has " + std::to_string(sizeof id) + " bytes, got " +
                  std::to_string(unique_id.size()));
  std::memcpy(&id, unique_id.data(), sizeof id);
  return std::make_unique<NcclTransport>(gpu, std::move(host),
                                         [&](int rank, int size) { return join_nccl(id, rank, size, gpu); });
}

}  // namespace ringcomm
