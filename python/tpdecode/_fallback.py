"""What runs a call tpdecode does not serve, on a team built with ``fallback="torch"``:
torch.distributed on the team's process group, or torch math over the ranks' blocks
of a local team. Same outputs as the team's calls (written into ``out``), but not
their exactness contract (torch.distributed sums in NCCL's order)."""

import torch
import torch.distributed as dist

from . import _quant


def add_rms_norm(reduced, residual, weight, eps, out, residual_out, kind="none", scale=None, scales=None):
    """residual_out = reduced + residual (one rounding); out = RMSNorm(residual_out) · weight,
    BF16 or quantised (kind: _quant's)."""
    new = reduced if residual is None else (reduced.float() + residual.float()).to(reduced.dtype)
    residual_out.copy_(new)
    v = new.float()
    rstd = torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    normed = (v * rstd * weight.reshape(-1).float()).to(new.dtype)
    if kind == "none":
        out.copy_(normed)
        return
    q, group_scales = _quant.quantise(normed, kind, scale)
    out.copy_(q)
    if group_scales is not None:
        scales.copy_(group_scales)


class TorchFallback:
    def __init__(self, group, ranks: int):
        self.group = group  # None: a local team, whose tensors lead with `ranks` blocks
        self.ranks = ranks

    def _reduced(self, x):
        if self.ranks == 1:
            return x
        if self.group is None:
            return x.float().sum(0, keepdim=True).to(x.dtype).expand_as(x)
        y = x.clone()
        dist.all_reduce(y, group=self.group)
        return y

    def all_reduce(self, x, out):
        out.copy_(self._reduced(x))

    def ar_norm(self, x, residual, weight, eps, out, residual_out, kind="none", scale=None, scales=None):
        add_rms_norm(self._reduced(x), residual, weight, eps, out, residual_out, kind, scale, scales)

    def gather(self, shard, out):
        if self.ranks == 1:
            out.copy_(shard)
            return
        if self.group is None:
            out.copy_(torch.cat(shard.unbind(0), dim=-1).expand_as(out))
            return
        parts = shard.new_empty((self.ranks, *shard.shape))
        dist.all_gather_into_tensor(parts, shard.contiguous(), group=self.group)
        out.copy_(torch.cat(parts.unbind(0), dim=-1))
