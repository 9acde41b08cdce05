// tpdecode.program.TeamProgram on the Python side: a TeamProgram (team_program.hpp)
// built op by op, rank by rank, from DLPack tensors, run from PyTorch's current stream.
#pragma once

#include <tvm/ffi/object.h>
#include <tvm/ffi/optional.h>

#include <memory>
#include <vector>

#include "team_object.hpp"
#include "tensor_args.hpp"
#include "tpdecode/team_program.hpp"

namespace tpdecode::python {

class TeamProgramObj : public tvm::ffi::Object {
 public:
  int64_t device = 0;  // the team's
  int64_t driven = 1;  // the team's driven ranks: op lists to add
  int64_t rows = 0;    // 0 until built
  int64_t ctas = 0;    // per rank, once built

  explicit TeamProgramObj(tvm::ffi::ObjectRef team);

  // Ops of driven rank `rank` (0 .. driven - 1), in program order (GemmProgram::Gemm
  // and ::Norm; after -1: x an input).
  void add_gemm(int64_t rank, DLView weight, DLView x, DLView out, int64_t after, bool silu_mul);
  void add_norm(int64_t rank, DLView x, int64_t after, DLView weight, double eps,
                tvm::ffi::Optional<DLView> residual, tvm::ffi::Optional<DLView> residual_out, DLView out,
                bool folded, bool all_reduce);
  // Collective over the team: checks and plans every rank's ops, packs the weights
  // (host work; not under capture).
  void build(int64_t m);
  // Runs every driven rank's program from PyTorch's current stream (taken from `on`,
  // any tensor of the device); pdl as the team's options say (TeamProgram::run).
  void run(DLView on, bool pdl);

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tpdecode.TeamProgram", TeamProgramObj, tvm::ffi::Object);

 private:
  std::vector<GemmProgram::Op>& ops_of(int64_t rank);

  tvm::ffi::ObjectRef team_ref_;  // the team (its mailboxes) lives as long as the program
  TeamObj* team_ = nullptr;
  std::vector<std::vector<GemmProgram::Op>> pending_;
  std::unique_ptr<TeamProgram> program_;
};

}  // namespace tpdecode::python
