"""Exercise 11's check (``check_hf_cache_layer``): what it expects, what it refuses, and that it stays fair.

The catalogue runs in tests/test_grading.py (wrong answers in tests/wrong_answers/hf_layer.py, right ones in
tests/right_answers/hf_layer.py). Here: the expectations worked by hand, the wrong answers' bugs shown to be
real inside transformers (not style rules), the install hint without transformers, and side effects.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from swkv_teach import grading
from swkv_teach.grading import ExerciseFailed
from swkv_teach.grading import _hf_models as hf_models
from swkv_teach.grading import hf_layer as check

transformers = pytest.importorskip("transformers")

from swkv_teach.hf_cache import cache_kwarg  # noqa: E402
from tests.right_answers import hf_layer as rights  # noqa: E402
from tests.wrong_answers import hf_layer as bugs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_the_statements_worked_example_by_hand():
    """W = 3, 7 seen: one token gives (3, 5), a chunk of 2 gives (4, 5) and positions [5, 6, 7, 8] (the statement's
    hint 1); a new layer gives (q, 0). The oracle the check compares with says the same."""
    from swkv_teach.hf_cache import mask_sizes

    assert mask_sizes(7, 3, 1) == (3, 5)
    assert mask_sizes(7, 3, 2) == (4, 5)
    assert mask_sizes(0, 3, 5) == (5, 0)
    layer = bugs._Ring(3)  # the statement's layer
    layer.update(*check._label(range(7), (1, 1, 4), torch.float32, "cpu"))
    k, _ = layer.update(*check._label([7, 8], (1, 1, 4), torch.float32, "cpu"))
    assert check._decode(k) == [5, 6, 7, 8]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_labels_decode_exactly_in_every_dtype(dtype):
    """Positions up to 8 W + 16 + 11 (the longest run) and the batch/head tags are small integers, exact even in
    bfloat16 (8 bits of mantissa: every integer up to 256)."""
    top = 8 * 8 + 16 + 11
    k, v = check._label(range(top), (2, 3, 4), dtype, "cpu", stream=2)
    assert check._decode(k) == list(range(top))
    assert check._decode(-v) == list(range(top))
    assert k[1, 2, 0, 1].item() == 6 + 16  # row 1, head 2 of 3, stream 2


def test_runs_cover_the_chunk_sizes_of_the_issue_and_outlast_the_window():
    """Issue 20: chunks of 1, 2, 5, W - 1 and W + 3 tokens; prompts shorter and longer than W; windows 1 and 2;
    every run at least 8 W + 16 tokens."""
    for W, first, shape, _ in check.RUNS:
        chunks = check.chunks_for(W, first)
        assert sum(chunks) >= 8 * W + 16
        assert {1, 2, 5, W + 3} | ({W - 1} if W > 1 else set()) <= set(chunks)
    assert {W for W, *_ in check.RUNS} >= {1, 2, 3, 5, 8}
    assert any(first < W for W, first, *_ in check.RUNS) and any(first > W for W, first, *_ in check.RUNS)
    assert {shape[0] for _, _, shape, _ in check.RUNS} == {1, 2}


def _logits_error(layer_cls, family: str, W: int = 3) -> float:
    """Largest logit error of a buggy cache in chunked calls against one forward without cache (inf if it raises)."""
    model = hf_models.build(transformers, family, W)
    ids = torch.randint(0, hf_models.DIMS["vocab_size"], (2, 6 * W + 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        cache, s, worst = layer_cls.ring_cache(model), 0, 0.0
        try:
            for q in (W + 2, 1, 1, 2, 1, W + 3, 1):  # chunks at n = 7 and 10 find the slots out of order
                out = model(input_ids=ids[:, s: s + q], use_cache=True, **{cache_kwarg(model): cache}).logits
                worst = max(worst, float((out - full[:, s: s + q]).abs().max()))
                s += q
        except Exception:
            return float("inf")
    return worst


@pytest.mark.parametrize("name, family", [
    ("FullLayersWindowed", "Gemma 2"), ("NotMarkedSliding", "Gemma 2"), ("MaskLengthIsTheWindow", "Mistral"),
    ("MaskOffsetOneEarly", "Mistral"), ("SeqLengthIsTheTokensStored", "Mistral"), ("SlotOrderForAChunk", "Mistral"),
    ("ReturnsOnlyTheNewKeys", "Mistral"), ("ChunkKeepsItsFirstTokens", "Mistral"),
    ("MaskSizesOfTheWindowAfterTheUpdate", "Mistral"), ("RingOneTokenTooWide", "Mistral")])
def test_the_catalogues_bugs_break_the_model_itself(name, family):
    """The check refuses these from direct probes or the cache's layout, with a message naming the bug; here each
    one is run inside the tiny model with nothing but transformers watching: the logits move (or it crashes), so
    the refusal is about a real error, not a rule of style. The statement's layer, run the same way, is exact."""
    assert _logits_error(bugs._Ring, family) < 1e-4
    assert _logits_error(getattr(bugs, name), family) > 1e-3, name


def test_a_right_answer_passes_on_one_object_or_two(capsys):
    ns = types.SimpleNamespace(RingLayer=rights.TimeMajorRing, ring_cache=rights.TimeMajorRing.ring_cache)
    grading.check_hf_cache_layer(ns)
    grading.check_hf_cache_layer(rights.ShiftLeftWindow, rights.ShiftLeftWindow.ring_cache)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and all(line.startswith("✅") for line in out)


def test_the_library_layer_and_cache_are_refused():
    from swkv_teach.hf_cache import WindowLayer, hf_cache

    with pytest.raises(ExerciseFailed, match="library's own swkv_teach.hf_cache.WindowLayer"):
        grading.check_hf_cache_layer(WindowLayer, bugs._Ring.ring_cache)
    with pytest.raises(ExerciseFailed, match="library's own swkv_teach.hf_cache.hf_cache"):
        grading.check_hf_cache_layer(bugs._Ring, hf_cache)

    class KeepsTheLibrarysRing(bugs._Ring):
        def __init__(self, sliding_window):
            super().__init__(sliding_window)
            from swkv_teach.caches import make_cache

            self.cache = make_cache("ring", sliding_window)

    with pytest.raises(ExerciseFailed, match="RingBufferKVCache"):
        grading.check_hf_cache_layer(KeepsTheLibrarysRing)


def test_the_check_leaves_the_callers_random_state_alone():
    """The tiny models and prompts are seeded inside fork_rng: a learner's seeded cells after the check see the
    same numbers as without it."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    grading.check_hf_cache_layer(rights.DictStoreRing)
    assert torch.equal(torch.get_rng_state(), before)


def test_without_transformers_grading_imports_and_the_check_says_how_to_install():
    """transformers is optional: `import swkv_teach.grading` works without it, and the check fails with the
    install line (not an ImportError traceback)."""
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import swkv_teach.grading as g\n"
            "class L: pass\n"
            "try:\n    g.check_hf_cache_layer(L, lambda model: None)\n"
            "except g.ExerciseFailed as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("❌") and 'pip install "transformers>=5.15"' in out.stdout, out.stdout
