"""Generation from a ``Decoder``: batched greedy and beam search, with or without the key/value cache.

Both return generated tokens (B, L) without the start token, ending at the first end-of-sequence
token (included) and padded after it. With ``use_cache`` each step feeds the decoder one token
per hypothesis; without it, the whole prefix (slow: for checking the cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from trunk.core.codec import CLS, MASK, PAD, SEP, required_id, special_id
from trunk.models.decoder import Decoder, KVCache


@dataclass
class GenerationConfig:
    """How ``Translation`` generates.

    beam_size: 1 is greedy search (and gives exactly its tokens).
    length_penalty: finished hypotheses are ranked by log-probability / length ** length_penalty
        (0: raw log-probability, favouring short outputs; 1: per-token average).
    max_length: the most tokens to generate, end-of-sequence included.
    max_length_ratio: also at most ``ratio * source length + 10`` tokens (the longest source of the batch).
    """

    beam_size: int = 4
    length_penalty: float = 1.0
    max_length: int = 128
    max_length_ratio: float = 2.0

    def __post_init__(self) -> None:
        if self.beam_size < 1 or self.max_length < 1:
            raise ValueError(
                f"generation.beam_size and generation.max_length must be >= 1, got {self.beam_size} and "
                f"{self.max_length}."
            )

    def steps(self, source_length: int) -> int:
        return max(1, min(self.max_length, math.ceil(self.max_length_ratio * source_length) + 10))


@dataclass
class SpecialIds:
    bos: int  # the decoder's first input
    eos: int  # ends a hypothesis
    pad: int  # fills positions after the end
    banned: tuple[int, ...] = ()  # never generated (padding, start, mask ...)
    forced: tuple[int, ...] = ()  # the first tokens written, whatever the model prefers (a target language's code)

    @classmethod
    def of(cls, tokenizer: Tokenizer | None) -> SpecialIds:
        """A decoder's ids in a target vocabulary, whatever their spelling: it starts from [CLS] (a tokenizer without
        one, T5's or Marian's: from the padding token, as theirs do), stops at [SEP] (</s>), and never writes padding,
        [CLS] or [MASK]. No tokenizer: Trunk's own tokenizers' ids."""
        pad, cls_, mask = (special_id(tokenizer, t) for t in (PAD, CLS, MASK))
        eos = special_id(tokenizer, SEP) if tokenizer is None else required_id(tokenizer, SEP, "A decoder (its end)")
        return cls(bos=pad if cls_ is None else cls_, eos=eos, pad=pad,
                   banned=tuple(i for i in (pad, cls_, mask) if i is not None))


def _next_logits(decoder: Decoder, tokens: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None,
                 cache: KVCache | None, ids: SpecialIds) -> torch.Tensor:
    """Float logits (N, V) of the token after ``tokens`` (N, t), banned tokens at -inf."""
    new_tokens = tokens if cache is None else tokens[:, len(cache) :]
    logits = decoder(new_tokens, memory, memory_mask, cache)[:, -1].float()
    written = tokens.shape[1] - 1
    if written < len(ids.forced):  # the one possible token, at log-probability 0 (as transformers' forced BOS)
        logits.fill_(float("-inf"))
        logits[:, ids.forced[written]] = 0.0
        return logits
    logits[:, list(ids.banned)] = float("-inf")
    return logits


@torch.no_grad()
def greedy_search(decoder: Decoder, memory: torch.Tensor, memory_mask: torch.Tensor | None, ids: SpecialIds,
                  max_steps: int, use_cache: bool = True) -> torch.Tensor:
    """The most probable next token at each step. memory: (B, S, C); memory_mask: (B, S) True at real tokens."""
    B = memory.shape[0]
    tokens = torch.full((B, 1), ids.bos, dtype=torch.long, device=memory.device)
    finished = torch.zeros(B, dtype=torch.bool, device=memory.device)
    cache = decoder.new_cache() if use_cache else None
    for _ in range(max_steps):
        # the log-softmax keeps the order
        best = _next_logits(decoder, tokens, memory, memory_mask, cache, ids).argmax(-1)
        best = best.masked_fill(finished, ids.pad)
        tokens = torch.cat([tokens, best[:, None]], dim=1)
        finished |= best == ids.eos
        if finished.all():
            break
    return tokens[:, 1:]


@torch.no_grad()
def beam_search(
    decoder: Decoder,
    memory: torch.Tensor,
    memory_mask: torch.Tensor | None,
    ids: SpecialIds,
    max_steps: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    use_cache: bool = True,
) -> torch.Tensor:
    """Batched beam search in the manner of fairseq.

    Each step extends the K live hypotheses of every sentence by every token and keeps the 2K best
    candidates by log-probability. Candidates among the best K that end in EOS join the sentence's
    finished pool (ranked by the length-normalised score); the K best that do not end stay live. A
    sentence is done when its pool holds K hypotheses; at ``max_steps`` the best K candidates join the pool, ended
    or not (``transformers``' ``generate`` with ``early_stopping=True`` keeps the same hypotheses).

    The first step runs one hypothesis per sentence (all K would be the same start token) and widens
    to K after it, so the memory's keys and values are projected once per sentence, not per beam.
    A sentence's 2K best candidates are among each hypothesis's 2K best tokens, so only those are
    normalised and ranked, never the whole (B, K x V) table. A sentence whose pool is full leaves the batch (its
    hypotheses, memory rows and cached keys), so the longest sentence does not keep the others computing.
    """
    B = memory.shape[0]
    K, device = beam_size, memory.device
    tokens = torch.full((B, 1), ids.bos, dtype=torch.long, device=device)
    scores = torch.zeros(B, 1, device=device)  # (sentences searching, live hypotheses): 1 at the first step, K after
    pool_scores = torch.full((B, K), float("-inf"), device=device)
    pool_tokens = torch.full((B, K, max_steps), ids.pad, dtype=torch.long, device=device)
    active = torch.arange(B, device=device)  # the sentences still searching: the finished leave the batch
    cache = decoder.new_cache() if use_cache else None
    rank = torch.arange(2 * K, device=device)
    for step in range(max_steps):
        logits = _next_logits(decoder, tokens, memory, memory_mask, cache, ids)  # (b * k, V)
        (b, k), V = scores.shape, logits.shape[1]
        n = min(2 * K, V)
        best_logits, best_tokens = logits.topk(n, dim=1)  # each hypothesis's n best next tokens
        log_probs = best_logits - logits.logsumexp(-1, keepdim=True)
        candidates = (scores[:, :, None] + log_probs.view(b, k, n)).view(b, k * n)
        if k * n < 2 * K:  # a tiny vocabulary: fill up with impossible candidates
            candidates = torch.cat([candidates, candidates.new_full((b, 2 * K - k * n), float("-inf"))], dim=1)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (b, 2K)
        top_index = top_index.clamp(max=k * n - 1)
        beam, token = top_index // n, best_tokens.view(b, k * n).gather(1, top_index)
        ends = token == ids.eos
        sequences = torch.cat([tokens.view(b, k, -1)[:, :, 1:].gather(1, beam[:, :, None].expand(-1, -1, step)),
                               token[:, :, None]], dim=2)  # (b, 2K, step + 1), without the start token

        # at the last step the best K join the pool whether they end or not (out of steps), ranked with the ended ones
        last = step == max_steps - 1
        finishing = (ends | last) & (rank < K) & (top_scores > float("-inf"))
        normalised = torch.where(finishing, top_scores / (step + 1) ** length_penalty, float("-inf"))
        pool_scores[active], pool_tokens[active] = _keep_best(pool_scores[active], pool_tokens[active], normalised,
                                                              sequences, ids.pad)

        live = (ends.long() * 2 * K + rank).argsort(dim=1)[:, :K]  # the K best that did not end, in score order
        scores = top_scores.gather(1, live)
        rows = (torch.arange(b, device=device)[:, None] * k + beam.gather(1, live)).view(-1)
        tokens = torch.cat([tokens[rows], token.gather(1, live).view(-1, 1)], dim=1)
        if step == 0:  # widen to K hypotheses per sentence (beams of one sentence are adjacent)
            memory = memory.repeat_interleave(K, dim=0)
            memory_mask = None if memory_mask is None else memory_mask.repeat_interleave(K, dim=0)
        searching = pool_scores[active, -1] == float("-inf")  # a sentence is done when its pool holds K
        if not searching.any():
            break
        if not searching.all():  # the finished sentences' hypotheses leave every tensor of the batch
            kept = (searching.nonzero()[:, 0, None] * K + torch.arange(K, device=device)).view(-1)
            active, scores, tokens = active[searching], scores[searching], tokens[kept]
            memory = memory[kept]
            memory_mask = None if memory_mask is None else memory_mask[kept]
            rows = rows[kept]
        if cache is not None:
            cache.reorder(rows, memory_rows=rows if step == 0 else kept if not searching.all() else None)
    best = pool_tokens[:, 0]
    length = int((best != ids.pad).sum(1).max())
    return best[:, : max(length, 1)]


def _keep_best(pool_scores: torch.Tensor, pool_tokens: torch.Tensor, new_scores: torch.Tensor, new_tokens: torch.Tensor,
               pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge (B, N) new hypotheses into the (B, K) pool, best first."""
    B, K, L = pool_tokens.shape
    padded = torch.full((B, new_tokens.shape[1], L), pad, dtype=torch.long, device=pool_tokens.device)
    padded[:, :, : new_tokens.shape[2]] = new_tokens
    merged_scores, order = torch.cat([pool_scores, new_scores], dim=1).topk(K, dim=1)
    merged_tokens = torch.cat([pool_tokens, padded], dim=1).gather(1, order[:, :, None].expand(-1, -1, L))
    return merged_scores, merged_tokens
