// TeamProgram: a GemmProgram (gemm_program.hpp) on every rank a Team object drives,
// whose norm ops may all-reduce their x over the team (GemmProgram::Norm::
// all_reduce). That is the TP > 1 decode layer as one persistent kernel per rank:
// a row-parallel GEMM publishes its partial as any op's out, the norm's shares push
// it to every rank's team mailbox (symmetric memory, the Lamport protocol of the
// mailbox collectives: comm.hpp) and sum the team's in rank order before the
// residual add and the norm, while the next ops' weights already stream. No second
// grid, no launch between.
//
// Bits: the all-reduce is the one-shot's (FP32 in rank order, one BF16 rounding),
// the norm the program norm's (reference/program_norm.hpp with the program's CTAs);
// every rank gets the same, run after run.
//
// Residency: every rank's program must be resident at once (their CTAs wait for
// each other), so a rank's program takes the SMs of its GPU divided by the ranks
// sharing it (the local team of 8 on one H200: 16 CTAs each). Failure: every wait
// for a peer is bounded by the team's deadline; a rank that never arrives makes
// its peers record a TimeoutError and abort the team, every program still
// completes (its outputs NaN from the failed op on), and Team::synchronize() or
// check_errors() raise it; Team::reset() makes the team usable again.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <span>
#include <vector>

#include "tpdecode/gemm_program.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {

class TeamProgram {
 public:
  // ops[i]: driven rank i's ops (team.driven() lists), each list as GemmProgram
  // takes it, for m rows. Every rank of the team must build its programs in the
  // same order relative to the team's other collective allocations, with the same
  // row count and the same all-reduce ops (their order and widths). Collective over
  // the team; host only, before any capture, on the team's device. Unavailable
  // where the ranks do not share memory. With record_timeline every rank's program
  // records its runs' timelines (program(i).timelines(); GemmProgram's diagnostic).
  TeamProgram(Team& team, std::vector<std::vector<GemmProgram::Op>> ops, int m, bool record_timeline = false);
  ~TeamProgram();
  TeamProgram(const TeamProgram&) = delete;
  TeamProgram& operator=(const TeamProgram&) = delete;

  // Runs every driven rank's program on streams[i] (empty: the team's streams);
  // graph-capturable (a captured run replays on this object's memory). With one rank
  // per GPU the programs are programmatic dependent launches where the team's
  // options allow it; ranks sharing a GPU launch plainly.
  void run(std::span<const cudaStream_t> streams = {}) const;

  const GemmProgram& program(int driven) const;
  int ctas() const;  // per rank

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
