// The synthetic drafter on a TP team's GPUs: every driven rank's weight shards
// (generated on the device from the seed), activation buffers and GEMM objects,
// and the step (step.hpp) enqueued on the stock or the specialised path.
//  - stock: cuBLAS (CublasContext::gemm), the stock collectives (TpComm with
//    CommAlgorithm::kStock: NCCL or its local equivalent, a separate norm kernel);
//    no programmatic dependent launch in the step's own kernels.
//  - specialised: DecodeGemm (cuBLAS where it does not take the shape), TpComm's
//    mailbox collectives where they serve the call (else its stock path),
//    programmatic dependent launch between kernels where each rank has its own GPU
//    (off on the local team, whose ranks share one: gpu_step_ops.cpp says why);
//    each layer's o_proj + all-reduce + post-attention norm as one PreparedOproj
//    call where its rule table (or set_oproj_kind) picks a fused kind for the
//    step's rows, else the two ops.
//  - program (TP 1, or ranks that share memory): up to kProgramMaxRows rows, the
//    step's runs of GEMMs, norms, residual adds, all-reduce + norms and SiLU-muls
//    as TeamPrograms (program_segments.hpp; one GemmProgram per rank, each on its
//    share of a shared GPU's SMs; built by prepare(m), their own copy of the
//    weights), the other ops (the embedding, the attention stand-ins, the gathers)
//    as the specialised path's kernels. Its norms sum in the program's order
//    (reference/program_norm.hpp) and its GEMMs split K their own way: other bits
//    than either path, repeatable. Above kProgramMaxRows the step runs as launches
//    (program_form): the specialised path's kernels, its bits.
// At TP 1 the stock and specialised paths run the all-reduce as its RMSNorm alone
// (the separate add-RMSNorm kernel) and have no gathers: they differ in the GEMMs
// and PDL.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drafter/config.hpp"
#include "drafter/step.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/gemm_program.hpp"
#include "tpdecode/oproj.hpp"
#include "tpdecode/team.hpp"
#include "tpdecode/team_program.hpp"

namespace tpdecode::drafter {

enum class DrafterPath { kStock, kSpecialised, kProgram };
const char* path_name(DrafterPath p);  // "stock" / "specialised" / "program"

// How the program path runs a step of m rows: GemmPrograms, or (above
// GpuDrafter::kProgramMaxRows) the specialised path's launches.
enum class ProgramForm { kPrograms, kLaunches };
const char* form_name(ProgramForm f);  // "programs" / "launches"

struct GpuRank;  // one driven rank's weights, buffers and GEMMs (src/drafter/gpu_rank.hpp)

class GpuDrafter {
 public:
  using Progress = std::function<void(const std::string&)>;

  // Collective over the team (under NCCL: every rank's thread); before any graph
  // capture. Builds weights for steps of up to rows_cap rows; `progress` hears
  // about the weight build.
  GpuDrafter(Team& team, const DrafterConfig& config, int rows_cap = 64, const Progress& progress = {});
  ~GpuDrafter();
  GpuDrafter(const GpuDrafter&) = delete;
  GpuDrafter& operator=(const GpuDrafter&) = delete;

  const DrafterConfig& config() const { return config_; }
  const RankShapes& shapes() const { return shapes_; }
  Team& team() const { return team_; }
  int rows_cap() const { return rows_cap_; }
  // The paths the collectives of the last enqueued step took, e.g. "one-shot 11,
  // stock 2 (why ...)".
  const std::string& comm_paths() const { return comm_paths_; }
  // Bytes of weights held by the driven ranks.
  std::size_t weight_bytes() const { return weight_bytes_; }

  // Host preparation for steps of m rows (DecodeGemm engines, the fused
  // o-projections; where serves_programs() and up to kProgramMaxRows the program
  // path's programs); before capture.
  void prepare(int m);
  // Whether the program path serves this team: TP 1, or ranks that share memory
  // (the all-reduces inside the programs: TeamProgram).
  bool serves_programs() const { return team_.size() == 1 || team_.shares_memory(); }
  // The most rows the program path runs as GemmPrograms (their 8-token kernel): the
  // step's programs ran 2 % faster than the launches at 1 row, level at 7, 2 % slower
  // at 14 and 16 (the 16-token kernel) and 8 % at 28 (docs/performance.md).
  static constexpr int kProgramMaxRows = 8;
  static ProgramForm program_form(int m) {
    return m <= kProgramMaxRows ? ProgramForm::kPrograms : ProgramForm::kLaunches;
  }
  // Forces the fused o-projection's kind on the specialised path (benchmarks,
  // tests); empty: its rule table. Host only, never under capture.
  void set_oproj_kind(std::optional<OprojKind> kind);
  // Enqueues one step of m rows on every driven rank: driven rank 0's stream forks
  // to the others and joins back (graph-capturable after prepare(m); a graph of
  // one step may be replayed back to back any number of times). The program path:
  // TP 1 and the whole step only (no filter).
  void enqueue_step(DrafterPath path, int m, const OpFilter& filter = {});
  // Driven rank 0's stream: capture and time on it.
  cudaStream_t stream() const;

  // After the last step (waits for it): driven rank i's logits [m, vocab] (BF16
  // bits) and draft tokens [m].
  std::vector<uint16_t> logits(int driven, int m) const;
  std::vector<int32_t> tokens(int driven, int m) const;

 private:
  Team& team_;
  DrafterConfig config_;
  RankShapes shapes_;
  int rows_cap_;
  std::size_t weight_bytes_ = 0;
  std::vector<std::unique_ptr<GpuRank>> ranks_;
  bool shared_gpu_;  // several ranks' kernels on one GPU (the local team)
  std::unique_ptr<TpComm> comm_;
  // Per layer (teams of 2 or more whose ranks share memory; else empty): o_proj +
  // all-reduce + post-attention RMSNorm, all layers on one mailbox.
  std::vector<std::unique_ptr<PreparedOproj>> oprojs_;
  std::string comm_paths_;
  // The program path's, per row count: a program per segment, in step order, and
  // the buffers of their private outs.
  struct Programs {
    std::vector<std::unique_ptr<TeamProgram>> programs;  // per segment
    std::vector<DeviceBuffer> buffers;
  };
  std::map<int, Programs> programs_;
  void build_programs(int m);
};

}  // namespace tpdecode::drafter
