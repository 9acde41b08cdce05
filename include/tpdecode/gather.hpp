// Gather: every rank's [rows, S] shard of 32-bit words into the [rows, TP·S] row
// of every rank (rank r's shard at columns r·S ...), through a Lamport mailbox.
//
// Grid (CTAs per row, rows) of kGatherThreads threads. Each thread first pushes its
// share of the row's shard fragments into every rank's mailbox (cleaned: a word
// equal to the sentinel is sent as 0), then polls its share of the gathered row in
// its own mailbox. All pushes precede every poll, and the launcher refuses a grid
// the ranks on one GPU could not all hold at once, so a poll only ever waits on
// CTAs that are running or done.
//
// Modes: kCopy copies the gathered row to a dense output and re-arms; kInPlace
// leaves it in the mailbox (gathered_rows()) for a later reader, which re-arms it
// with gather_rearm() before this rank's next gather on the same parity's partner
// (see the reuse argument in src/comm/lamport_protocol.hpp).
#pragma once

#include <cstdint>

#include "tpdecode/mailbox.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

inline constexpr int kGatherThreads = 256;

enum class GatherMode { kCopy, kInPlace };

// A gather mailbox: [2 parities, 1 slot, rows_cap, TP·shard_bytes].
// shard_bytes must be a multiple of 16.
MailboxShape gather_mailbox_shape(int team_size, int rows_cap, int64_t shard_bytes);

// CTAs per gathered row: about one fragment per thread, at most 32, and at most
// ~1.5 waves of one CTA per SM (192 CTAs) over all rows of all the ranks on one GPU.
int gather_ctas(int rows, int64_t frags_per_row, int ranks_on_device);

// Gathers driven rank `ctx`'s shard (any dtype; [rows, S], contiguous, rows 16-byte
// aligned, S·element bytes a multiple of 16) at mailbox parity `box`. kCopy: out is
// [rows, TP·S] of the shard's dtype; kInPlace: out is ignored. Throws
// InvalidArgument, CapacityError, TimeoutError (as all_reduce).
void gather(const RankContext& ctx, const Mailbox::View& box, const TensorView& shard, const TensorView& out,
            GatherMode mode);

// The gathered rows of an in-place gather in this rank's own mailbox:
// [rows_cap, TP·S] words, row stride box.row_bytes.
const void* gathered_rows(const RankContext& ctx, const Mailbox::View& box);

// Re-arms the first `rows` gathered rows of this rank's own mailbox (the reader of
// an in-place gather calls it once done), on ctx.stream.
void gather_rearm(const RankContext& ctx, const Mailbox::View& box, int rows);

}  // namespace tpdecode
