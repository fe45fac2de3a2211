#include "nccl_transport.h"

#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../mpi_transport.h"
#include "checks.h"

namespace ringcomm {

namespace {

struct NcclRequest : Request {
  void* buf = nullptr;
  int unit = -1;
  bool issued = false;
  EventPtr posted;  // main stream when posted: send data ready / receive buffer free
  EventPtr after;   // transfer stream after this request's group
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(uintptr_t comm_handle, int gpu) : host_(make_mpi_transport(comm_handle)) {
    dev_ = std::make_shared<CudaDevice>(gpu);
    MPI_Comm comm;
    std::memcpy(&comm, &comm_handle, sizeof(MPI_Comm));
    ncclUniqueId id;
    if (host_->rank() == 0) RC_NCCL(ncclGetUniqueId(&id));
    if (MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm) != MPI_SUCCESS)
      throw RingError(ErrKind::transport, host_->rank(), 0, 0, "MPI_Bcast of the NCCL unique id failed");
    DeviceGuard g(gpu);
    RC_NCCL(ncclCommInitRank(&comm_, host_->size(), id, host_->rank()));
  }

  // The Engine has already waited (bounded) for the device work of finished
  // collectives. Anything still pending now waits for a peer that will not
  // come: abort instead of finalizing, which would wait forever.
  ~NcclTransport() override {
    if (!comm_) return;
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(dev_->gpu());
    if (interrupted() || cudaStreamQuery(dev_->transfer_stream()) != cudaSuccess ||
        cudaStreamQuery(dev_->stream()) != cudaSuccess) {
      ncclCommAbort(comm_);
    } else {
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
    }
    cudaGetLastError();
    if (prev >= 0) cudaSetDevice(prev);
  }

  // Issued NCCL operations cannot be cancelled one by one; a failed link is
  // never used again, so abort the NCCL communicator: operations stuck
  // waiting for a peer end (with an error) instead of blocking the streams.
  void on_fail() override {
    if (!comm_) return;
    DeviceGuard g(dev_->gpu());
    ncclCommAbort(comm_);
    comm_ = nullptr;
    pending_.clear();
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return "nccl(" + dev_->name() + ")"; }
  std::shared_ptr<Device> device() const override { return dev_; }

  RequestPtr isend(int peer, Channel ch, const void* buf, size_t bytes, int unit) override {
    if (ch == Channel::control || bytes == 0) return host_->isend(peer, ch, buf, bytes, unit);
    return post(peer, true, const_cast<void*>(buf), bytes, unit);
  }
  RequestPtr irecv(int peer, Channel ch, void* buf, size_t bytes, int unit) override {
    if (ch == Channel::control || bytes == 0) return host_->irecv(peer, ch, buf, bytes, unit);
    return post(peer, false, buf, bytes, unit);
  }

  int wait_any(Request* const* reqs, int n, Clock::time_point deadline) override {
    // An NCCL request is done once issued: issue it (and what must go before it).
    for (int i = 0; i < n; ++i)
      if (auto* r = dynamic_cast<NcclRequest*>(reqs[i])) {
        if (!r->issued) issue_through(*r);
        if (!r->done) dev_->wait(r->after);  // main stream: reduce the data / reuse the buffer after it
        r->done = true;
        return i;
      }
    return host_->wait_any(reqs, n, deadline);
  }

  void cancel(Request& req) override {
    if (auto* r = dynamic_cast<NcclRequest*>(&req)) {
      // Not issued: forget it. Issued: it is on the stream and cannot be
      // withdrawn; ncclCommAbort (on close after an abort) ends it.
      pending_.erase(std::remove(pending_.begin(), pending_.end(), r), pending_.end());
      return;
    }
    host_->cancel(req);
  }

 protected:
  void wake() override { host_->interrupt(); }

 private:
  RequestPtr post(int peer, bool is_send, void* buf, size_t bytes, int unit) {
    auto r = std::make_unique<NcclRequest>();
    r->peer = peer;
    r->is_send = is_send;
    r->bytes = bytes;
    r->buf = buf;
    r->unit = unit;
    r->posted = dev_->record();
    pending_.push_back(r.get());
    return r;
  }

  // Issue every pending operation of a unit <= target's, one group per unit,
  // in unit order (stable: a unit's operations keep their posting order).
  // Operations without a unit go alone, in posting order, up to the target.
  void issue_through(NcclRequest& target) {
    std::vector<NcclRequest*> now, later;
    bool reached = false;
    for (NcclRequest* r : pending_) {
      bool take = target.unit >= 0 ? (r->unit >= 0 && r->unit <= target.unit) : !reached;
      if (target.unit < 0 && r == &target) reached = true;
      (take ? now : later).push_back(r);
    }
    pending_ = std::move(later);
    std::stable_sort(now.begin(), now.end(), [](const NcclRequest* a, const NcclRequest* b) {
      return a->unit < b->unit;
    });
    if (!comm_) throw RingError(ErrKind::aborted, rank(), target.peer, 0, "the NCCL communicator was aborted");
    DeviceGuard g(dev_->gpu());
    const cudaStream_t xs = dev_->transfer_stream();
    for (size_t i = 0; i < now.size();) {
      size_t j = i + 1;
      while (j < now.size() && now[j]->unit >= 0 && now[j]->unit == now[i]->unit) ++j;
      for (size_t k = i; k < j; ++k) dev_->transfer_wait(now[k]->posted);
      RC_NCCL(ncclGroupStart());
      for (size_t k = i; k < j; ++k) {
        NcclRequest* r = now[k];
        if (r->is_send)
          RC_NCCL(ncclSend(r->buf, r->bytes, ncclUint8, r->peer, comm_, xs));
        else
          RC_NCCL(ncclRecv(r->buf, r->bytes, ncclUint8, r->peer, comm_, xs));
        r->issued = true;
      }
      RC_NCCL(ncclGroupEnd());
      EventPtr after = dev_->transfer_record();
      for (size_t k = i; k < j; ++k) now[k]->after = after;
      i = j;
    }
  }

  std::unique_ptr<Transport> host_;
  std::shared_ptr<CudaDevice> dev_;
  ncclComm_t comm_ = nullptr;
  std::vector<NcclRequest*> pending_;  // posted, not yet issued; owned by Link
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(uintptr_t comm_handle, int gpu) {
  return std::make_unique<NcclTransport>(comm_handle, gpu);
}

}  // namespace ringcomm
