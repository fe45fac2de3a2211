// GroupedTransport: the part of a transport like NCCL's that is not NCCL.
//
// Some point-to-point engines (NCCL) only make progress when a send and its
// matching receive are running at the same time, and run their operations in
// the order they were queued on a stream. The ring algorithms post a whole
// step's sends before the matching receives (fine for MPI; a deadlock if
// issued as posted). So posts are only recorded here, and issued when the
// algorithm first waits for one of them: every pending operation of a unit up
// to that one, one group per unit (the unit's send to the right and receive
// from the left), in unit order. A rank's unit-u send is received by its
// right neighbour's unit-u receive (transport.h), so group u on every rank
// matches group u on its neighbours, and no rank's queue waits on a group a
// neighbour has queued later. Zero-byte messages are skipped alike on both
// sides, so the rule holds with them too.
//
// Ordering (device.h): each group runs on the device's transfer queue after
// the main-queue points where its operations were posted (send: its data is
// ready; receive: its buffer is free), so a unit's transfer overlaps the
// reduction of the one before; "done" means the main queue waits for the
// unit's group, so the reduction that follows sees the data. Nothing waits
// on the host. Control and check messages and zero-byte tokens go through
// `host`.
//
// A subclass supplies issue_group() (NCCL: ncclGroupStart, ncclSend/ncclRecv,
// ncclGroupEnd on the transfer stream) and abort_groups().
#pragma once

#include <memory>
#include <vector>

#include "core/transport.h"

namespace ringcomm {

struct GroupedOp : Request {
  void* buf = nullptr;
  int unit = -1;
  bool issued = false;
  EventPtr posted;  // main queue when posted: send data ready / receive buffer free
  EventPtr after;   // transfer queue after this operation's group
};

class GroupedTransport : public Transport {
 public:
  GroupedTransport(std::unique_ptr<Transport> host, std::shared_ptr<Device> dev)
      : host_(std::move(host)), dev_(std::move(dev)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::shared_ptr<Device> device() const override { return dev_; }

  RequestPtr isend(int peer, Channel ch, const void* buf, size_t bytes, int unit, uint32_t stamp) override;
  RequestPtr irecv(int peer, Channel ch, void* buf, size_t bytes, int unit, uint32_t stamp) override;
  int wait_any(Request* const* reqs, int n, Clock::time_point deadline) override;
  bool cancel(Request& req) override;
  bool test(Request& req) override;
  void on_fail() override;
  // Point-to-point travels on the host transport (engine/p2p.h stages a
  // device buffer through host memory): its matching, size checks and
  // ordering are the host transport's.
  RequestPtr p2p_send(int peer, const void* buf, size_t bytes, uint32_t tag) override {
    return host_->p2p_send(peer, buf, bytes, tag);
  }
  RequestPtr p2p_take(int peer, uint32_t tag, void* buf, size_t bytes) override {
    return host_->p2p_take(peer, tag, buf, bytes);
  }
  bool p2p_peek(int peer, uint32_t tag, int* src, size_t* bytes, uint32_t* found) override {
    return host_->p2p_peek(peer, tag, src, bytes, found);
  }
  uint32_t p2p_max_tag() const override { return host_->p2p_max_tag(); }
  size_t p2p_max_bytes() const override { return host_->p2p_max_bytes(); }

 protected:
  // Queue one group on the device's transfer queue, after every op's
  // `posted` event (the caller has already made the transfer queue wait).
  virtual void issue_group(const std::vector<GroupedOp*>& group) = 0;
  // The link failed: end whatever was issued (it cannot be withdrawn).
  virtual void abort_groups() = 0;
  void wake() override { host_->interrupt(); }

  std::unique_ptr<Transport> host_;
  std::shared_ptr<Device> dev_;
  bool failed_ = false;

 private:
  RequestPtr post(int peer, bool is_send, void* buf, size_t bytes, int unit);
  void issue_through(GroupedOp& target);
  std::vector<GroupedOp*> pending_;  // posted, not yet issued; owned by Link
};

}  // namespace ringcomm
