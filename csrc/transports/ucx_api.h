// The UCP entry points ringcomm uses, resolved from libucp.so.0 at run time
// (dlopen on first use), as csrc/cuda/nccl_api.h does for NCCL: ringcomm
// neither links against UCX nor needs it installed to import. The headers
// are needed at build time only (setup.py finds them in the libucx-cu13
// wheel or /usr/include and defines RINGCOMM_HAVE_UCX); without them the UCX
// entry points raise an error saying so.
//
// The library comes from the libucx-cu13 wheel (ringcomm/ucx.py preloads it
// with libucx.load_library(), so dlopen by soname finds it) or the system's
// loader path. A missing or broken UCX is a RingError naming what to install.
#pragma once

#include <string>

#ifdef RINGCOMM_HAVE_UCX
#include <ucp/api/ucp.h>
#endif

namespace ringcomm {
namespace ucx {

// Whether UCX can be used here; else false and why (what to install, or
// that this build has no UCX headers).
bool available(std::string* why = nullptr);

// Whether a libucp.so.0 is already loaded in this process (by anyone).
bool in_process();

// "1.22.0" (ucp_get_version_string); throws the clear error when unavailable.
std::string version();

#ifdef RINGCOMM_HAVE_UCX
// The function table. Types are taken from the declarations in ucp.h, so a
// mismatch with the headers is a compile error, not a crash; the symbols are
// never referenced by the linker.
struct Api {
  decltype(&::ucp_get_version) get_version;
  decltype(&::ucp_get_version_string) get_version_string;
  decltype(&::ucp_init_version) init_version;
  decltype(&::ucp_config_read) config_read;
  decltype(&::ucp_config_modify) config_modify;
  decltype(&::ucp_config_release) config_release;
  decltype(&::ucp_cleanup) cleanup;
  decltype(&::ucp_worker_create) worker_create;
  decltype(&::ucp_worker_destroy) worker_destroy;
  decltype(&::ucp_worker_query) worker_query;
  decltype(&::ucp_worker_release_address) worker_release_address;
  decltype(&::ucp_worker_progress) worker_progress;
  decltype(&::ucp_worker_get_efd) worker_get_efd;
  decltype(&::ucp_worker_arm) worker_arm;
  decltype(&::ucp_worker_signal) worker_signal;
  decltype(&::ucp_ep_create) ep_create;
  decltype(&::ucp_ep_close_nbx) ep_close_nbx;
  decltype(&::ucp_ep_query) ep_query;
  decltype(&::ucp_tag_send_nbx) tag_send_nbx;
  decltype(&::ucp_tag_recv_nbx) tag_recv_nbx;
  decltype(&::ucp_tag_probe_nb) tag_probe_nb;
  decltype(&::ucp_tag_msg_recv_nbx) tag_msg_recv_nbx;
  decltype(&::ucp_tag_recv_request_test) tag_recv_request_test;
  decltype(&::ucp_request_check_status) request_check_status;
  decltype(&::ucp_request_cancel) request_cancel;
  decltype(&::ucp_request_free) request_free;
  // From libucs.so.0; null when it could not be resolved (status_text then
  // prints the number).
  decltype(&::ucs_status_string) status_string;
};

// The loaded table; throws RingError(transport) naming what to install.
const Api& api();

// "UCS_ERR_NO_MEMORY (-4)"-like text for error messages.
std::string status_text(ucs_status_t s);
#endif

}  // namespace ucx
}  // namespace ringcomm
