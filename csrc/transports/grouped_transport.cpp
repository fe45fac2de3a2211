#include "transports/grouped_transport.h"

#include <algorithm>

namespace ringcomm {

RequestPtr GroupedTransport::isend(int peer, Channel ch, const void* buf, size_t bytes, int unit, uint32_t stamp) {
  if (ch != Channel::data || bytes == 0) return host_->isend(peer, ch, buf, bytes, unit, stamp);
  return post(peer, true, const_cast<void*>(buf), bytes, unit);
}

RequestPtr GroupedTransport::irecv(int peer, Channel ch, void* buf, size_t bytes, int unit, uint32_t stamp) {
  if (ch != Channel::data || bytes == 0) return host_->irecv(peer, ch, buf, bytes, unit, stamp);
  return post(peer, false, buf, bytes, unit);
}

RequestPtr GroupedTransport::post(int peer, bool is_send, void* buf, size_t bytes, int unit) {
  auto r = std::make_unique<GroupedOp>();
  r->peer = peer;
  r->is_send = is_send;
  r->bytes = bytes;
  r->buf = buf;
  r->unit = unit;
  r->posted = dev_->record();
  pending_.push_back(r.get());
  return r;
}

int GroupedTransport::wait_any(Request* const* reqs, int n, Clock::time_point deadline) {
  // A grouped operation is done once issued: issue it (and what must go before it).
  for (int i = 0; i < n; ++i)
    if (auto* r = dynamic_cast<GroupedOp*>(reqs[i])) {
      if (!r->issued) issue_through(*r);
      if (!r->done) dev_->wait(r->after);  // main queue: use the data / reuse the buffer after it
      r->done = true;
      return i;
    }
  check_async();  // a device-side failure ends the wait instead of running into its deadline
  return host_->wait_any(reqs, n, deadline);
}

bool GroupedTransport::cancel(Request& req) {
  if (auto* r = dynamic_cast<GroupedOp*>(&req)) {
    // Not issued: forget it. Issued: it cannot be withdrawn one by one, but
    // on_fail() (called first by Link::fail) aborted the device
    // communicator, which ends it; the Engine keeps the arrays until the
    // device work queued so far has passed.
    pending_.erase(std::remove(pending_.begin(), pending_.end(), r), pending_.end());
    return true;
  }
  return host_->cancel(req);
}

bool GroupedTransport::test(Request& req) {
  if (dynamic_cast<GroupedOp*>(&req)) return true;  // see cancel()
  return host_->test(req);
}

void GroupedTransport::on_fail() {
  if (failed_) return;
  failed_ = true;
  pending_.clear();
  abort_groups();
}

// Issue every pending operation of a unit <= target's, one group per unit, in
// unit order (stable: a unit's operations keep their posting order).
// Operations without a unit go alone, in posting order, up to the target.
void GroupedTransport::issue_through(GroupedOp& target) {
  if (failed_) throw RingError(ErrKind::aborted, rank(), target.peer, 0, "the link was aborted");
  std::vector<GroupedOp*> now, later;
  bool reached = false;
  for (GroupedOp* r : pending_) {
    bool take = target.unit >= 0 ? (r->unit >= 0 && r->unit <= target.unit) : !reached;
    if (target.unit < 0 && r == &target) reached = true;
    (take ? now : later).push_back(r);
  }
  pending_ = std::move(later);
  std::stable_sort(now.begin(), now.end(), [](const GroupedOp* a, const GroupedOp* b) { return a->unit < b->unit; });
  for (size_t i = 0; i < now.size();) {
    size_t j = i + 1;
    while (j < now.size() && now[j]->unit >= 0 && now[j]->unit == now[i]->unit) ++j;
    std::vector<GroupedOp*> group(now.begin() + i, now.begin() + j);
    for (GroupedOp* r : group) dev_->transfer_wait(r->posted);
    issue_group(group);
    EventPtr after = dev_->transfer_record();
    for (GroupedOp* r : group) {
      r->issued = true;
      r->after = after;
    }
    i = j;
  }
}

}  // namespace ringcomm
