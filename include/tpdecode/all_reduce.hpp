// One-shot all-reduce of BF16 rows over a Lamport mailbox: every rank pushes its
// partial row into slot [rank] of every rank's mailbox, polls its own TP slots,
// sums them in FP32 in rank order 0..TP-1 and rounds once to BF16 (every rank gets
// the same bits), then re-arms its slots.
#pragma once

#include "tpdecode/mailbox.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

// A mailbox for all_reduce of up to rows_cap rows of `hidden` BF16 columns:
// [2 parities, team size, rows_cap, hidden].
MailboxShape all_reduce_mailbox_shape(int team_size, int rows_cap, int64_t hidden);

// The most rows one call can take on this rank's device: every rank sharing the
// GPU must hold its whole grid at once (the local team's N ranks on one GPU).
int all_reduce_max_rows(const RankContext& ctx, int64_t hidden);

// out = sum over ranks of x, for driven rank `ctx` with mailbox parity `box`.
// x, out: bf16 [rows, hidden], contiguous, 16-byte aligned, hidden % 8 == 0,
// rows <= the mailbox's rows_cap. Call sites alternate the two parities.
// Throws InvalidArgument, CapacityError (the ranks on this GPU cannot all be
// resident), or TimeoutError (an earlier call timed out; reset() the team).
void all_reduce(const RankContext& ctx, const Mailbox::View& box, const TensorView& x, const TensorView& out);

}  // namespace tpdecode
