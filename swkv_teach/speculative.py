"""Speculative decoding on a ring: draft ``k`` tokens cheaply, verify them in one forward, keep the agreeing prefix.

References: Leviathan et al. 2023, *Fast Inference from Transformers via Speculative Decoding*
(§2.3 the acceptance rule, §3.3 the expected speed-up); Chen et al. 2023, *Accelerating Large
Language Model Decoding with Speculative Sampling* (Algorithm 2). Drafters as transformers 5.25
names them (``generation/candidate_generator.py``: ``PromptLookupCandidateGenerator`` line 1033,
``EarlyExitCandidateGenerator`` line 1178) and vLLM's n-gram drafters (``NgramProposer``,
``vllm/v1/spec_decode/ngram_proposer.py`` at commit 016e8ed; ``NgramGPUSpeculator``,
``vllm/v1/worker/gpu/spec_decode/ngram/speculator.py`` line 151 in vLLM 0.34.0).

One round, batch 1, ``pending`` being the last chosen token (not yet in the caches)::

    draft    d1 .. dm                     m <= k tokens from the drafter (it may find fewer)
    verify   [pending, d1 .. dm]          ONE forward of m + 1 queries over the ring (the chunk
                                          contract: each query masked to its own window) -> rows 0 .. m
    accept   greedy: the longest prefix with d_i == argmax(row i - 1);
             sampling: d_i kept with probability min(1, p(d_i) / q(d_i)), else stop
    emit     the accepted drafts, then one token from row a: the correction (on a rejection,
             sampled from norm(max(0, p - q))) or the bonus (every draft accepted, from p)
    rollback m - a tokens from every layer's ring: O(1), a counter moves (caches/ring.py)

The ring needs ``lookahead >= k`` (``RingBufferKVCache(W, lookahead=k)``): the verify writes ``k + 1``
tokens, and the slots it reuses must hold only tokens outside every kept query's window.
Greedy speculative decoding emits the same tokens as plain greedy decoding; sampled, the same
distribution (the rule above makes each emitted token distributed as the target's ``p``).
Batch 1 only, as transformers' assisted generation (``generation/utils.py`` line 4029): rows
would accept different counts, and one ring's counter serves all its rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn as nn

from swkv_teach._validate import check_positive_int
from swkv_teach.caches import RingBufferKVCache
from swkv_teach.model import Decoder, LayerCaches

__all__ = ["DraftModel", "Drafter", "PromptLookup", "SpeculativeStats", "accept", "accept_greedy", "accept_sampled",
           "early_exit", "probabilities", "speculative_generate", "verify"]


# --------------------------------------------------------------------------- distributions
def probabilities(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """``softmax(logits / temperature)`` over the ``top_k`` most likely, ``(n, vocab)`` float32.

    The distribution ``Decoder.generate`` samples from (``Decoder._pick``), row by row.
    """
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


# --------------------------------------------------------------------------- the acceptance rules
def accept_greedy(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """``(a, token)``: the first ``a`` drafts agree with the argmax of rows ``0 .. a - 1``; ``token`` is row ``a``'s.

    ``logits`` ``(m + 1, vocab)``: row ``i`` predicts the token after draft ``i`` (row 0: after ``pending``).
    """
    best = logits.argmax(dim=-1).tolist()
    a = 0
    while a < len(drafts) and drafts[a] == best[a]:
        a += 1
    return a, best[a]


def accept_sampled(p: torch.Tensor, drafts: list[int], q: torch.Tensor | None, generator=None) -> tuple[int, int]:
    """Leviathan et al. §2.3 / Chen et al. Algorithm 2: ``(a, token)`` with every emitted token distributed as ``p``.

    Args:
        p: ``(m + 1, vocab)`` the target's distributions, row ``i`` for the token after draft ``i``.
        drafts: the ``m`` drafted tokens; draft ``i`` was sampled from ``q[i]``.
        q: ``(m, vocab)`` the drafter's distributions, or None for a deterministic drafter (prompt lookup):
            ``q[i]`` is then one-hot at ``drafts[i]``, so a draft is kept with probability ``p(d)`` and a
            rejection samples from ``p`` without ``d`` (transformers samples ``p`` and compares instead,
            ``generation/utils.py`` lines 4133-4152: the same law).
    Returns:
        ``a`` drafts accepted, then ``token``: from ``norm(max(0, p[a] - q[a]))`` after a rejection, from
        ``p[m]`` (the bonus) when all ``m`` were accepted.
    """
    for i, d in enumerate(drafts):
        p_d = float(p[i, d])
        q_d = 1.0 if q is None else float(q[i, d])
        # accept with probability min(1, p/q); u in [0, 1), so `<` accepts with probability exactly p/q
        if q_d <= p_d or float(torch.rand((), generator=generator)) * q_d < p_d:
            continue
        if q is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = (p[i] - q[i]).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:  # p <= q everywhere only if p == q: then rejection has probability 0
            residual = p[i]
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def accept(logits: torch.Tensor, drafts: list[int], q: torch.Tensor | None = None, temperature: float = 0.0,
           top_k: int | None = None, generator=None) -> tuple[int, int]:
    """``(a, token)`` from a verify's ``logits`` ``(m + 1, vocab)``: :func:`accept_greedy` at ``temperature=0``,
    else :func:`accept_sampled` on the distributions ``Decoder.generate`` samples from.

    The one rule :func:`verify` (a ring, batch 1) and the scheduler's speculative rows
    (:mod:`swkv_teach.serving.scheduler`, a paged pool) both apply. ``drafts`` may be empty: then it is a
    plain pick from row 0.
    """
    if temperature == 0:
        return accept_greedy(logits, drafts)
    return accept_sampled(probabilities(logits, temperature, top_k), drafts, q, generator)


# --------------------------------------------------------------------------- drafters
class Drafter:
    """What ``Decoder.generate(..., speculative=drafter)`` accepts: ``k`` and three verbs, ``begin`` (a new
    sequence), ``propose`` (up to ``m`` drafts and their distribution, or None for one-hot) and ``accepted``
    (how many the target kept). Subclass it for a drafter of your own.

    The decoder reaches this module through :meth:`generate`, not by importing it: this module builds on
    :mod:`swkv_teach.model`, so every import points down a floor.
    """

    k: int

    def begin(self, target: Decoder, prompt: list[int]) -> None:
        raise NotImplementedError

    def propose(self, tokens: list[int], m: int, temperature: float = 0.0, top_k=None, generator=None):
        raise NotImplementedError

    def accepted(self, a: int) -> None:
        raise NotImplementedError

    def generate(self, model: Decoder, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """``model``'s continuation of ``prompt_ids`` ``(1, Tp)`` drafted by this drafter: :func:`speculative_generate`."""
        return speculative_generate(model, prompt_ids, max_new_tokens, self, temperature, top_k, generator)[0]


class PromptLookup(Drafter):
    """Draft by copying: find the context's last ``n`` tokens earlier in the context, propose what followed.

    The longest ``n`` in ``[min_ngram, max_ngram]`` that has an earlier match wins, and among its
    matches the earliest, as transformers' ``PromptLookupCandidateGenerator.get_candidates``
    (``candidate_generator.py`` lines 1096-1116: ``n`` from the largest down, the first match from the
    left with a continuation) and vLLM's ``_find_longest_matched_ngram_and_propose_tokens`` at commit
    016e8ed (longest n-gram, earliest position); vLLM 0.34.0's GPU speculator keeps the rightmost match
    instead (``speculator.py`` line 82: "longest-n, rightmost-pos"). No model, no cache: it reads the token history, the whole of it (a
    window bounds the KV cache, not what a drafter may read). Deterministic, so ``q`` is one-hot.
    """

    def __init__(self, k: int = 4, max_ngram: int = 3, min_ngram: int = 1):
        self.k = check_positive_int("k", k)
        self.max_ngram = check_positive_int("max_ngram", max_ngram)
        self.min_ngram = check_positive_int("min_ngram", min_ngram)
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram must be <= max_ngram; got min_ngram={min_ngram}, max_ngram={max_ngram}")

    def begin(self, target: Decoder, prompt: list[int]) -> None:
        """A new sequence: nothing to reset (the context is passed at every proposal)."""

    def propose(self, tokens: list[int], m: int, temperature: float = 0.0, top_k=None, generator=None):
        """Up to ``m`` tokens that followed the earliest earlier occurrence of the context's longest matching suffix."""
        t = torch.tensor(tokens)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            windows = t[: len(tokens) - 1].unfold(0, n, 1)  # (L - n, n): every n-gram with a token after it
            hits = torch.nonzero((windows == t[-n:]).all(dim=1)).flatten()
            if len(hits):
                start = int(hits[0]) + n
                return tokens[start : start + m], None
        return [], None

    def accepted(self, a: int) -> None:
        """``a`` of the last proposal were kept: nothing to roll back."""

    def __repr__(self) -> str:
        return f"PromptLookup(k={self.k}, max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"


class DraftModel(Drafter):
    """Draft with a smaller :class:`~swkv_teach.model.Decoder` of the same vocabulary, on a ring of its own.

    Each proposal feeds the draft model what it has not seen of the context (one chunk: the last
    round's correction or bonus, with the draft it had not fed), then ``m - 1`` of its own drafts one
    at a time; after the verify its ring takes back the drafts the target rejected
    (``RingBufferKVCache(W, lookahead=k)``, so the rollback is a counter too).
    """

    def __init__(self, model: Decoder, k: int = 4):
        if not isinstance(model, Decoder):
            raise ValueError(f"model must be a swkv_teach Decoder (the draft model); got {type(model).__name__}")
        self.model = model
        self.k = check_positive_int("k", k)
        self.caches: LayerCaches | None = None
        self._fed = 0  # context tokens (and drafts) in the draft's caches
        self._drafted = 0  # drafts of the last proposal, of which all but the last were fed

    def begin(self, target: Decoder, prompt: list[int]) -> None:
        """A new sequence for ``target``: refuse another vocabulary, start an empty ring per layer."""
        mine, theirs = self.model.config.vocab_size, target.config.vocab_size
        if mine != theirs:
            raise ValueError(
                f"speculative: the draft model's vocab_size is {mine}, the target's is {theirs}; "
                "a drafter must propose tokens of the target's vocabulary (one tokenizer for both)"
            )
        W = self.model.config.window_size
        self.caches = LayerCaches([RingBufferKVCache(W, lookahead=self.k) for _ in self.model.layers], W)
        self._fed = self._drafted = 0

    @torch.no_grad()
    def propose(self, tokens: list[int], m: int, temperature: float = 0.0, top_k=None, generator=None):
        """``m`` drafts and, when sampling, the ``(m, vocab)`` distributions they were drawn from."""
        device = next(self.model.parameters()).device
        ids = torch.tensor([tokens[self._fed :]], device=device)
        drafts, q = [], []
        for j in range(m):
            logits = self.model.step(ids, self.caches)[0, -1:]  # (1, vocab)
            if temperature == 0:
                d = int(logits.argmax())
            else:
                q.append(probabilities(logits, temperature, top_k)[0])
                d = int(torch.multinomial(q[-1], 1, generator=generator))
            drafts.append(d)
            if j + 1 < m:
                ids = torch.tensor([[d]], device=device)
        self._fed = len(tokens) + m - 1
        self._drafted = m
        return drafts, (torch.stack(q) if q else None)

    def accepted(self, a: int) -> None:
        """Keep the fed drafts the target accepted (``a`` of them at most), take back the rest."""
        fed_drafts = self._drafted - 1
        r = fed_drafts - min(a, fed_drafts)
        for cache in self.caches:
            cache.rollback(r)
        self._fed -= r

    def __repr__(self) -> str:
        return f"DraftModel({self.model.config.n_layers} layers, k={self.k})"


def early_exit(model: Decoder, layers: int, k: int = 4) -> DraftModel:
    """A :class:`DraftModel` made of ``model``'s first ``layers`` blocks, its final norm and head (weights shared).

    Self-speculation by exiting early, as transformers' ``assistant_early_exit`` does
    (``EarlyExitCandidateGenerator.get_candidates``, ``candidate_generator.py`` lines 1224-1228: it
    runs the same model with ``num_hidden_layers`` set lower). A model not trained for it (the shipped
    one was not) drafts worse from early layers; the acceptance rate says how much worse.
    """
    n = model.config.n_layers
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= n:
        raise ValueError(f"layers must be an int in [1, {n}] (the target's first layers); got {layers!r}")
    with torch.random.fork_rng(devices=[]):  # the throwaway initial weights must not move the caller's RNG
        draft = Decoder(dataclasses.replace(model.config, n_layers=layers))
    draft.embed, draft.norm, draft.lm_head = model.embed, model.norm, model.lm_head
    draft.layers = nn.ModuleList(list(model.layers)[:layers])
    return DraftModel(draft.train(model.training), k)


# --------------------------------------------------------------------------- verify and the loop
@dataclass
class SpeculativeStats:
    """Counts of one speculative generation. ``acceptance_rate`` = accepted / examined (drafts the target ruled on:
    every accepted one plus the one rejection that ends a round), the per-token ``α`` of Leviathan et al."""

    rounds: int = 0  # target forwards after the prompt
    drafted: int = 0
    accepted: int = 0
    examined: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.examined if self.examined else float("nan")


def verify(model: Decoder, caches, pending: int, drafts: list[int], q: torch.Tensor | None = None,
           temperature: float = 0.0, top_k: int | None = None, generator=None) -> tuple[int, int]:
    """Feed ``[pending, *drafts]`` through ``caches`` in one forward, keep what the target accepts.

    Returns ``(a, token)``: ``a`` drafts accepted, then the target's next token (not yet in the
    caches, like ``pending``). Every cache is rolled back by ``len(drafts) - a``; each must be a
    ring built with ``lookahead >= len(drafts)``.
    """
    m = len(drafts)
    for i, cache in enumerate(caches):
        lookahead = getattr(cache, "lookahead", None)
        if lookahead is None or not hasattr(cache, "rollback"):
            raise ValueError(f"caches[{i}] is a {type(cache).__name__}, which cannot take tokens back; "
                             "speculative decoding needs RingBufferKVCache(window_size, lookahead=k)")
        if m > lookahead:
            raise ValueError(f"drafts: {m} tokens, more than caches[{i}]'s lookahead={lookahead}; "
                             f"build the caches with lookahead >= {m}")
    device = next(model.parameters()).device
    logits = model.step(torch.tensor([[pending, *drafts]], device=device), caches)[0]  # (m + 1, vocab)
    a, token = accept(logits, drafts, q, temperature, top_k, generator)
    for cache in caches:
        cache.rollback(m - a)
    return a, token


@torch.no_grad()
def speculative_generate(model: Decoder, prompt_ids: torch.Tensor, max_new_tokens: int, drafter,
                         temperature: float = 0.0, top_k: int | None = None,
                         generator: torch.Generator | None = None) -> tuple[torch.Tensor, SpeculativeStats]:
    """``Decoder.generate(prompt_ids, max_new_tokens, speculative=drafter)``, with its counts.

    ``prompt_ids`` ``(1, Tp)``, checked by the caller; returns ``(1, Tp + max_new_tokens)`` and the
    :class:`SpeculativeStats`. Greedy (``temperature=0``): the tokens of plain greedy decoding.
    """
    if prompt_ids.shape[0] != 1:
        raise ValueError(f"speculative decoding serves one sequence (batch 1), as transformers' assisted "
                         f"generation does; got prompt_ids of batch {prompt_ids.shape[0]}")
    if not (hasattr(drafter, "propose") and hasattr(drafter, "begin") and hasattr(drafter, "accepted")):
        raise ValueError(f"speculative must be a drafter (PromptLookup(k), early_exit(model, layers, k), "
                         f"DraftModel(model, k)); got {type(drafter).__name__}")
    k = check_positive_int("k", drafter.k)
    stats = SpeculativeStats()
    if max_new_tokens == 0:
        return prompt_ids, stats
    W = model.config.window_size
    caches = LayerCaches([RingBufferKVCache(W, lookahead=k) for _ in model.layers], W)
    tokens = prompt_ids[0].tolist()
    drafter.begin(model, tokens)
    logits = model.step(prompt_ids, caches)[:, -1]  # (1, vocab), as plain generate
    out = [int(Decoder._pick(logits, temperature, top_k, generator))]
    while len(out) < max_new_tokens:
        m = min(k, max_new_tokens - len(out) - 1)  # a round emits up to m + 1 tokens: never past the budget
        drafts, q = drafter.propose(tokens + out, m, temperature, top_k, generator) if m else ([], None)
        a, token = verify(model, caches, out[-1], drafts, q, temperature, top_k, generator)
        if drafts:
            drafter.accepted(a)
        stats.rounds += 1
        stats.drafted += len(drafts)
        stats.accepted += a
        stats.examined += a + (a < len(drafts))
        out += drafts[:a] + [token]
    return torch.cat([prompt_ids, torch.tensor([out], device=prompt_ids.device)], dim=1), stats
