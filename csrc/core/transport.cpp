#include "core/transport.h"

namespace ringcomm {

// A transport without point-to-point messages (every one ringcomm has
// carries them; GroupedTransport through its host transport): a clear
// error before anything moves.
RequestPtr Transport::p2p_send(int, const void*, size_t, uint32_t) {
  throw_invalid("point-to-point (send/recv): transport '" + name() + "' does not carry it");
}
RequestPtr Transport::p2p_take(int, uint32_t, void*, size_t) {
  throw_invalid("point-to-point (send/recv): transport '" + name() + "' does not carry it");
}
bool Transport::p2p_peek(int, uint32_t, int*, size_t*, uint32_t*) { return false; }

}  // namespace ringcomm
