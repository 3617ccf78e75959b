"""What the scheduler keeps per request, and its pool: a prefix cache that knows its block size."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from swkv_teach._validate import check_positive_int
from swkv_teach.caches.prefix import PrefixCache
from swkv_teach.speculative import PromptLookup, SpeculativeStats

__all__ = ["Request", "ServingBlocks"]


@dataclass
class Request:
    """One request: ``prompt`` token ids, ``max_new_tokens``, and how to pick them (as ``Decoder.generate``)."""

    prompt: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    seed: int | None = None
    id: int = -1
    tokens: list[int] = field(default_factory=list)  # the new tokens, in order
    table: list[int] = field(default_factory=list)  # logical block -> pool block, -1 if none held
    written: int = 0  # tokens whose keys are in the pool (vLLM's num_computed_tokens; the next position)
    reserved: int = 0  # blocks promised at admission (reserved mode)
    generator: torch.Generator | None = None
    hashes: list[bytes] = field(default_factory=list)  # chained hashes of its full blocks so far
    cached: int = 0  # logical blocks already offered to the prefix cache
    prefill_end: int = 0  # tokens to compute before decoding (set when it is read from the queue)
    preemptions: int = 0
    drafter: PromptLookup | None = None  # its own copy: a speculative row; None: a plain one
    drafts: list[int] = field(default_factory=list)  # drafts scheduled for this step's verify (not yet accepted)
    spec: SpeculativeStats | None = None  # rounds, drafted, accepted, examined (speculative rows)

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens

    @property
    def lookahead(self) -> int:
        """Drafts a verify may add to its one token: ``k`` for a speculative row, 0 for a plain one."""
        return 0 if self.drafter is None else self.drafter.k

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.tokens)

    @property
    def output(self) -> list[int]:
        """Prompt followed by the new tokens: what ``Decoder.generate`` returns for it."""
        return self.prompt + self.tokens


class ServingBlocks(PrefixCache):
    """The scheduler's pool: a :class:`~swkv_teach.caches.prefix.PrefixCache` that knows its block size.

    Without prefix caching nothing is ever cached, so blocks go out and come back first in,
    first out, as :class:`~swkv_teach.caches.BlockPool`'s.
    """

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks)
        self.block_size = check_positive_int("block_size", block_size)
