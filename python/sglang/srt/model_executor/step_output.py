"""What a step returns to the scheduler besides its tokens: logprob entries assembled on the
host, and the sampled ids copied back without blocking."""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.step import LogprobRequest, Step


def copy_to_host(ids: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.cuda.Event]]:
    """Start copying `ids` to pinned host memory without waiting; the event tells when it landed."""
    if ids.device.type != "cuda":
        return ids, None
    host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
    host.copy_(ids, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


def output_logprobs(out: LogitsProcessorOutput, wants: list[Optional[LogprobRequest]]) -> list[Optional[tuple]]:
    token_lp = out.next_token_logprobs.tolist()
    top_vals = out.next_token_top_logprobs_val.tolist() if out.next_token_top_logprobs_val is not None else None
    top_idx = out.next_token_top_logprobs_idx.tolist() if out.next_token_top_logprobs_idx is not None else None
    ids_vals = out.next_token_token_ids_logprobs_val.tolist() if out.next_token_token_ids_logprobs_val is not None else None
    results = []
    for i, want in enumerate(wants):
        if want is None:
            results.append(None)
            continue
        top = [[v, t] for v, t in zip(top_vals[i][: want.top_logprobs_num], top_idx[i])] if want.top_logprobs_num else None
        ids = [[v, t] for v, t in zip(ids_vals[i], want.token_ids_logprob)] if want.token_ids_logprob else None
        results.append((token_lp[i], top, ids))
    return results

def input_logprobs(step: Step, batch: ForwardBatch, output: LogitsProcessorOutput) -> dict[int, tuple]:
    """Prompt logprobs of this chunk: position p gets log_softmax(logits at p-1)[token p]."""
    if not step.input_logprob_spans:
        return {}
    logprobs = torch.log_softmax(output.input_token_logits.float(), dim=-1)  # [N, V]
    offsets = [0]
    for n in batch.extend_seq_lens_cpu:
        offsets.append(offsets[-1] + n)
    results = {}
    for row, start, a, b in step.input_logprob_spans:
        req = step.reqs[row]
        prompt = req.origin_input_ids
        first = max(start, a + 1, 1)
        last = min(b, len(prompt) - 1)  # inclusive; position b uses the chunk's last logits
        entries = [None] if start == 0 and a == 0 else []
        positions = list(range(first, last + 1))
        if positions:
            lp_rows = logprobs[[offsets[row] + (p - 1 - a) for p in positions]]  # [P, V]
            entries += _prompt_entries(lp_rows, [prompt[p] for p in positions], req.logprob)
        results[row] = entries
    return results

def _prompt_entries(lp_rows: torch.Tensor, tokens: list[int], want: LogprobRequest) -> list[tuple]:
    token_lp = lp_rows.gather(1, torch.tensor(tokens, device=lp_rows.device).unsqueeze(1)).squeeze(1).tolist()
    top = None
    if want.top_logprobs_num:
        vals, idx = lp_rows.topk(want.top_logprobs_num, dim=-1)
        top = [[[v, t] for v, t in zip(vr, ir)] for vr, ir in zip(vals.tolist(), idx.tolist())]
    ids = None
    if want.token_ids_logprob:
        chosen = lp_rows[:, want.token_ids_logprob].tolist()
        ids = [[[v, t] for v, t in zip(vr, want.token_ids_logprob)] for vr in chosen]
    return [
        ([token_lp[i], tokens[i]], top[i] if top else None, ids[i] if ids else None) for i in range(len(tokens))
    ]
