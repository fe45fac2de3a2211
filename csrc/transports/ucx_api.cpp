#include "transports/ucx_api.h"

#include <dlfcn.h>

#include <mutex>

#include "core/vocabulary.h"

namespace ringcomm {
namespace ucx {

namespace {

const char kInstall[] = "install it with `pip install libucx-cu13` (or the `ringcomm[ucx]` extra)";

#ifdef RINGCOMM_HAVE_UCX

struct State {
  Api api{};
  bool ok = false;
  std::string why;
};

template <class F>
bool bind(void* lib, const char* lib_name, const char* name, F& fn, std::string& why) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && why.empty())
    why = std::string(lib_name) + " has no " + name + " (UCX older than 1.14?); " + kInstall;
  return fn != nullptr;
}

const State& state() {
  static State s;
  static std::once_flag once;
  std::call_once(once, [] {
    // RTLD_GLOBAL is not needed: we only dlsym from these handles. The
    // handles are never closed: UCX keeps threads and memory hooks that must
    // outlive every worker. A libucp already in the process (Open MPI's
    // wheel links its own UCX 1.20 into libmpi, so it is loaded with
    // ringcomm._core) is the one found by soname, and the one to use: a second UCX in one process would install
    // a second set of memory hooks (ringcomm/ucx.py then skips the preload).
    void* ucp = dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!ucp) {
      const char* e = dlerror();
      s.why = std::string("libucp.so.0 could not be loaded (") + (e ? e : "unknown error") + "); " + kInstall;
      return;
    }
    Api& a = s.api;
    const char* n = "libucp.so.0";
    bool ok = bind(ucp, n, "ucp_get_version", a.get_version, s.why) &
              bind(ucp, n, "ucp_get_version_string", a.get_version_string, s.why) &
              bind(ucp, n, "ucp_init_version", a.init_version, s.why) &
              bind(ucp, n, "ucp_config_read", a.config_read, s.why) &
              bind(ucp, n, "ucp_config_modify", a.config_modify, s.why) &
              bind(ucp, n, "ucp_config_release", a.config_release, s.why) &
              bind(ucp, n, "ucp_cleanup", a.cleanup, s.why) &
              bind(ucp, n, "ucp_worker_create", a.worker_create, s.why) &
              bind(ucp, n, "ucp_worker_destroy", a.worker_destroy, s.why) &
              bind(ucp, n, "ucp_worker_query", a.worker_query, s.why) &
              bind(ucp, n, "ucp_worker_release_address", a.worker_release_address, s.why) &
              bind(ucp, n, "ucp_worker_progress", a.worker_progress, s.why) &
              bind(ucp, n, "ucp_worker_get_efd", a.worker_get_efd, s.why) &
              bind(ucp, n, "ucp_worker_arm", a.worker_arm, s.why) &
              bind(ucp, n, "ucp_worker_signal", a.worker_signal, s.why) &
              bind(ucp, n, "ucp_ep_create", a.ep_create, s.why) &
              bind(ucp, n, "ucp_ep_close_nbx", a.ep_close_nbx, s.why) &
              bind(ucp, n, "ucp_ep_query", a.ep_query, s.why) &
              bind(ucp, n, "ucp_tag_send_nbx", a.tag_send_nbx, s.why) &
              bind(ucp, n, "ucp_tag_recv_nbx", a.tag_recv_nbx, s.why) &
              bind(ucp, n, "ucp_tag_probe_nb", a.tag_probe_nb, s.why) &
              bind(ucp, n, "ucp_tag_msg_recv_nbx", a.tag_msg_recv_nbx, s.why) &
              bind(ucp, n, "ucp_tag_recv_request_test", a.tag_recv_request_test, s.why) &
              bind(ucp, n, "ucp_request_check_status", a.request_check_status, s.why) &
              bind(ucp, n, "ucp_request_cancel", a.request_cancel, s.why) &
              bind(ucp, n, "ucp_request_free", a.request_free, s.why);
    // libucp depends on libucs, so this finds the copy already loaded.
    if (void* ucs = dlopen("libucs.so.0", RTLD_NOW | RTLD_LOCAL))
      a.status_string = reinterpret_cast<decltype(a.status_string)>(dlsym(ucs, "ucs_status_string"));
    s.ok = ok;
  });
  return s;
}

#endif  // RINGCOMM_HAVE_UCX

}  // namespace

#ifdef RINGCOMM_HAVE_UCX

bool in_process() {
  void* lib = dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);
  if (lib) dlclose(lib);  // drops only the reference NOLOAD added
  return lib != nullptr;
}

bool available(std::string* why) {
  const State& s = state();
  if (!s.ok && why) *why = s.why;
  return s.ok;
}

const Api& api() {
  const State& s = state();
  if (!s.ok) throw RingError(ErrKind::transport, -1, -1, 0, "UCX is not available: " + s.why);
  return s.api;
}

std::string version() { return api().get_version_string(); }

std::string status_text(ucs_status_t st) {
  const State& s = state();
  std::string text = s.ok && s.api.status_string ? s.api.status_string(st) : "UCX status";
  return text + " (" + std::to_string(int(st)) + ")";
}

#else

namespace {
const char kNoHeaders[] =
    "ringcomm was built without UCX headers (ucp/api/ucp.h was not found at build time): "
    "install libucx-cu13 (`pip install libucx-cu13`) and rebuild ringcomm";
}

bool in_process() { return false; }

bool available(std::string* why) {
  if (why) *why = kNoHeaders;
  return false;
}

std::string version() { throw RingError(ErrKind::transport, -1, -1, 0, std::string("UCX is not available: ") + kNoHeaders); }

#endif

}  // namespace ucx
}  // namespace ringcomm
