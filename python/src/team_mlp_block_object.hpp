// tpdecode.MlpBlock(team=...) on the Python side: a TeamMlpBlock (team_mlp_block.hpp)
// on DLPack tensors, run from PyTorch's current stream.
#pragma once

#include <tvm/ffi/object.h>
#include <tvm/ffi/optional.h>

#include <memory>
#include <string>

#include "team_object.hpp"
#include "tensor_args.hpp"
#include "tpdecode/team_mlp_block.hpp"

namespace tpdecode::python {

class TeamMlpBlockObj : public tvm::ffi::Object {
 public:
  int64_t device = 0;
  int64_t rows = 0;
  bool launches = false;  // TeamMlpBlock::Form::kLaunches

  // Every rank's weights and buffers as TeamMlpBlock's, each a contiguous bf16 tensor
  // on the team's device: on a local team of n, [n, ...] (block i rank i's), else
  // this rank's; the norms' weights [H] (or [1, H]), one for every rank. `form`: ""
  // (the block's choice), "program" or "launches"; `comm_group` as TeamMlpBlock's.
  TeamMlpBlockObj(tvm::ffi::ObjectRef team, tvm::ffi::Optional<DLView> o_proj, DLView post_norm, DLView gate_up,
                  DLView down, DLView next_norm, tvm::ffi::Optional<DLView> qkv, double eps, DLView attn,
                  DLView residual, DLView out, const std::string& form, int64_t comm_group);

  // Runs from PyTorch's current stream (taken from `on`, any tensor of the device);
  // pdl as the team's options say (TeamProgram::run).
  void run(DLView on, bool pdl);

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tpdecode.TeamMlpBlock", TeamMlpBlockObj, tvm::ffi::Object);

 private:
  tvm::ffi::ObjectRef team_ref_;  // the team (its mailboxes) lives as long as the block
  TeamObj* team_ = nullptr;
  std::unique_ptr<TeamMlpBlock> block_;
};

}  // namespace tpdecode::python
