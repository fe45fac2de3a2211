#include "transports/stream_emu.h"

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "transports/grouped_transport.h"
#include "transports/inproc_transport.h"

namespace ringcomm {

namespace {

// One in-order queue and the thread that runs it.
struct EmuQueue {
  std::mutex m;
  std::condition_variable work_cv, done_cv;
  std::deque<std::function<void()>> ops;
  uint64_t enqueued = 0, completed = 0;
  bool stop = false;
  double jitter_us = 0;

  void push(std::function<void()> f) {
    std::lock_guard<std::mutex> g(m);
    ops.push_back(std::move(f));
    ++enqueued;
    work_cv.notify_one();
  }

  bool reached(uint64_t ticket, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lk(m);
    return done_cv.wait_until(lk, deadline, [&] { return completed >= ticket; });
  }

  void run() {
    std::mt19937 rng(std::random_device{}());
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lk(m);
        work_cv.wait(lk, [&] { return stop || !ops.empty(); });
        if (ops.empty()) return;  // stop requested and nothing left
        f = std::move(ops.front());
        ops.pop_front();
      }
      if (jitter_us > 0) {  // let other queues run ahead, as a busy GPU would
        std::uniform_real_distribution<double> d(0, jitter_us);
        std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(d(rng)));
      }
      f();
      std::lock_guard<std::mutex> g(m);
      ++completed;
      done_cv.notify_all();
    }
  }
};

class EmuEvent final : public Event {
 public:
  EmuEvent(std::shared_ptr<EmuQueue> q, uint64_t ticket) : q_(std::move(q)), ticket_(ticket) {}
  bool query() override { return q_->reached(ticket_, Clock::time_point::min()); }
  bool synchronize(Clock::time_point deadline) override { return q_->reached(ticket_, deadline); }

 private:
  std::shared_ptr<EmuQueue> q_;
  uint64_t ticket_;
};

// The host reducer, run by the queue's thread.
class EmuReducer final : public Reducer {
 public:
  EmuReducer(std::shared_ptr<Reducer> cpu, std::shared_ptr<EmuQueue> q) : cpu_(std::move(cpu)), q_(std::move(q)) {}
  void reduce(void* dst, const void* a, const void* b, size_t count) const override {
    auto cpu = cpu_;
    q_->push([cpu, dst, a, b, count] { cpu->reduce(dst, a, b, count); });
  }
  void finalize(void* buf, size_t count, int nranks) const override {
    auto cpu = cpu_;
    q_->push([cpu, buf, count, nranks] { cpu->finalize(buf, count, nranks); });
  }

 private:
  std::shared_ptr<Reducer> cpu_;
  std::shared_ptr<EmuQueue> q_;
};

class EmuDevice final : public Device {
 public:
  EmuDevice(int id, double jitter_us) : id_(id), q_(std::make_shared<EmuQueue>()), x_(std::make_shared<EmuQueue>()) {
    q_->jitter_us = x_->jitter_us = jitter_us;
    thread_ = std::thread([q = q_] { q->run(); });
    xthread_ = std::thread([q = x_] { q->run(); });
  }
  ~EmuDevice() override {
    for (auto* q : {q_.get(), x_.get()}) {
      std::lock_guard<std::mutex> g(q->m);
      q->stop = true;
      q->work_cv.notify_all();
    }
    thread_.join();  // each runs what is queued first: it may still reference user memory
    xthread_.join();
  }
  std::string name() const override { return "emulated:" + std::to_string(id_); }
  void transfer_run(std::function<void()> f) { x_->push(std::move(f)); }

  void copy(void* dst, const void* src, size_t bytes) override { push_copy(*q_, dst, src, bytes); }
  EventPtr record() override { return record_on(q_); }
  void wait(const EventPtr& e) override { wait_on(*q_, e); }
  void transfer_wait(const EventPtr& e) override { wait_on(*x_, e); }
  void transfer_copy(void* dst, const void* src, size_t bytes) override { push_copy(*x_, dst, src, bytes); }
  EventPtr transfer_record() override { return record_on(x_); }
  std::unique_ptr<Reducer> reducer(DType dtype, Op op) override {
    return std::make_unique<EmuReducer>(std::shared_ptr<Reducer>(make_cpu_reducer(dtype, op)), q_);
  }
  static void push_copy(EmuQueue& q, void* dst, const void* src, size_t bytes) {
    q.push([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }
  static EventPtr record_on(const std::shared_ptr<EmuQueue>& q) {
    std::lock_guard<std::mutex> g(q->m);
    return std::make_shared<EmuEvent>(q, q->enqueued);
  }
  static void wait_on(EmuQueue& q, const EventPtr& e) {
    if (!e || e->query()) return;
    q.push([e] { e->synchronize(Clock::time_point::max()); });
  }

  char* scratch(int which, size_t bytes) override {
    auto& s = scratch_[which];
    if (s.size() < bytes) {
      // Queued work (either queue) may still use the old memory.
      record_on(q_)->synchronize(Clock::time_point::max());
      record_on(x_)->synchronize(Clock::time_point::max());
      s.resize(bytes);
    }
    return s.data();
  }
  // The caller of an emulated device is the host itself: what it wrote before
  // the call is there already, and "make the caller wait" means block.
  EventPtr record_external(uintptr_t) override { return nullptr; }
  void wait_external(uintptr_t, const EventPtr& e) override {
    if (e) e->synchronize(Clock::time_point::max());
  }
  EventPtr copy_external(uintptr_t, void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return nullptr;
  }

 private:
  int id_;
  std::shared_ptr<EmuQueue> q_, x_;  // main and transfer queues
  std::vector<char> scratch_[2];
  std::thread thread_, xthread_;
};

class EmuGroupedTransport final : public GroupedTransport {
 public:
  EmuGroupedTransport(std::unique_ptr<Transport> control, std::unique_ptr<Transport> payload, int rank,
                      double jitter_us, double group_timeout_s)
      : GroupedTransport(std::move(control), std::make_shared<EmuDevice>(rank, jitter_us)),
        payload_(std::move(payload)),
        group_timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(group_timeout_s))) {}
  std::string name() const override { return "grouped(" + dev_->name() + ")"; }

 protected:
  void issue_group(const std::vector<GroupedOp*>& group) override {
    struct Op {
      bool is_send;
      int peer;
      void* buf;
      size_t bytes;
    };
    std::vector<Op> ops;
    for (GroupedOp* r : group) ops.push_back({r->is_send, r->peer, r->buf, r->bytes});
    std::shared_ptr<Transport> t = payload_;  // the queue may outlive this transport
    std::shared_ptr<AsyncError> failure = failure_;
    const int rank = this->rank();
    const Clock::duration limit = group_timeout_;
    static_cast<EmuDevice*>(dev_.get())->transfer_run([t, ops, rank, failure, limit] {
      std::vector<RequestPtr> reqs;
      auto withdraw = [&] {
        for (auto& q : reqs)
          try {
            if (!q->done) t->cancel(*q);
          } catch (const std::exception&) {  // (its peer is gone: nothing more to end)
          }
      };
      // A transport that raises (UCX, when a peer dies) must not end this
      // queue's thread, and so the process: the group ends with its data
      // left as is, and the failure is kept for check_async(), as NCCL
      // keeps its asynchronous error for ncclCommGetAsyncError.
      try {
        for (const Op& o : ops)
          reqs.push_back(o.is_send ? t->isend(o.peer, Channel::data, o.buf, o.bytes)
                                   : t->irecv(o.peer, Channel::data, o.buf, o.bytes));
        const auto deadline = Clock::now() + limit;
        for (auto& r : reqs) {
          Request* p = r.get();
          while (!p->done) {
            int got = t->wait_any(&p, 1, deadline);
            if (got < 0) {
              if (got != kInterrupted) {
                // A deadlock, or a peer whose death the payload transport
                // never saw: either way the data is wrong, so the rank must
                // raise (check_async), not go on with it.
                const std::string what = "the group on rank " + std::to_string(rank) +
                                         " never completed: its message with rank " + std::to_string(p->peer) +
                                         " did not match (a deadlock, or a peer gone unseen)";
                std::fprintf(stderr, "ringcomm: emulated NCCL: %s\n", what.c_str());
                failure->set(what);
              }
              withdraw();
              return;
            }
          }
        }
      } catch (const std::exception& e) {
        failure->set(e.what());
        withdraw();
      }
    });
  }
  void abort_groups() override { payload_->interrupt(); }  // stuck groups end (their data is left as is)
  void check_async() override {
    const std::string why = failure_->get();
    if (!why.empty())
      throw RingError(ErrKind::transport, rank(), -1, 0, "an emulated NCCL group failed on the payload transport: " + why);
  }

 private:
  struct AsyncError {  // written by the transfer queue's thread, read by the rank's
    std::mutex m;
    std::string text;
    void set(const std::string& t) {
      std::lock_guard<std::mutex> g(m);
      if (text.empty()) text = t;
    }
    std::string get() {
      std::lock_guard<std::mutex> g(m);
      return text;
    }
  };
  std::shared_ptr<Transport> payload_;
  Clock::duration group_timeout_;
  std::shared_ptr<AsyncError> failure_ = std::make_shared<AsyncError>();
};

}  // namespace

std::shared_ptr<Device> make_emulated_device(int id, double jitter_us) {
  return std::make_shared<EmuDevice>(id, jitter_us);
}

std::unique_ptr<Transport> make_emulated_grouped_transport(std::shared_ptr<InprocWorld> control,
                                                           std::shared_ptr<InprocWorld> payload, int rank,
                                                           double jitter_us) {
  return make_emulated_grouped_transport(make_inproc_transport(std::move(control), rank),
                                         make_inproc_transport(std::move(payload), rank), rank, jitter_us, 60.0);
}

std::unique_ptr<Transport> make_emulated_grouped_transport(std::unique_ptr<Transport> control,
                                                           std::unique_ptr<Transport> payload, int rank,
                                                           double jitter_us, double group_timeout_s) {
  return std::make_unique<EmuGroupedTransport>(std::move(control), std::move(payload), rank, jitter_us,
                                               group_timeout_s);
}

}  // namespace ringcomm
