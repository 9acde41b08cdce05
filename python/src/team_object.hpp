// tpdecode.Team on the Python side: one Team (local or NCCL) and its TpComm, with
// the collectives taking DLPack tensors and PyTorch's current stream.
#pragma once

#include <tvm/ffi/object.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensor_args.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode::python {

class TeamObj : public tvm::ffi::Object {
 public:
  // Fields Python reads (set once).
  int64_t rank = 0;
  int64_t size = 1;
  int64_t driven = 1;  // ranks this object drives: the local team's every rank, else 1
  int64_t device = 0;
  bool shares_memory = false;
  tvm::ffi::String kind;
  tvm::ffi::String description;

  explicit TeamObj(std::unique_ptr<Team> team);

  // Collective: the TpComm every call runs on (before any capture).
  void build_comm(int64_t hidden, int64_t rows, int64_t gather_row_bytes, const tvm::ffi::String& algorithm,
                  bool batch_invariant);
  void set_algorithm(const tvm::ffi::String& algorithm);

  // Each returns the CommPath taken (comm.hpp); last_why() says why not a mailbox.
  int64_t all_reduce(DLView x, DLView out);
  // quant: "none" (out bf16), "static" (out e4m3 as 1-byte elements, scale an f32
  // tensor of one element, read), "group" or "group-ue8m0" (scale the f32 group
  // scales [rows, hidden / 128] per rank, written).
  int64_t ar_norm(DLView x, tvm::ffi::Optional<DLView> residual, DLView weight, double eps, DLView out,
                  DLView residual_out, const tvm::ffi::String& quant, tvm::ffi::Optional<DLView> scale);
  int64_t gather(DLView shard, DLView out);
  tvm::ffi::String last_why() const { return last_why_; }

  void check_errors() const;

  // For the objects built on the team (TeamMlpBlockObj).
  Team& team() const { return *team_; }
  // Runs `enqueue(streams)` for the driven ranks from the caller's stream: on it for
  // one rank; for a local team's ranks on the team's streams, forked from and joined
  // back to it (a capture ends with every fork joined, also when enqueue throws).
  void on_rank_streams(const std::function<void(std::span<const cudaStream_t>)>& enqueue);

  // stream: the caller's (torch's current stream of the device, as a handle): the
  // team waits for it too (Team::synchronize, Team::reset).
  void synchronize(int64_t limit_ms, int64_t stream);
  void reset(int64_t stream);

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tpdecode.Team", TeamObj, tvm::ffi::Object);

 private:
  TpComm& comm() const;
  // Why the comm does not serve `op` ("all_reduce", "ar_norm", "gather"), "" where
  // it does: for `dtype` (PyTorch's name; raised as UnsupportedDType), then for the
  // rows of a validated tensor (NotServed). The caller may then run torch instead.
  std::string dtype_refusal(const std::string& op, const std::string& dtype) const;
  std::string shape_refusal(const std::string& op, int64_t rows, int64_t cols, int64_t element_bytes) const;
  // The quantised ArNorm's tensors: out as e4m3 and the scale's views, or raise.
  void bind_quant(ArNormQuant quant, const tvm::ffi::Optional<DLView>& scale, int64_t rows, int64_t hidden,
                  std::vector<ArNormIo>& io) const;
  // Runs `call` for every driven rank on the caller's stream; the local team's ranks
  // run on the team's streams, forked from and joined back to it.
  template <class Io, class Call>
  int64_t run(const std::vector<Io>& io, Call call);

  std::unique_ptr<Team> team_;
  std::unique_ptr<TpComm> comm_;  // declared after team_: destroyed first
  std::vector<cudaStream_t> streams_;
  std::string last_why_;
};

}  // namespace tpdecode::python
