#include "algorithms/pairwise.h"

namespace ringcomm {

namespace {
struct Cut {  // a whole buffer of `count` elements, as messages
  size_t count, es;
  int K;
  Cut(Link& link, size_t count_, size_t es_)
      : count(count_), es(es_), K(whole_buffer_segments(count_, es_, link.options().segment_bytes)) {}
  size_t off(int k) const { return split_offset(count, K, k) * es; }
  size_t len(int k) const { return split_size(count, K, k); }
};
}  // namespace

using Reqs = SmallArray<Request*>;  // requests of one exchange, one per segment (pairwise.h)

static void post_sends(Link& link, int peer, const char* src, const Cut& c, int& unit, Reqs* sent = nullptr) {
  for (int k = 0; k < c.K; ++k) {
    Request* r = link.send(peer, src + c.off(k), c.len(k) * c.es, unit + k);
    if (sent) (*sent)[k] = r;
  }
  unit += c.K;
}

void send_all(Link& link, int peer, const char* src, size_t count, size_t es, int& unit) {
  if (count) post_sends(link, peer, src, Cut(link, count, es), unit);
}

void recv_all(Link& link, int peer, char* dst, size_t count, size_t es, int step, int& unit) {
  if (!count) return;
  const Cut c(link, count, es);
  Reqs r(c.K);
  for (int k = 0; k < c.K; ++k) r[k] = link.recv(peer, dst + c.off(k), c.len(k) * es, unit + k);
  for (int k = 0; k < c.K; ++k) link.wait(r[k], "a whole-buffer message", step, k);
  unit += c.K;
}

void recv_reduce(Link& link, const Reducer& red, int peer, const char* a, char* dst, size_t count, size_t es,
                 int step, int& unit, Reqs* sent) {
  if (!count) return;
  const Cut c(link, count, es);
  const int window = std::min(std::max(2, link.options().window), c.K);
  const size_t slot_bytes = round_up(c.len(0) * es + 16, 256);
  char* slots = link.scratch(0, size_t(window) * slot_bytes);
  // A slot starts at its segment's address mod 16, like the ring's
  // (reduce_scatter.cpp), so a device reduction vectorizes.
  auto slot = [&](int k) {
    return slots + size_t(k % window) * slot_bytes + reinterpret_cast<uintptr_t>(a + c.off(k)) % 16;
  };
  Reqs r(c.K);
  for (int k = 0; k < window; ++k) r[k] = link.recv(peer, slot(k), c.len(k) * es, unit + k);
  for (int k = 0; k < c.K; ++k) {
    link.wait(r[k], "its part of a pairwise step", step, k);
    if (sent) link.wait((*sent)[k], "a pairwise step's segment", step, k);  // dst's segment k is about to change
    // The lower rank's values first, on both partners: x op y and y op x
    // differ in bits for max/min with NaN or signed zeros (and NaN payloads),
    // and both partners must end with the same bits.
    if (peer < link.rank())
      red.reduce(dst + c.off(k), slot(k), a + c.off(k), c.len(k));
    else
      red.reduce(dst + c.off(k), a + c.off(k), slot(k), c.len(k));
    if (k + window < c.K) r[k + window] = link.recv(peer, slot(k + window), c.len(k + window) * es, unit + k + window);
  }
  unit += c.K;
}

void exchange_reduce(Link& link, const Reducer& red, int peer, const char* src, const char* a, char* dst,
                     size_t count, size_t es, int step, int& unit) {
  if (!count) return;
  int send_unit = unit;  // a unit's send and receive go together (transport.h)
  const Cut c(link, count, es);
  Reqs sent(c.K);
  post_sends(link, peer, src, c, send_unit, &sent);
  recv_reduce(link, red, peer, a, dst, count, es, step, unit, dst == src ? &sent : nullptr);
}

}  // namespace ringcomm
