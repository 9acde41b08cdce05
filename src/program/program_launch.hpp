// Launcher of the GEMM program's kernel (program_kernel.cu): the device-side
// descriptors the host prepares once (gemm_program.cpp) and the kernel reads.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "comm/protocol.hpp"
#include "program/program_plan.hpp"

namespace tpdecode::program {

// One GEMM op in device memory.
struct OpDesc {     // aligned as CUtensorMap (64 bytes or more)
  // x through a tensor map per mailbox epoch (an input: the same map twice), in
  // boxes [depth][tokens][64].
  CUtensorMap x_map[2];
  const void* packed;  // the weight as pack_weight lays it out
  int64_t steps;       // K steps of the op
  int64_t k;
  int64_t n;           // out's columns
  void* out;           // [m, out_stride] bf16
  int64_t out_stride;
  // Where the loaders poll x (an op that reads an earlier one's out): its window in
  // the mailbox, from element x_mailbox of an epoch, rows x_stride apart (-1: an
  // input of the program, which only the copies read).
  int64_t x_stride;
  int64_t x_mailbox;
  int64_t out_mailbox; // where this op publishes its outputs; -1: no op reads them
  int64_t out_mailbox_stride;
  int32_t after;   // the op whose outputs x is a window of (-1: an input)
  int32_t blocks;  // 64-row blocks: op_done[this op] counts to this where an op reads it
  // A norm op (norm 1; program_norm.cuh): no weight, no units. x is the mailbox
  // window above (after >= 0) or x_input; the residual an input or an earlier norm's
  // residual_out (null: none), or a folded norm's residual stream, read where its
  // GEMM published it (residual_mailbox >= 0); its stats region (floats into an
  // epoch's words). A folded norm (norm 2) has no work: its x's producer and its
  // readers (below) do it.
  int32_t norm;
  // A norm (norm 1) that no op of the program reads (neither its out nor its
  // residual_out): its shares run after the CTA's last unit, so that its waits do not
  // hold the finisher's work on the GEMMs after it.
  int32_t deferred;
  float eps;
  const void* norm_weight;  // [k] bf16
  const void* x_input;
  int64_t x_input_stride;
  const void* residual;
  int64_t residual_stride;
  void* residual_out;  // null: none
  int64_t residual_out_stride;
  // A norm's stats, or (a GEMM producing a folded norm's x) its blocks' per-row
  // sums of squares of what it publishes: elements into an epoch (-1: none).
  int64_t stats;         // protocol::stats_word (a norm: per CTA; a GEMM: per block)
  int64_t stats_stride;  // floats per token
  int64_t residual_mailbox;  // -1, or the element of an epoch where the residual's rows start
  int64_t residual_mailbox_stride;
  // An op that must wait, before it stores, for another op's count to complete
  // (a residual stream another CTA wrote in place: -1 none).
  int32_t residual_after_op;
  // 1: another op stores over what this op's CTAs wrote in place (it is that op's
  // residual_after_op), so this op's count releases its outputs and readers acquire
  // it. 0: the count is relaxed (a release waits for the SM's weight stream in
  // flight) and the loaders check the words their copies of its outputs bring.
  int32_t count_release;
  // A GEMM reading a folded norm: its sums times the row's rstd from the norm's
  // producer's stats (rstd_stats, -1: none), blocks [rstd_first, + rstd_blocks) of
  // rstd_stride floats a row, over rstd_k columns with `eps`.
  int32_t rstd_first;
  int32_t rstd_blocks;
  int64_t rstd_stats;
  int64_t rstd_stride;
  int64_t rstd_k;
  // 1: GemmProgram::Epilogue::kSiluMul: every block's rows are 32 gate rows and their
  // 32 up rows (pack_weight's gated order) and out (n columns) is silu(gate) * up.
  int32_t silu_mul;
  // A norm whose x is this rank's partial: first summed over the team (program_team.hpp),
  // its pieces at fragments team_fragment + column / 8 of the team mailbox's rows.
  int32_t all_reduce;
  int64_t team_fragment;
};

// The counters the kernel keeps in device memory. op_done and ctas_done are zero
// between runs (the last CTA to finish resets them); epoch counts the runs: run r
// publishes into mailbox epoch r % 2 and empties the other.
struct Counters {
  uint32_t* op_done;    // [ops] blocks published (of the ops other ops read)
  uint32_t* ctas_done;  // [1]
  uint32_t* epoch;      // [1]
};

// The u64 fields a timeline records per CTA and op (GemmProgram::OpTimes's).
inline constexpr int kTimelineFields = 5;

struct Args {
  const OpDesc* ops;
  const Unit* units;
  const int32_t* cta_begin;  // [grid + 1]
  Counters counters;
  float* scratch;  // split blocks' partials: every float 0xffffffff (empty) between runs
  uint32_t* mailbox;  // [2][epoch_words]: every word 0xffffffff (empty) where a run will publish
  int64_t epoch_words;  // a multiple of 4
  int op_count;
  int m;
  int stages;
  int inflight_stages;  // weight stages issued and not landed, at most
  int polling_inflight_stages;  // the same while a loader warp polls the mailbox
  // With a timeline: [8 runs][ctas][1 + kTimelineFields ops] u64, run r's in slot
  // r % 8: per CTA its SM, then per op the fields of GemmProgram::OpTimes in order.
  // Else null.
  uint64_t* timeline;
  // A TeamProgram's rank (team_ops 1: some norm all-reduces; program_team.hpp): the
  // team as this rank sees it and the program's team mailbox.
  int team_ops;
  lamport::TeamRef team;
  lamport::MailboxRef team_box;
};

// The kernel's shape for a program of m rows: the token tile (wgmma's N), the
// chunks per K step, the ring depth that fits the shared memory, the stages in
// flight, and its bytes.
struct KernelShape {
  int tokens = 8;
  int depth = 4;
  int stages = 0;
  int inflight_stages = 0;  // the weight producer's cap on stages in flight
  int polling_inflight_stages = 0;  // its cap while a loader warp polls
  int smem_bytes = 0;
};
// The weight bytes a CTA keeps in flight, at most (kernel_shape: why).
inline constexpr int kInFlightBytes = 64 * 1024;
inline constexpr int kPollingInFlightBytes = 32 * 1024;  // while a loader polls
KernelShape kernel_shape(int m);

// The weight [n, k] packed for the kernel at `depth` chunks per step: per 64-row
// block and K step, depth tiles of [64, 64] bf16 in the 128-byte swizzle, one
// contiguous run (zeros past n and k); bytes of that, and the packing on `stream`.
// Gated (n = 2 i: i gate rows, then i up rows): block b's rows 16 g + h are gate row
// 32 b + 8 g + h and, 8 rows on, its up row (g < 4, h < 8), so the consumer thread
// that holds a gate value holds its up value (wgmma's fragment rows r and r + 8).
int64_t packed_rows(int64_t n, bool gated);
int64_t packed_bytes(int64_t n, int64_t k, int depth, bool gated);
// With `scale` ([k] bf16, or null), every value is bf16(w[r][c] * scale[c]) (a folded
// norm's weight).
void pack_weight(const void* w, int64_t n, int64_t k, int depth, bool gated, const void* scale, void* packed,
                 cudaStream_t stream);

// Raises the kernels' shared-memory limit on the current device (host only; idempotent).
void prepare_program_kernels();
// CTAs per SM the kernel of this shape holds (0: it does not fit).
int resident_ctas_per_sm(const KernelShape& s);

void launch_program(const Args& a, const KernelShape& s, int grid, bool pdl, cudaStream_t stream);

}  // namespace tpdecode::program
