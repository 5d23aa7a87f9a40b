// verbs_backend/verbs_resources.hpp — move-only owners of every verbs and
// rdma_cm object the backend creates, and of the page-aligned buffers it
// registers.
//
// Each owner is a unique_ptr whose deleter calls the matching destroy and
// logs (never throws) when it fails. Holders declare them in creation order
// so that destruction runs QP -> SRQ -> CQ -> channel -> MR -> PD -> device,
// and a constructor that throws half-way frees exactly what it made.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <memory>

#include "ami/device/pages.hpp"
#include "verbs_error.hpp"

namespace ami::verbs {

namespace detail {

struct CloseDevice {
  void operator()(ibv_context* c) const {
    if (int rc = ibv_close_device(c)) log("ibv_close_device: error %d", errno_of_rc(rc));
  }
};
struct DeallocPd {
  void operator()(ibv_pd* p) const {
    if (int rc = ibv_dealloc_pd(p)) log("ibv_dealloc_pd: error %d", errno_of_rc(rc));
  }
};
struct DestroyCompChannel {
  void operator()(ibv_comp_channel* c) const {
    if (int rc = ibv_destroy_comp_channel(c)) log("ibv_destroy_comp_channel: error %d", errno_of_rc(rc));
  }
};
struct DestroyCq {
  void operator()(ibv_cq* c) const {
    if (int rc = ibv_destroy_cq(c)) log("ibv_destroy_cq: error %d", errno_of_rc(rc));
  }
};
struct DestroySrq {
  void operator()(ibv_srq* s) const {
    if (int rc = ibv_destroy_srq(s)) log("ibv_destroy_srq: error %d", errno_of_rc(rc));
  }
};
struct DestroyQp {
  void operator()(ibv_qp* q) const {
    const ibv_qp copy = *q;  // for the log line: q is gone after the call
    if (int rc = ibv_destroy_qp(q)) log_qp(&copy, "ibv_destroy_qp", errno_of_rc(rc));
  }
};
struct DestroyAh {
  void operator()(ibv_ah* a) const {
    if (int rc = ibv_destroy_ah(a)) log("ibv_destroy_ah: error %d", errno_of_rc(rc));
  }
};
struct DeregMr {
  void operator()(ibv_mr* m) const {
    if (int rc = ibv_dereg_mr(m)) log("ibv_dereg_mr: error %d", errno_of_rc(rc));
  }
};
struct DestroyCmChannel {
  void operator()(rdma_event_channel* c) const { rdma_destroy_event_channel(c); }
};
struct DestroyCmId {
  void operator()(rdma_cm_id* id) const {
    if (rdma_destroy_id(id) != 0) log("rdma_destroy_id: error %d", errno);
  }
};
struct FreeDeviceList {
  void operator()(ibv_device** list) const { ibv_free_device_list(list); }
};

}  // namespace detail

using DeviceOwner = std::unique_ptr<ibv_context, detail::CloseDevice>;
using PdOwner = std::unique_ptr<ibv_pd, detail::DeallocPd>;
using CompChannelOwner = std::unique_ptr<ibv_comp_channel, detail::DestroyCompChannel>;
using CqOwner = std::unique_ptr<ibv_cq, detail::DestroyCq>;
using SrqOwner = std::unique_ptr<ibv_srq, detail::DestroySrq>;
using QpOwner = std::unique_ptr<ibv_qp, detail::DestroyQp>;
using MrOwner = std::unique_ptr<ibv_mr, detail::DeregMr>;
using AhOwner = std::unique_ptr<ibv_ah, detail::DestroyAh>;
using CmChannelOwner = std::unique_ptr<rdma_event_channel, detail::DestroyCmChannel>;
using CmIdOwner = std::unique_ptr<rdma_cm_id, detail::DestroyCmId>;
using DeviceListOwner = std::unique_ptr<ibv_device*, detail::FreeDeviceList>;
using device::allocate_pages;
using device::PageBuffer;

// Registers [address, address + bytes) with pd; throws ami::Error.
MrOwner register_memory(ibv_pd* pd, void* address, std::size_t bytes, int access, const char* what);

}  // namespace ami::verbs
