"""The course's scheduler against transformers' continuous batching (swkv_teach.bench.hf_batching), on tiny chats.

What the rows say is checked, never how fast: their shape, the counts (prompt tokens computed, hits, forward tokens)
against arithmetic done here, and the greedy tokens against ``Decoder.generate``. transformers 5.15 (CI's other
version) serves a sliding-window model with a misplaced ring (``cache_manager.py`` lines 508 and 529): there its
tokens are held against a reference that reads the window the way those lines do.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason='transformers not installed: pip install -e ".[hf]"')

from swkv_teach.bench import hf_batching as hb  # noqa: E402
from swkv_teach.hf import to_hf  # noqa: E402
from swkv_teach.pretrained import load_pretrained  # noqa: E402
from swkv_teach.serving.workload import SYSTEM_PROMPT  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.skipif(hb.hf_batching_missing() is not None,
                                                 reason=str(hb.hf_batching_missing()))]

# versions whose continuous batching writes a long prompt's keys from slot 0 and reads the window from
# past_length % W (5.15.0: generation/continuous_batching/cache_manager.py lines 529 and 508); fixed upstream by
# huggingface/transformers#47708 ("Fix sliding window cache index off-by-one on wraparound"), as 5.25 reads
MISREADS_THE_RING = transformers.__version__ in {"5.15.0"}
TINY = dict(conversations=2, turns=2, max_new_tokens=6, repeats=1)


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained()


@pytest.fixture(scope="module")
def result(shipped):
    return hb.compare(*shipped, **TINY)


def test_rows_are_the_four_servers_with_their_counts(result, shipped):
    decoder, tokenizer = shipped
    rows = {r["server"]: r for r in result["rows"]}
    assert list(rows) == list(hb.SERVERS)
    requests = TINY["conversations"] * TINY["turns"]
    for name, r in rows.items():
        assert r["new_tokens"] == requests * TINY["max_new_tokens"]
        assert r["tokens_per_s"]["median"] > 0 and r["cpu_tokens_per_s"]["median"] > 0
        assert len(r["seconds"]["wall"]) == TINY["repeats"] and 0 < r["model_s"] <= r["wall_s"]
        # every prompt token is either computed or a hit; every new token after a request's first is fed once
        assert r["prompt_tokens_computed"] + r["prefix_hit_tokens"] == r["prompt_tokens"], name
        assert r["forward_tokens"] - r["prompt_tokens_computed"] == requests * (TINY["max_new_tokens"] - 1), name
        assert r["threads"] == [1], f"{name}'s forwards ran with {r['threads']} threads"
    assert len(tokenizer.encode(SYSTEM_PROMPT)) > decoder.config.window_size, "every prompt passes the window"
    assert rows["course"]["prefix_hit_tokens"] == 0 and rows["hf"]["prefix_hit_tokens"] == 0
    assert 0 < rows["course+prefix"]["prompt_tokens_computed"] < rows["course"]["prompt_tokens_computed"]
    assert rows["course"]["ratio_to_course"] == 1.0 and rows["hf"]["ratio_to_course"] > 0
    # HF rows are also put beside the course's server doing the same thing
    assert [r["ratio_to_counterpart"] is None for r in rows.values()] == [True, True, False, False]
    assert len(result["env"]["load_average"]["before"]) == 3
    text = hb.table(result)
    for name in hb.SERVERS:
        assert f"\n{name} " in text


def test_hf_shares_no_block_of_a_sliding_window_model(result):
    """``allow_block_sharing=True`` on a model whose layers all slide: transformers turns it off
    (``SlidingAttentionCacheAllocator.supports_block_sharing = False``), so nothing is hit."""
    sharing = next(r for r in result["rows"] if r["server"] == "hf+sharing")
    assert sharing["block_sharing_used"] is False and sharing["prefix_hit_tokens"] == 0
    assert sharing["prompt_tokens_computed"] == sharing["prompt_tokens"]
    assert "block sharing asked for, not used" in hb.table(result)
    # HF's SDPA call covers every query and key of a forward; the rows' own blocks are part of it
    assert sharing["scores_dense"] > sharing["scores_rows"] > 0


def test_course_rows_give_generates_tokens(result):
    for r in result["rows"]:
        if r["server"].startswith("course"):
            a = r["agree_with_generate"]
            assert a["agree"] == a["requests"] == 4 and a["first_divergence"] is None, r["server"]


@pytest.mark.skipif(MISREADS_THE_RING, reason=f"transformers {transformers.__version__} misplaces the sliding "
                    "window's ring (cache_manager.py lines 508 and 529): its tokens are checked against that reading "
                    "in test_hf_continuous_batching_reads_the_window_as_its_version_does")
def test_hf_rows_give_generates_tokens_and_the_courses(result):
    for r in result["rows"]:
        if r["server"].startswith("hf"):
            assert r["agree_with_generate"]["agree"] == 4, (r["server"], r["agree_with_generate"])
            assert r["same_as_course"]["agree"] == 4, (r["server"], r["same_as_course"])


def _misread_reference(eager, prompt: list[int], new_tokens: int, W: int) -> list[int]:
    """Greedy tokens as 5.15's continuous batching computes them for one request prefilled in one chunk.

    Its ring writes the prompt's last ``min(P, W)`` keys into slots 0, 1, ... (line 529 starts at
    ``past_length % W`` = 0, ignoring the ``P - W`` positions it drops), then each decode step at position ``p``
    reads ``min(p, W - 1)`` slots from ``0`` (``p < W``) or ``p % W`` (line 508), and writes slot ``p % W``. The
    positions those slots hold (and the query itself) are what the query sees: a 4-D mask on a full forward.
    """
    P = len(prompt)
    slots = dict(enumerate(range(max(0, P - W), P)))
    seen, ids = {}, list(prompt)
    for _ in range(new_tokens):
        p = len(ids) - 1
        if p >= P:
            start = 0 if p < W else p % W
            seen[p] = [slots[(start + i) % W] for i in range(min(p, W - 1))] + [p]
            slots[p % W] = p
        T = len(ids)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None]
        visible = (j <= i) & (j > i - W)  # the prompt's rows: the window convention (swkv_teach.masks)
        for q, keys in seen.items():
            visible[q] = False
            visible[q, keys] = True
        mask = torch.zeros(T, T).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]
        with torch.no_grad():
            ids.append(int(eager(torch.tensor([ids]), attention_mask=mask).logits[0, -1].argmax()))
    return ids[P:]


@pytest.mark.parametrize("prompt_len", [57, 64, 73, 131])  # ends inside the window, at it, past it, past 2W
def test_hf_continuous_batching_reads_the_window_as_its_version_does(shipped, prompt_len):
    decoder, tokenizer = shipped
    W, n = decoder.config.window_size, 12
    text = "def read_lines(path):\n    with open(path) as f:\n        return [line.rstrip() for line in f]\n" * 2
    prompt = tokenizer.encode(text[:prompt_len])
    server = hb.HFServer(to_hf(decoder), block_sharing=False, max_new_tokens=n)
    try:
        rid = server.submit(prompt, n)
        got = server.run()[rid][prompt_len:]
    finally:
        server.close()
    plain = decoder.generate(torch.tensor([prompt]), n)[0, prompt_len:].tolist()
    misread = _misread_reference(to_hf(decoder, "eager"), prompt, n, W)
    assert misread != plain, "the reference must tell the two readings apart at this length"
    if MISREADS_THE_RING:
        assert got == misread
    else:
        assert got == plain


def test_hf_block_sharing_hits_what_the_courses_prefix_cache_hits_without_a_window(shipped):
    """The full-attention checkpoint, one turn (every sequence within its W = 256), HF given no sliding window:
    its block sharing acts, skipping whole blocks of the shared system prompt, as the course's prefix cache does."""
    decoder, tokenizer = load_pretrained(name="full")
    result = hb.compare(decoder, tokenizer, conversations=3, turns=1, max_new_tokens=4, repeats=1,
                        hf_sliding_window=False, servers=("course+prefix", "hf", "hf+sharing"))
    rows = {r["server"]: r for r in result["rows"]}
    sharing, plain = rows["hf+sharing"], rows["hf"]
    assert sharing["block_sharing_used"] is True and plain["block_sharing_used"] is False
    assert sharing["prefix_hit_tokens"] > 0 and sharing["prefix_hit_tokens"] % result["config"]["block_size"] == 0
    assert sharing["prompt_tokens_computed"] < plain["prompt_tokens_computed"] == plain["prompt_tokens"]
    assert sharing["prefix_hit_tokens"] == rows["course+prefix"]["prefix_hit_tokens"]
    for r in rows.values():
        assert r["agree_with_generate"]["agree"] == 3, r["server"]
    assert rows["hf"]["same_as_course"] is None  # no "course" row was asked for


def test_full_attention_is_refused_where_the_chat_outgrows_the_window(shipped):
    with pytest.raises(ValueError, match=r"hf_sliding_window=False.*window \(64 tokens\).*reaches \d+ tokens"):
        hb.compare(*shipped, hf_sliding_window=False, **TINY)


@pytest.mark.parametrize("servers", [(), ("course", "vllm"), ("hf", "hf")])
def test_servers_must_be_distinct_known_names(shipped, servers):
    with pytest.raises(ValueError, match=r"servers must be distinct names from .*got"):
        hb.compare(*shipped, servers=servers, **TINY)


@pytest.mark.parametrize("bad,match", [(dict(repeats=0), "repeats"), (dict(turns=0), "turns"),
                                       (dict(attn_implementation="eager"), "attn_implementation must be 'sdpa' or")])
def test_bad_settings_are_named(shipped, bad, match):
    with pytest.raises(ValueError, match=match):
        hb.compare(*shipped, **{**TINY, **bad})


def test_without_continuous_batching_the_hf_rows_are_left_out_with_a_note(shipped, monkeypatch):
    monkeypatch.setattr(hb, "hf_batching_missing", lambda: "transformers is not installed: rows skipped")
    result = hb.compare(*shipped, servers=("course", "hf"), **TINY)
    assert [r["server"] for r in result["rows"]] == ["course"]
    assert result["notes"] == ["transformers is not installed: rows skipped"]
    assert "note: transformers is not installed" in hb.table(result)


def test_a_transformers_without_continuous_batching_is_named(monkeypatch):
    import sys

    # the module now in sys.modules (5.15 swaps it after a model is built); a lazy module, so set, not delete
    current = sys.modules["transformers"]
    monkeypatch.setattr(current, "ContinuousBatchingConfig", None)
    assert f"transformers {current.__version__} has no ContinuousBatchingConfig" in hb.hf_batching_missing()


def test_bench_section_is_skipped_with_a_line_when_the_hf_rows_are_off():
    from swkv_teach.bench import run
    from swkv_teach.bench.report import table

    result = run(windows=[4], quick=True, decode=False, hf=False, hf_batching=True, progress=False)
    assert result["hf_batching"] is None
    assert "note: HF continuous batching rows skipped: the Hugging Face rows are off (--no-hf)" in table(result)


def test_command_line_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "cb.json"
    assert hb.main(["--conversations", "1", "--turns", "1", "--new-tokens", "2", "--repeats", "1",
                    "--json", str(out)]) == 0
    assert [r["server"] for r in json.loads(out.read_text())["rows"]] == list(hb.SERVERS)
    assert "hf+sharing" in capsys.readouterr().out
    assert hb.main(["--turns", "0"]) == 2
