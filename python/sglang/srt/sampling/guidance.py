"""Two-context guidance: the mix of a guided row's main logits with its guide context's logits,
the Sampler's first stage (the request's own pipeline then runs on the mixed logits).

With lc, lg the log-softmax of the main and guide logits, the methods are (guidance_params.py)
  cfg          l = lg + w (lc - lg)
  mixture      l = a lc + (1 - a) lg       (a fixed, or per token by kl_symmetry)
  contrastive  l = lc - beta lg  on tokens with pc >= plausibility * max pc, -inf elsewhere
Each is computed in the main context's logit frame, l + logsumexp(main logits), i.e.
  mixed = main + k (lg - lc) - b lg
so that the softmax is the method's and a row whose k and b are 0 (cfg w = 1, mixture a = 1)
keeps its main logits bit for bit. kl_symmetry picks a per token so that KL(q || pc) =
KL(q || pg) for q = softmax(l): that difference is E_q[lg - lc], which falls monotonically in a
from KL(pg || pc) >= 0 at a = 0 to -KL(pc || pg) <= 0 at a = 1, so a fixed number of batched
bisection steps finds it to within KL_BISECTION_TOL without reading anything on the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from sgl_kernel_ext.sampling.kl_alpha_reference import kl_alpha_reference
from sglang.srt.sampling.guidance_params import mixing_coefficients


@dataclass
class GuidanceBatch:
    """The guided rows of a sampling batch and their mixing coefficients (host-built)."""

    rows: torch.Tensor  # [G] int64, the guided rows' indices in the batch (ascending)
    k: torch.Tensor  # [G, 1] float32, the weight of (lg - lc)
    b: torch.Tensor  # [G, 1] float32, the weight of -lg (contrastive beta)
    log_plausibility: torch.Tensor  # [G, 1] float32, log(plausibility); -inf where unrestricted
    kl_rows: Optional[torch.Tensor]  # [K] int64 positions among the G of the kl_symmetry rows
    mixture_rows: list[int]  # positions among the G of the mixture rows (their alphas are returned)
    all_rows: bool  # every row of the batch is guided
    row_list: list[int]  # `rows` on the host
    on_guide_model: bool  # some guide context runs on the guide model (--guide-model-path)

    @classmethod
    def build(cls, guidance: Sequence[Optional[dict]], device: torch.device) -> Optional["GuidanceBatch"]:
        """From each row's normalized guidance (None: unguided); None when no row is guided."""
        rows = [i for i, g in enumerate(guidance) if g is not None]
        if not rows:
            return None
        coefficients = [mixing_coefficients(guidance[i]) for i in rows]
        k = [[c[0]] for c in coefficients]
        b = [[c[1]] for c in coefficients]
        log_p = [[math.log(c[2]) if c[2] > 0 else -math.inf] for c in coefficients]
        kl = [j for j, c in enumerate(coefficients) if c[3]]
        return cls(
            rows=torch.tensor(rows, dtype=torch.int64, device=device),
            k=torch.tensor(k, dtype=torch.float32, device=device),
            b=torch.tensor(b, dtype=torch.float32, device=device),
            log_plausibility=torch.tensor(log_p, dtype=torch.float32, device=device),
            kl_rows=torch.tensor(kl, dtype=torch.int64, device=device) if kl else None,
            mixture_rows=[j for j, i in enumerate(rows) if guidance[i]["method"] == "mixture"],
            all_rows=len(rows) == len(guidance),
            row_list=rows,
            on_guide_model=any(guidance[i].get("model", "self") == "guide" for i in rows),
        )

    def __len__(self) -> int:
        return len(self.row_list)


def apply_guidance(logits: torch.Tensor, guide_logits: torch.Tensor, batch: GuidanceBatch) -> torch.Tensor:
    """Replace the guided rows of `logits` ([B, V] float32, in place) by their mix with
    `guide_logits` ([G, V], one row per guided row in `batch.rows` order); returns the alpha of
    each guided row ([G] float32: 1 - k, the per-token choice on kl_symmetry rows)."""
    main = logits if batch.all_rows else logits.index_select(0, batch.rows)  # [G, V]
    main = main.float()
    lc = torch.log_softmax(main, dim=-1)  # [G, V]
    lg = torch.log_softmax(guide_logits.float(), dim=-1)  # [G, V]
    diff = lg - lc  # [G, V]
    k = batch.k
    if batch.kl_rows is not None:
        k = k.index_copy(0, batch.kl_rows, 1.0 - kl_symmetric_alpha(lc.index_select(0, batch.kl_rows), diff.index_select(0, batch.kl_rows)))
    mixed = mix_logits(main, lc, lg, diff, k, batch.b, batch.log_plausibility)  # [G, V]
    if batch.all_rows:
        logits.copy_(mixed)
    else:
        logits.index_copy_(0, batch.rows, mixed.to(logits.dtype))
    return 1.0 - k.squeeze(1)


def mix_logits(
    main: torch.Tensor, lc: torch.Tensor, lg: torch.Tensor, diff: torch.Tensor, k: torch.Tensor, b: torch.Tensor,
    log_plausibility: torch.Tensor,
) -> torch.Tensor:
    """[R, V] float32 `main + k diff - b lg` on plausible tokens, -inf elsewhere (`main`, `lc`,
    `lg`, `diff` = lg - lc: [R, V] float32; `k`, `b`, `log_plausibility`: [R, 1] float32).
    A term whose weight is 0 drops out, so a context's -inf logit never turns into 0 * inf = NaN;
    a token the main context rules out (lc = -inf) stays -inf whenever its weight a = 1 - k is
    positive (tokens both contexts rule out, e.g. masked ones, included), and with a = 0 (the
    guide alone) takes the guide's log-probability in the main frame."""
    mixed = main + _weighted(k, diff) - _weighted(b, lg)  # [R, V]
    ruled_out = lc == -math.inf  # [R, V]
    guide_only = torch.logsumexp(main, dim=-1, keepdim=True) + lg  # [R, V]: lg in the main frame
    mixed = torch.where(ruled_out, torch.where(k == 1.0, guide_only, -math.inf), mixed)
    implausible = lc < lc.max(dim=-1, keepdim=True).values + log_plausibility  # [R, V]
    return mixed.masked_fill(implausible, -math.inf)


def _weighted(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """weight * x ([R, 1] * [R, V]), with 0 where the weight is 0 (x may be infinite)."""
    return torch.where(weight == 0.0, 0.0, weight * x)


def kl_symmetric_alpha(lc: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
    """[K, 1] float32: per row the a in [0, 1] with E_q[diff] = 0, q = softmax(lc + (1 - a) diff)
    (`lc` [K, V] the main log-probs, `diff` [K, V] = lg - lc), to within KL_BISECTION_TOL: one
    Triton kernel on CUDA, its torch reference elsewhere."""
    if lc.is_cuda:
        from sgl_kernel_ext.sampling.kl_alpha_triton import kl_alpha_triton

        return kl_alpha_triton(lc, diff)
    return kl_alpha_reference(lc, diff)
