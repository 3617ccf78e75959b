"""The interview drill (notebooks/14_interview_drill): its shape as a drill, and content errors that must not return.

Read from the stored notebook (its cells and printed outputs), so a rebuilt notebook is what is checked:

- each question is a short heading with the full question as the first line under it, and its answer folded
  in a styled box; the drill is the last lesson;
- Q16's printed milliseconds are the ones its answer states (the calculator once counted the whole model,
  7.24 G parameters, and printed 4.5 / 9.5 ms under an answer saying 4.4 / 9.4 ms and 14.2 GB of weights);
- Q17 no longer claims FlashAttention's in-kernel RoPE serves a ring "with tables shifted": the kernel rotates
  only the new keys it writes, at ``cache_seqlens`` (flash-attention's flash_attn_interface.py docstring of
  ``flash_attn_with_kvcache``; csrc/flash_attn/flash_api.cpp refuses cos/sin without ``k``);
- a question asks how a hybrid model's prefix-cache hit is found (vLLM's HybridKVCacheCoordinator);
- Q20 (speculative decoding on a sliding window) keeps $W + k$ slots and counts the keys a $W$-slot ring loses,
  as its check cell prints them from real rings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRILL = ROOT / "notebooks" / "14_interview_drill.ipynb"


def _cells() -> list[dict]:
    return json.loads(DRILL.read_text())["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _question(n: int) -> tuple[str, list[dict]]:
    """Question ``n``'s markdown (heading, question, answer) and the code cells after it, up to the next heading."""
    cells = _cells()
    start = next(i for i, c in enumerate(cells)
                 if c["cell_type"] == "markdown" and re.match(rf"### Q{n}\. ", _src(c)))
    code = []
    for c in cells[start + 1:]:
        if c["cell_type"] == "markdown" and re.match(r"#{1,3} ", _src(c)):
            break
        if c["cell_type"] == "code":
            code.append(c)
    return _src(cells[start]), code


def _printed(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


def _questions() -> list[str]:
    return [_src(c) for c in _cells() if c["cell_type"] == "markdown" and re.match(r"### Q\d+\. ", _src(c))]


def test_the_drill_is_the_last_lesson():
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert lessons[-1] == DRILL.name, f"the drill must come last (it asks about every lesson); last is {lessons[-1]}"


def test_each_question_is_a_short_title_then_the_full_question_then_a_folded_answer():
    questions = _questions()
    assert len(questions) >= 20
    numbers = [int(re.match(r"### Q(\d+)\.", q).group(1)) for q in questions]
    assert numbers == list(range(1, len(questions) + 1)), f"questions out of order: {numbers}"
    for q in questions:
        lines = q.split("\n")
        title = lines[0]
        assert len(title) <= 70, f"a question's heading should be a short title (it is the page's contents): {title!r}"
        first = next(line for line in lines[1:] if line.strip())
        assert re.fullmatch(r"\*\*.+[?.]\*\*", first), (
            f"{title}: the first line under the title should be the full question, in bold; got {first!r}")
        assert len(first) > len(title), f"{title}: the full question is shorter than its title"
        assert q.count('<details class="swkv-answer">') == 1 and q.count("</details>") == 1, (
            f"{title}: the answer should be folded in one <details class=\"swkv-answer\"> box")
        assert q.index("<details") > q.index(first), f"{title}: the question must come before its answer"


def test_q16_prints_the_numbers_its_answer_states():
    text, code = _question(16)
    assert "7.24e9 * 2" not in "".join(_src(c) for c in code), "Q16 counts the whole model (7.24 G) as weights read"
    printed = "\n".join(_printed(c) for c in code)
    weights = re.search(r"weights read per step: ([\d.]+) GB", printed)
    assert weights, f"Q16's calculator should print the weights a step reads; printed:\n{printed}"
    assert f"{weights.group(1)} GB" in text, f"Q16 prints {weights.group(1)} GB of weights; the answer does not say it"
    steps = dict(((int(b), int(t)), float(ms)) for b, t, ms in
                 re.findall(r"batch\s+(\d+),\s+(\d+) cached tokens each:\s+([\d.]+) ms", printed))
    assert set(steps) == {(1, 4096), (32, 32768), (32, 4096)}, f"Q16 printed {printed!r}"
    stated = [float(x) for x in re.findall(r"about ([\d.]+) ms", text)]
    assert len(stated) == 3, f"Q16's answer should state three step times ('about N ms'); found {stated}"
    order = [(1, 4096), (32, 32768), (32, 4096)]  # the order the answer states them in
    for key, said in zip(order, stated):
        ms = steps[key]
        close = abs(ms - said) <= 0.5 if said >= 20 else f"{ms:.1f}" == f"{said:.1f}"  # "about 45 ms" for 45.3
        assert close, f"Q16 at batch {key[0]}, {key[1]} tokens prints {ms} ms; the answer says {said} ms"


def test_q16_counts_the_weights_as_lesson_0_does():
    """Lesson 0 counts 32 layers of P weights, the output head and one embedding row: 14.2 GB in fp16."""
    d, d_kv, mlp, vocab = 4096, 8 * 128, 14336, 32_000
    p = d * d + 2 * d * d_kv + d * d + 3 * d * mlp
    expected = (32 * p + vocab * d + d) * 2
    _, code = _question(16)
    printed = "\n".join(_printed(c) for c in code)
    assert f"weights read per step: {expected / 1e9:.1f} GB" in printed
    lesson0 = (ROOT / "notebooks" / "00_why_cache.py").read_text()
    assert "weight_bytes = (layers * P + vocab7 * d7 + d7) * bytes_per_value" in lesson0, (
        "lesson 0 changed how it counts the weights a step reads: update Q16 to match it")


def test_q17_says_in_kernel_rope_does_not_serve_a_ring():
    text, _ = _question(17)
    flat = " ".join(text.split())
    assert "shifted" not in flat, "Q17 again says a ring can use FlashAttention's RoPE with shifted tables"
    assert "seen − min(seen, W)" not in flat and "seen - min(seen, W)" not in flat
    assert re.search(r"for a ring, RoPE is applied outside the kernel", flat, re.I), flat
    assert re.search(r"cache_seqlens` the row's length \*before\* the new tokens", flat), (
        "Q17 should say how in-kernel RoPE works for a paged cache: cache_seqlens = the length before the new tokens")
    assert "flash_api.cpp" in flat and "flash_attn_interface.py" in flat, "Q17 should name the sources it relies on"


def test_a_question_asks_for_a_hybrid_models_prefix_cache_hit():
    hybrid = [q for q in _questions() if "hybrid" in q.split("\n")[0].lower() and "prefix" in q.lower()]
    assert hybrid, "no drill question on prefix-cache hits in a hybrid model"
    flat = " ".join(hybrid[0].split())
    for needed in ("HybridKVCacheCoordinator", "find_longest_cache_hit", "kv_cache_coordinator.py",
                   "full-attention hit, then", "within"):
        assert needed in flat, f"the hybrid prefix-cache question should say {needed!r}"


def test_q20_speculative_decoding_keeps_w_plus_k_slots_and_counts_what_a_w_slot_ring_loses():
    """W = 4096, k = 5, 3 of 5 drafts rejected (a = 2 kept): on a W-slot ring the token at n + i overwrites the key of
    n + i - W, which the next query (n + a + 1) needs when i >= a + 2: i = 4, 5, keys n - 4092 and n - 4091."""
    text, code = _question(20)
    flat = " ".join(text.split())
    W, k, a, n = 4096, 5, 2, 5000
    lost = [n + i - W for i in range(a + 1, k + 1) if n + i - W > n + a + 1 - W]
    assert lost == [n - 4092, n - 4091]
    assert f"W + k = {W + k}" in flat and "n - 4092" in flat and "n - 4091" in flat, flat
    assert "i \\ge a + 2" in flat and "counter" in flat and "Lesson 13" in flat
    printed = "\n".join(_printed(c) for c in code)
    assert f"{W} slots: keys the next query needs but lost: {lost}; rollback(3) refused" in printed, printed
    assert f"{W + k} slots: keys the next query needs but lost: []; rollback(3) done" in printed, printed
    # the rollback alone needs k - 1 spare slots; the course's ring keeps k because its verify writes before it reads
    assert f"{W + k - 1} slots: keys the next query needs but lost: []; rollback(3) done" in printed, printed
    assert f"W + k - 1 = {W + k - 1}" in flat and "*before* reading" in flat, flat
