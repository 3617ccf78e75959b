"""The serving bench's issue-28 rows: token budget vs reserved, and the chat with prefix caching off and on.

Ratios of timings are not asserted (no timed asserts); what is asserted is what the rows promise
besides speed: the same tokens in every configuration, and the chat's token accounting.
"""

from __future__ import annotations

import torch

import swkv_teach as sw
from swkv_teach import Decoder, DecoderConfig
from swkv_teach.bench.serving import budget_throughput, chat_prefix_caching, table


def test_budget_rows_same_tokens_and_a_ratio():
    torch.manual_seed(0)
    decoder = Decoder(DecoderConfig(window_size=6)).eval()
    requests = [dict(prompt=list(range(i, i + 3 + i)), max_new_tokens=5 + i) for i in range(5)]
    row = budget_throughput(decoder, requests, concurrency=4, token_budget=8, block_size=2, repeats=1)
    assert row["same_tokens"] and row["ratio_of_medians"] == row["budget"]["median"] / row["reserved"]["median"]
    assert row["met"] == (row["ratio"] >= 0.95)


def test_chat_rows_account_for_every_prompt_token():
    decoder, tokenizer = sw.load_pretrained()
    result = chat_prefix_caching(decoder, tokenizer, conversations=3, turns=2, max_new_tokens=4, num_blocks=64)
    assert result["same_tokens"]
    rows = {(r["mode"], r["prefix_caching"]): r for r in result["rows"]}
    for mode in ("reserved", "budget"):
        off, on = rows[(mode, False)], rows[(mode, True)]
        assert off["prefill_tokens_computed"] == off["prompt_tokens"] and off["prefix_hit_tokens"] == 0
        assert on["prefill_tokens_computed"] + on["prefix_hit_tokens"] == on["prompt_tokens"]
        # the 205-character system prompt alone is 12 full blocks of 16: the 2nd and 3rd conversations of turn 0
        # and all of turn 1 hit at least those in the reserved mode (each newcomer is read after the last one)
        if mode == "reserved":
            assert on["prefix_hit_tokens"] >= (2 + 3) * 12 * 16
        assert result["ratio"][mode] == on["prefill_tokens_computed"] / off["prefill_tokens_computed"]
    assert "ratio reserved" in table({"one_by_one": {"tokens_per_s": {"median": 1, "min": 1, "max": 1},
                                                      "new_tokens": 1}, "rows": [], "chat": result,
                                      "config": {"requests": 0, "num_blocks": 1, "block_size": 16,
                                                 "window_size": 64, "threads": 1}})
