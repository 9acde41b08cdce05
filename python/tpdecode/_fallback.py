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


def _require(ok: bool, message: str):
    if not ok:
        raise ValueError(f"tpdecode fallback: {message}")


class TorchFallback:
    """The extension refuses a call (NotServed) before it has checked every tensor, so
    the fallback checks what its torch math would otherwise broadcast or copy across:
    the local team's leading rank dimension, the outputs' and operands' shapes,
    dtypes and devices."""

    def __init__(self, group, ranks: int):
        self.group = group  # None: a local team, whose tensors lead with `ranks` blocks
        self.ranks = ranks

    def _check_rows(self, x, what):
        if self.group is None and self.ranks > 1:
            _require(x.dim() >= 2 and x.shape[0] == self.ranks,
                     f"{what} {tuple(x.shape)} must lead with the local team's {self.ranks} ranks")

    @staticmethod
    def _check_like(t, x, what, dtype=None):
        dtype = x.dtype if dtype is None else dtype
        _require(tuple(t.shape) == tuple(x.shape), f"{what} {tuple(t.shape)} must have x's shape {tuple(x.shape)}")
        _require(t.dtype == dtype, f"{what} is {t.dtype}, not {dtype}")
        _require(t.device == x.device, f"{what} is on {t.device}, x on {x.device}")

    def _reduced(self, x):
        if self.ranks == 1:
            return x
        if self.group is None:
            return x.float().sum(0, keepdim=True).to(x.dtype).expand_as(x)
        y = x.clone()
        dist.all_reduce(y, group=self.group)
        return y

    def all_reduce(self, x, out):
        self._check_rows(x, "x")
        self._check_like(out, x, "out")
        out.copy_(self._reduced(x))

    def ar_norm(self, x, residual, weight, eps, out, residual_out, kind="none", scale=None, scales=None):
        self._check_rows(x, "x")
        if residual is not None:
            self._check_like(residual, x, "residual")
        self._check_like(residual_out, x, "residual_out")
        self._check_like(out, x, "out", x.dtype if kind == "none" else torch.float8_e4m3fn)
        _require(weight.numel() == x.shape[-1] and weight.device == x.device,
                 f"weight of {weight.numel()} values on {weight.device} for rows of {x.shape[-1]} on {x.device}")
        add_rms_norm(self._reduced(x), residual, weight, eps, out, residual_out, kind, scale, scales)

    def gather(self, shard, out):
        self._check_rows(shard, "shard")
        want = (*shard.shape[:-1], shard.shape[-1] * self.ranks)
        _require(tuple(out.shape) == want and out.dtype == shard.dtype and out.device == shard.device,
                 f"out {tuple(out.shape)} {out.dtype} on {out.device}: {want} {shard.dtype} on {shard.device} needed")
        if self.ranks == 1:
            out.copy_(shard)
            return
        if self.group is None:
            out.copy_(torch.cat(shard.unbind(0), dim=-1).expand_as(out))
            return
        parts = shard.new_empty((self.ranks, *shard.shape))
        dist.all_gather_into_tensor(parts, shard.contiguous(), group=self.group)
        out.copy_(torch.cat(parts.unbind(0), dim=-1))
