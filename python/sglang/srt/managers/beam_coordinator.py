"""Scheduler side of beam search: admission, member spawn, the selection step, forks, finish.

A beam request (beam_width k > 1) is admitted with k request slots: its own and k - 1 reserved
for its member rows. After its prefill the first selection picks k tokens from the prompt's
logits; the members are spawned as Reqs that share the prompt's K/V slots (counted per slot
in the radix cache) and join the running batch, so the k rows decode in lockstep beside any
other requests. Each step the sampler hands back every beam row's top-2k log-probabilities of
its fully processed logits (beam_search/selection.py ranks them for all requests at once);
here each request's survivors take over rows: a row whose survivor extends another beam takes
that beam's output ids, K/V span (RadixCache.fork_rows: shared slots, the dropped tail freed),
penalty state, grammar matcher (beam_search/grammar_rows.py) and next input id. A candidate whose
text hits a stop string or stop_regex finishes as a stop token does (beam_search/stop_text.py).
Finished beams go to the request's pool; when the selection ends the search (too few
survivors, or max_new_tokens), the leader finishes with the best beam and the members are
dropped (never sent).

The step is read before the next step with beam rows is submitted (Scheduler.event_loop), so
under the overlap schedule beam rows run one step at a time while their batch-mates overlap.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Optional

import torch

from sglang.srt.beam_search.grammar_rows import GrammarRefused, fork_grammars, grammar_stop_ids
from sglang.srt.beam_search.group import BeamGroup, FinishedBeam
from sglang.srt.beam_search.selection import rank_candidates, walk_candidates
from sglang.srt.beam_search.stop_text import ranked_text_stops
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.step import Step, StepResult

MEMBER_FINISH = {"type": "length", "length": 0}  # members are never sent; they only need to leave


def beam_width(req: Req) -> int:
    return req.sampling_params.beam_width or 1


def member_rows_needed(req: Req) -> int:
    """Request slots a waiting request needs besides its own."""
    return beam_width(req) - 1 if req.beam is None or not req.beam.spawned() else 0


def beam_ask(sampled: list[Req]) -> tuple[Optional[list[int]], int]:
    """The positions of the beam rows among a step's sampled rows, and the candidates each
    row returns (2 x the widest request's width)."""
    rows = [i for i, req in enumerate(sampled) if req.beam is not None and not req.beam.done]
    if not rows:
        return None, 0
    return rows, 2 * max(sampled[i].beam.width for i in rows)


class BeamCoordinator:
    def __init__(
        self,
        tree_cache: RadixCache,
        req_to_token_pool: ReqToTokenPool,
        future_tokens: torch.Tensor,
        make_batch: Callable[[list[Req]], ScheduleBatch],
        max_running: int,
        max_total_tokens: int,
    ) -> None:
        self.tree_cache = tree_cache
        self.pool = req_to_token_pool
        self.future_tokens = future_tokens  # [R + 1] int64: each request slot's next input id
        self.make_batch = make_batch
        self.max_running = max_running
        self.max_total_tokens = max_total_tokens
        self.new_batches: list[ScheduleBatch] = []  # spawned members, to join the running batch

    # ------------------------------------------------------------------ admission

    def init_request(self, req: Req) -> Optional[str]:
        """Attach the search state to a beam request; returns why it can never run, or None."""
        k = beam_width(req)
        if k <= 1:
            return None
        params = req.sampling_params
        if k > self.max_running:
            return f"beam_width ({k}) needs {k} request slots; this server runs at most {self.max_running} requests at once."
        need = len(req.origin_input_ids) + k * params.max_new_tokens
        if need > self.max_total_tokens:
            return f"beam_width ({k}) needs up to {need} KV-cache tokens; the server holds {self.max_total_tokens}."
        stops = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stops |= req.eos_ids()
        stops |= grammar_stop_ids(req)
        req.beam = BeamGroup(
            width=k, num_return=params.n, length_penalty=params.length_penalty,
            max_new_tokens=params.max_new_tokens, stop_ids=sorted(stops), rows=[req],
        )
        return None

    def extra_kv_budget(self, req: Req) -> int:
        """KV tokens a beam leader may claim beyond its own row until its members hold theirs."""
        if req.beam is None or req.beam.spawned() or req.beam.done:
            return 0
        return (req.beam.width - 1) * req.sampling_params.max_new_tokens

    def reserve_rows(self, req: Req) -> None:
        """An admitted beam leader takes its members' request slots now, so the spawn never waits."""
        for _ in range(member_rows_needed(req)):
            req.beam.reserved_rows.append(self.pool.alloc())

    def released(self, req: Req) -> None:
        """A released leader gives back the member slots it still reserves."""
        if req.beam is not None and req is req.beam.leader:
            for row in req.beam.reserved_rows:
                self.pool.free(row)
            req.beam.reserved_rows = []

    def take_new_batches(self) -> list[ScheduleBatch]:
        batches, self.new_batches = self.new_batches, []
        return batches

    # ------------------------------------------------------------------ one step's selection

    def read(self, step: Step, result: StepResult) -> None:
        """Select the beams of every request with rows in `step` (its result read now)."""
        if not step.beam_rows or result.beam_topk is None:
            return
        sampled = [step.reqs[r] for r in step.sample_rows]
        values, ids = result.beam_topk  # [R, C] each, host
        groups: dict[int, BeamGroup] = {}
        row_of: dict[int, int] = {}  # id(req) -> index into values
        for i, pos in enumerate(step.beam_rows):
            req = sampled[pos]
            groups[id(req.beam)] = req.beam
            row_of[id(req)] = i
        by_width: dict[int, list[BeamGroup]] = defaultdict(list)
        for group in groups.values():
            if group.done:
                continue
            if any(r.finished() for r in group.rows) or any(id(r) not in row_of for r in group.rows):
                self._abort(group)  # a row was aborted (client, failed step): the request ends
                continue
            by_width[group.width].append(group)
        forks: list[tuple[BeamGroup, list[int], list[int], list[float]]] = []
        for width, batch in by_width.items():
            forks += self._select(batch, width, values, ids, row_of)
        self._apply(step, forks)

    def _select(self, groups, width, values, ids, row_of) -> list[tuple]:
        """One batched selection for the requests of one width; returns (group, parents, tokens,
        scores) of those that go on, after finishing the others."""
        c = 2 * width
        num_stops = max(len(group.stop_ids) for group in groups) or 1
        # Rows past a request's beam count read row 0, masked: -inf cumulative, 0 log-probs and ids.
        pads = [width - len(group.rows) for group in groups]
        rows = torch.tensor([[row_of[id(r)] for r in group.rows] + [0] * pad for group, pad in zip(groups, pads)])  # [G, K]
        live_rows = torch.tensor([[True] * len(group.rows) + [False] * pad for group, pad in zip(groups, pads)])  # [G, K]
        cum = torch.tensor([group.cum_logprobs + [float("-inf")] * pad for group, pad in zip(groups, pads)])  # [G, K]
        logprobs = torch.where(live_rows[:, :, None], values[rows][:, :, :c], 0.0)  # [G, K, C]
        tokens = torch.where(live_rows[:, :, None], ids[rows][:, :, :c], 0)  # [G, K, C]
        stops = torch.tensor([group.stop_ids + [-1] * (num_stops - len(group.stop_ids)) for group in groups],
                             dtype=torch.int64)  # [G, S]
        final = torch.tensor([group.final_step() for group in groups])  # [G]
        ranked = rank_candidates(cum, logprobs, tokens)
        text_mask, text_matches = ranked_text_stops(groups, ranked.parents, ranked.token_ids, ranked.scores)
        sel = walk_candidates(ranked, stops, width, final, text_mask)
        out = []
        all_parents, all_tokens, all_scores = sel.parents.tolist(), sel.token_ids.tolist(), sel.scores.tolist()
        all_finishes, all_survives, all_ends = sel.finishes.tolist(), sel.survives.tolist(), sel.ends.tolist()
        for gi, (group, last) in enumerate(zip(groups, final.tolist())):
            parents, toks, scores = all_parents[gi], all_tokens[gi], all_scores[gi]
            for j in [j for j, f in enumerate(all_finishes[gi]) if f]:
                history = group.rows[parents[j]].output_ids + [toks[j]]
                text = text_matches[gi][j]
                if text is not None:  # stop text first, as check_finished orders them
                    group.finished.append(FinishedBeam(history, scores[j], text.matched, text.text))
                else:
                    group.finished.append(FinishedBeam(history, scores[j], toks[j] if not last else None))
            live = [j for j, alive in enumerate(all_survives[gi]) if alive]
            if all_ends[gi]:
                for j in live:
                    history = group.rows[parents[j]].output_ids + [toks[j]]
                    group.finished.append(FinishedBeam(history, scores[j], None))
                self._finish(group)
                continue
            # Rows past the survivors (masks left too few candidates) copy the first one, dead.
            picks = live + [live[0]] * (width - len(live))
            dead = [float("-inf")] * (width - len(live))
            out.append((group, [parents[j] for j in picks], [toks[j] for j in picks], [scores[j] for j in live] + dead))
        return out

    # ------------------------------------------------------------------ forks

    def _apply(self, step: Step, forks: list[tuple]) -> None:
        """The survivors take over their requests' rows: history, K/V, penalties, next input."""
        if not forks:
            return
        batch = step.sampled_batch
        position = {id(r): i for i, r in enumerate(batch.reqs)}
        gather = list(range(len(batch.reqs)))
        new_ids = [-1] * len(batch.reqs)
        slots, next_tokens = [], []
        spans = _Forks()
        for group, parents, toks, scores in forks:
            try:
                grammars = fork_grammars([row.grammar for row in group.rows], parents, toks)
            except GrammarRefused as err:
                self._abort(group, str(err))
                continue
            if not group.spawned():
                self._spawn(group, toks, grammars)
                new_ids[position[id(group.leader)]] = toks[0]
            else:
                self._fork(group, parents, toks, spans)
                for row, grammar in zip(group.rows, grammars):
                    row.grammar = grammar
                for row, parent, tok in zip(group.rows, parents, toks):
                    gather[position[id(row)]] = position[id(group.rows[parent])]
                    new_ids[position[id(row)]] = tok
            group.cum_logprobs = scores
            for row, tok in zip(group.rows, toks):
                slots.append(row.req_pool_idx)
                next_tokens.append(tok)
        self.tree_cache.fork_rows(spans.dst, spans.src, spans.starts, spans.ends)
        _fork_penalties(batch, gather, new_ids)
        device = self.future_tokens.device
        self.future_tokens.index_copy_(
            0, torch.tensor(slots, device=device), torch.tensor(next_tokens, dtype=torch.int64, device=device)
        )

    def _fork(self, group: BeamGroup, parents: list[int], toks: list[int], spans: "_Forks") -> None:
        """Row j continues beam parents[j]: its output ids, and (added to `spans`, which the step
        applies at once) the K/V of its generated span."""
        histories = [list(group.rows[p].output_ids) for p in parents]
        prompt_len = len(group.leader.origin_input_ids)
        end = prompt_len + len(histories[0])
        for j, p in enumerate(parents):
            if p != j and end > prompt_len:
                spans.add(group.rows[j].req_pool_idx, group.rows[p].req_pool_idx, prompt_len, end)
        for row, history, tok in zip(group.rows, histories, toks):
            row.output_ids = history + [tok]

    def _spawn(self, group: BeamGroup, toks: list[int], grammars: list[Any]) -> None:
        """After the prefill: the leader takes the best first token, k - 1 members the others
        (each with its grammar matcher, forked from the leader's)."""
        leader = group.leader
        leader.output_ids.append(toks[0])
        leader.grammar = grammars[0]
        members = []
        for tok, grammar in zip(toks[1:], grammars[1:]):
            member = Req(
                f"{leader.rid}#beam{len(group.rows)}", leader.origin_input_ids, leader.sampling_params,
                eos_token_ids=leader.eos_token_ids, custom_logit_processor=leader.custom_logit_processor,
                tokenizer=leader.tokenizer,
            )
            member.beam = group
            member.extra_key = leader.extra_key
            member.req_pool_idx = group.reserved_rows.pop()
            member.kv_len = leader.kv_len
            self.tree_cache.share_prefix(member.req_pool_idx, leader.req_pool_idx, leader.kv_len)
            member.output_ids = [tok]
            member.grammar = grammar
            group.rows.append(member)
            members.append(member)
        self.new_batches.append(self.make_batch(members))

    # ------------------------------------------------------------------ the end

    def _finish(self, group: BeamGroup) -> None:
        group.done = True
        leader = group.leader
        results = group.results()
        if not results:  # masks left no candidate at all before any beam finished
            leader.abort("No beam can go on: the request's grammar or allowed_token_ids allow no next token.")
        else:
            leader.beam_results = results
            leader.finished_reason = results[0].finish_reason
            leader.matched_text = results[0].matched_text  # the answer's text is cut as its beam's
        for member in group.rows[1:]:
            member.finished_reason = MEMBER_FINISH

    def _abort(self, group: BeamGroup, message: str = "A beam of this request was aborted.") -> None:
        group.done = True
        leader = group.leader
        reason = next((r.finished_reason for r in group.rows if r.finished()), None)
        if not leader.finished():
            if reason is not None and reason.get("type") == "abort":
                leader.finished_reason = dict(reason)
            else:
                leader.abort(message, status_code=500, err_type="InternalServerError")
        for member in group.rows[1:]:
            if not member.finished():
                member.finished_reason = MEMBER_FINISH


def _fork_penalties(batch: ScheduleBatch, gather: list[int], new_ids: list[int]) -> None:
    """Forked rows take their parent's penalty state; then every beam row records its new token
    (the sampler skipped beam rows when it recorded the sampled ids)."""
    orchestrator = batch.sampling_info.penalizer_orchestrator
    if orchestrator is None:
        return
    device = batch.sampling_info.device
    if gather != list(range(len(gather))):
        orchestrator.filter(torch.tensor(gather, dtype=torch.int64, device=device))
    orchestrator.cumulate_output_tokens(torch.tensor(new_ids, dtype=torch.int64, device=device))


def is_hidden(req: Req) -> bool:
    """A beam member (never sent), or a beam leader before its final message."""
    if req.beam is None:
        return False
    return req is not req.beam.leader or not req.finished()


def beam_token_fields(req: Req) -> Optional[tuple[list[int], int, list[Any]]]:
    """For a finished beam leader: the best beam's ids, the returned beams' total length and
    the returned beams; None for any other request."""
    results = getattr(req, "beam_results", None) if req.beam is not None else None
    if results is None:
        return None
    return list(results[0].output_ids), sum(len(b.output_ids) for b in results), results


class _Forks:
    """A step's K/V forks (RadixCache.fork_rows' arguments), gathered over its requests."""

    def __init__(self) -> None:
        self.dst: list[int] = []
        self.src: list[int] = []
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, dst: int, src: int, start: int, end: int) -> None:
        self.dst.append(dst)
        self.src.append(src)
        self.starts.append(start)
        self.ends.append(end)
