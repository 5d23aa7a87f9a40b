// verbs_backend/verbs_error.hpp — the one place that knows how ibverbs and
// librdmacm report failure, and how the backend logs it.
//
// ibverbs has three conventions: object constructors return NULL and set
// errno; most other calls return an errno value (some providers return -1
// and set errno instead); ibv_poll_cq returns a negative count. librdmacm
// returns -1 and sets errno. Everything here turns those into an errno value,
// an ami::Error (constructors) or a log line naming the call, the QP number in
// hex and errno's text (data path, destructors). Thread-safe.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "ami/status.hpp"

namespace ami::verbs {

// errno after a call that returned NULL (never 0: a provider that forgot to
// set it still gets a meaningful text).
inline int errno_of_null() { return errno != 0 ? errno : EIO; }

// errno after a call that returned rc: 0 is success, a positive rc is the
// errno itself, a negative rc means "look at errno" (or is -errno).
inline int errno_of_rc(int rc) {
  if (rc >= 0) return rc;
  if (errno != 0) return errno;
  return rc == -1 ? EIO : -rc;
}

// Throws ami::Error("<call>: <strerror(err)>").
[[noreturn]] void throw_call(const std::string& call, int err);

// Constructor helpers: the object, or an ami::Error naming call.
template <typename T>
T* require(T* object, const char* call) {
  if (object == nullptr) throw_call(call, errno_of_null());
  return object;
}
void require(int rc, const std::string& call);

// "ami: verbs: <text>" on stderr, one line.
void log(const char* format, ...) __attribute__((format(printf, 1, 2)));
// "ami: verbs: QP 0x<qpn>: <what>: <strerror(err)>".
void log_qp(const ibv_qp* qp, const char* what, int err);

// A send or receive completion's error as a Status: the text names
// ibv_wc_status_str() and is static (built once, never freed). Retry and
// flush errors mean the lane to the peer is gone (peer_failed); access
// errors are remote_access; the rest device_error.
Status completion_status(ibv_wc_status status);

}  // namespace ami::verbs
