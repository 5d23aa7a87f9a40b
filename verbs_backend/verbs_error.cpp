// verbs_backend/verbs_error.cpp — error conventions and logging (see header).
#include "verbs_error.hpp"

#include <array>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "ami/device/log.hpp"
#include "ami/error.hpp"

namespace ami::verbs {

void throw_call(const std::string& call, int err) { throw Error(call, err); }

void require(int rc, const std::string& call) {
  if (rc != 0) throw_call(call, errno_of_rc(rc));
}

void log(const char* format, ...) {
  va_list args;
  va_start(args, format);
  device::vlog("verbs", format, args);
  va_end(args);
}

void log_qp(const ibv_qp* qp, const char* what, int err) {
  log("QP 0x%06x: %s: %s", qp != nullptr ? qp->qp_num : 0u, what, std::strerror(err));
}

Status completion_status(ibv_wc_status status) {
  // One text per status, made once: Status keeps a pointer, never a copy.
  static constexpr int kStatuses = IBV_WC_TM_RNDV_INCOMPLETE + 1;
  static const std::array<std::string, kStatuses> texts = [] {
    std::array<std::string, kStatuses> t;
    for (int i = 0; i < kStatuses; ++i)
      t[static_cast<std::size_t>(i)] =
          std::string("verbs: work completion: ") + ibv_wc_status_str(static_cast<ibv_wc_status>(i));
    return t;
  }();
  const int i = static_cast<int>(status);
  const char* what = i >= 0 && i < kStatuses ? texts[static_cast<std::size_t>(i)].c_str()
                                             : "verbs: work completion: unknown status";
  switch (status) {
    case IBV_WC_SUCCESS:
      return Status::success();
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_REM_ABORT_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
    case IBV_WC_FATAL_ERR:
      return {StatusCode::peer_failed, what};
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_INV_RD_REQ_ERR:
      return {StatusCode::remote_access, what};
    default:
      return {StatusCode::device_error, what};
  }
}

}  // namespace ami::verbs
