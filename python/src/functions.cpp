// The extension's free functions (loaded by python/tpdecode/_lib.py): what the
// machine offers, and the factories of teams, GEMMs and programs.
#include <cuda_runtime_api.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <cstring>

#include "errors.hpp"
#include "gemm_object.hpp"
#include "gemm_program_object.hpp"
#include "mlp_block_object.hpp"
#include "team_mlp_block_object.hpp"
#include "team_program_object.hpp"
#include "team_object.hpp"
#include "tpdecode/device_info.hpp"
#include "tpdecode/version.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode::python {
namespace {

namespace ffi = tvm::ffi;
using Dict = ffi::Map<ffi::String, ffi::Any>;

Dict gpu_dict(const GpuInfo& g) {
  Dict d;
  d.Set("index", static_cast<int64_t>(g.index));
  d.Set("name", ffi::String(g.name));
  d.Set("compute_capability", ffi::String(std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor)));
  d.Set("sms", static_cast<int64_t>(g.sms));
  d.Set("memory_bytes", static_cast<int64_t>(g.memory_bytes));
  d.Set("l2_bytes", static_cast<int64_t>(g.l2_bytes));
  d.Set("cluster_launch", g.cluster_launch);
  d.Set("vmm", static_cast<int64_t>(g.vmm));
  d.Set("multicast", static_cast<int64_t>(g.multicast));
  return d;
}

// What `tpdecode info` reports, as nested maps and arrays (Python turns them into a dict).
Dict info() {
  return translated([] {
    const SystemInfo s = query_system();
    Dict d;
    d.Set("version", ffi::String(tpdecode::version()));
    d.Set("no_gpu_reason", ffi::String(s.no_gpu_reason));
    d.Set("driver_version", static_cast<int64_t>(s.driver_version));
    d.Set("runtime_version", static_cast<int64_t>(s.runtime_version));
    d.Set("nccl_version", static_cast<int64_t>(s.nccl_version));
    ffi::Array<ffi::Any> gpus, peers, backends;
    for (const GpuInfo& g : s.gpus) gpus.push_back(gpu_dict(g));
    for (const std::vector<int>& row : s.peer_access) {
      ffi::Array<ffi::Any> r;
      for (int v : row) r.push_back(static_cast<int64_t>(v));
      peers.push_back(r);
    }
    for (const Backend& b : s.backends) {
      Dict bd;
      bd.Set("name", ffi::String(b.name));
      bd.Set("serves", b.serves);
      bd.Set("why", ffi::String(b.why));
      backends.push_back(bd);
    }
    d.Set("gpus", gpus);
    d.Set("peer_access", peers);
    d.Set("backends", backends);
    return d;
  });
}

TeamOptions team_options(int64_t timeout_ms, bool pdl) {
  TeamOptions o;
  o.timeout_ms = static_cast<uint64_t>(std::max<int64_t>(timeout_ms, 0));
  o.pdl = pdl;
  return o;
}

// The CUDA major version the extension was built with (its libcudart, libcublas).
int64_t built_cuda_major() { return CUDART_VERSION / 1000; }

ffi::String library_version() { return ffi::String(tpdecode::version()); }

// Builds a team on `device` without moving the caller's current device.
template <class Make>
ffi::ObjectRef team_on(int64_t device, Make make) {
  return translated([&] {
    DeviceScope scope(static_cast<int>(device));
    return ffi::ObjectRef(ffi::make_object<TeamObj>(make()));
  });
}

ffi::ObjectRef local_team(int64_t size, int64_t device, int64_t timeout_ms, bool pdl) {
  if (device < 0) raise(kind::kValue, "local team: device must be >= 0");
  return team_on(device, [&] {
    return std::make_unique<LocalTeam>(static_cast<int>(size), static_cast<int>(device), team_options(timeout_ms, pdl));
  });
}

ffi::ObjectRef nccl_team(const ffi::Bytes& id, int64_t rank, int64_t size, int64_t device, int64_t timeout_ms,
                         bool pdl) {
  NcclUniqueId uid{};
  if (id.size() != uid.size())
    raise(kind::kValue, "NCCL unique id of " + std::to_string(id.size()) + " bytes, 128 expected");
  std::memcpy(uid.data(), id.data(), uid.size());
  return team_on(device, [&] {
    return std::make_unique<NcclTeam>(uid, static_cast<int>(rank), static_cast<int>(size), static_cast<int>(device),
                                      team_options(timeout_ms, pdl));
  });
}

ffi::ObjectRef nccl_team_from_comm(int64_t comm, int64_t device, int64_t timeout_ms, bool pdl) {
  if (comm == 0) raise(kind::kValue, "null NCCL communicator");
  return team_on(device, [&] {
    return std::make_unique<NcclTeam>(reinterpret_cast<ncclComm*>(comm), static_cast<int>(device),
                                      team_options(timeout_ms, pdl));
  });
}

ffi::Bytes nccl_unique_id() {
  return translated([] {
    const NcclUniqueId id = NcclTeam::make_unique_id();
    return ffi::Bytes(id.data(), id.size());
  });
}

ffi::ObjectRef decode_gemm(DLView weight, bool shared_cublas) {
  return ffi::ObjectRef(ffi::make_object<DecodeGemmObj>(weight, shared_cublas));
}

ffi::ObjectRef gemm_program() { return ffi::ObjectRef(ffi::make_object<GemmProgramObj>()); }

ffi::ObjectRef mlp_block(ffi::Optional<DLView> o_proj, DLView post_norm, DLView gate_up, DLView down,
                         ffi::Optional<DLView> next_norm, ffi::Optional<DLView> qkv, double eps, DLView attn,
                         DLView residual, DLView out, bool fold, ffi::String form) {
  return ffi::ObjectRef(ffi::make_object<MlpBlockObj>(o_proj, post_norm, gate_up, down, next_norm, qkv, eps, attn,
                                                      residual, out, fold, std::string(form)));
}

ffi::ObjectRef team_mlp_block(ffi::ObjectRef team, ffi::Optional<DLView> o_proj, DLView post_norm, DLView gate_up,
                              DLView down, DLView next_norm, ffi::Optional<DLView> qkv, double eps, DLView attn,
                              DLView residual, DLView out, ffi::String form, int64_t comm_group) {
  return ffi::ObjectRef(ffi::make_object<TeamMlpBlockObj>(std::move(team), o_proj, post_norm, gate_up, down, next_norm,
                                                          qkv, eps, attn, residual, out, std::string(form),
                                                          comm_group));
}

ffi::ObjectRef team_program(ffi::ObjectRef team) {
  return ffi::ObjectRef(ffi::make_object<TeamProgramObj>(std::move(team)));
}

}  // namespace
}  // namespace tpdecode::python

TVM_FFI_DLL_EXPORT_TYPED_FUNC(info, tpdecode::python::info);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(built_cuda_major, tpdecode::python::built_cuda_major);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(library_version, tpdecode::python::library_version);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(local_team, tpdecode::python::local_team);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(nccl_team, tpdecode::python::nccl_team);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(nccl_team_from_comm, tpdecode::python::nccl_team_from_comm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(nccl_unique_id, tpdecode::python::nccl_unique_id);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(decode_gemm, tpdecode::python::decode_gemm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemm_program, tpdecode::python::gemm_program);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(mlp_block, tpdecode::python::mlp_block);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(team_mlp_block, tpdecode::python::team_mlp_block);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(team_program, tpdecode::python::team_program);
