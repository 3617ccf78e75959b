"""``hf_cache``: the course's caches as a ``transformers`` Cache, inside HF's own Mistral, Gemma 2 and Gemma 3.

Every expectation comes from Hugging Face itself: its default cache (``DynamicCache``, whose sliding
layers are ``DynamicSlidingWindowLayer``), a full forward without any cache, or its own layer driven
side by side with ours. Models are tiny, random and built locally (nothing is downloaded); the
windows are small so that the prompts and the 5·W-token runs cross them several times.
Runs under whichever transformers is installed; CI runs it under the newest and under 5.15.0 (Colab's).
"""

from __future__ import annotations

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers", reason='transformers not installed: pip install -e ".[hf]"')

from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer  # noqa: E402

from swkv_teach.hf import hf_cache  # noqa: E402
from swkv_teach.hf_cache import HF_KINDS, WindowLayer, cache_kwarg  # noqa: E402

pytestmark = pytest.mark.hf
HF_4 = "cache_position" in inspect.signature(DynamicSlidingWindowLayer.get_mask_sizes).parameters

TOL = 1e-4  # fp32 logits, ours vs HF's
MARGIN = 1e-3  # greedy tokens must agree where HF's top-2 logits are further apart than this
DIMS = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=1024, initializer_range=0.1, bos_token_id=None,
            eos_token_id=None, pad_token_id=None)


def build(family: str, window: int, attn: str = "eager"):
    """A random tiny model: Mistral (layer_types None: every layer slides), Gemma 2 (alternating), Gemma 3 text."""
    torch.manual_seed(0)
    if family == "mistral":
        config = transformers.MistralConfig(**DIMS, num_hidden_layers=2, sliding_window=window,
                                            attn_implementation=attn)
        return transformers.MistralForCausalLM(config).eval()
    if family == "gemma2":
        config = transformers.Gemma2Config(**DIMS, num_hidden_layers=3, sliding_window=window,
                                           attn_implementation=attn)
        return transformers.Gemma2ForCausalLM(config).eval()
    config = transformers.Gemma3TextConfig(**DIMS, num_hidden_layers=4, sliding_window=window,
                                           sliding_window_pattern=3, attn_implementation=attn)
    return transformers.Gemma3ForCausalLM(config).eval()


# (family, window, attention): windows differ so no single W hides an off-by-one; Mistral also on SDPA
CASES = [("mistral", 6, "sdpa"), ("mistral", 5, "eager"), ("gemma2", 7, "eager"), ("gemma3", 6, "eager")]
_models = {}


def model_for(case):
    if case not in _models:
        _models[case] = build(*case)
    return _models[case]


def run(model, cache, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache}).logits


def sliding_layers(cache):
    return [layer for layer in cache.layers if layer.is_sliding]


# ------------------------------------------------------------------ the layers follow the config
def test_layers_follow_the_config():
    """Mistral has no layer_types (every layer slides); Gemma's hybrid stacks keep full layers as DynamicLayer."""
    expected = {  # by hand, from each config: Gemma 2 alternates from a sliding layer 0; Gemma 3 pattern 3
        "mistral": ["W", "W"],
        "gemma2": ["W", "F", "W"],
        "gemma3": ["W", "W", "F", "W"],
    }
    for family, layout in expected.items():
        model = build(family, 4)
        cache = hf_cache(model)
        got = ["W" if isinstance(layer, WindowLayer) else "F" if type(layer) is DynamicLayer else "?"
               for layer in cache.layers]
        assert got == layout, f"{family}: layers {got}, expected {layout}"
        assert cache.is_sliding == [c == "W" for c in layout], f"{family}: is_sliding must be set per layer"
        assert all(layer.sliding_window == 4 for layer in sliding_layers(cache))
        assert not cache.is_compileable, "no static path: torch.compile must not be offered"


def test_multimodal_gemma3_takes_its_layers_from_the_text_config():
    """Regression: a Gemma3Config keeps sliding_window and layer_types in text_config, not at the top."""
    text = dict(DIMS, num_hidden_layers=3, sliding_window=5, sliding_window_pattern=3)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(
        transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)).eval()
    cache = hf_cache(model)
    assert cache.is_sliding == [True, True, False]
    ids = torch.randint(0, DIMS["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=12, do_sample=False)
        ours = model.generate(ids, max_new_tokens=12, do_sample=False, **{cache_kwarg(model): cache})
    assert torch.equal(ours, ref)


# ------------------------------------------------------- layer by layer against HF's own sliding layer
@pytest.mark.parametrize("kind", ["ring", "naive"])
@pytest.mark.parametrize("window", [2, 3, 8])  # not 1: HF's layer slices [-W + 1:] = [0:] and keeps everything
@pytest.mark.parametrize("batch", [1, 2])
def test_layer_reports_and_returns_what_hf_sliding_layer_does(kind, window, batch):
    """Before each update ``get_mask_sizes`` and ``get_seq_length`` equal HF's ``DynamicSlidingWindowLayer``'s;
    the keys returned are HF's: in the same order for a chunk, a permutation for one token (the ring's slot
    order, which is harmless only because that one query sees every key it gets)."""
    g = torch.Generator().manual_seed(10 * window + batch)
    ours, hf = WindowLayer(kind, window), DynamicSlidingWindowLayer(sliding_window=window)
    sizes = [1, 2, 5, max(window - 1, 1), window + 3]
    for step in range(40):
        q = sizes[int(torch.randint(len(sizes), (1,), generator=g))]
        # transformers 4.x asks with the new tokens' cache_position, 5.x with their count
        ask = torch.arange(hf.get_seq_length(), hf.get_seq_length() + q) if HF_4 else q
        assert ours.get_mask_sizes(ask) == hf.get_mask_sizes(ask), (
            f"step {step}, {q} new tokens, seen {hf.get_seq_length()}")
        assert ours.get_seq_length() == hf.get_seq_length()
        k, v = torch.randn(2, batch, 2, q, 4, generator=g)
        got_k, got_v = ours.update(k, v)
        ref_k, ref_v = hf.update(k, v)
        if q == 1:  # put ours in position order before comparing
            order = torch.argsort(ours.cache.positions)
            got_k, got_v = got_k.index_select(2, order), got_v.index_select(2, order)
        torch.testing.assert_close(got_k, ref_k, rtol=0, atol=0, msg=f"keys differ at step {step} ({q} tokens)")
        torch.testing.assert_close(got_v, ref_v, rtol=0, atol=0, msg=f"values differ at step {step} ({q} tokens)")


def test_a_chunk_after_the_window_filled_gets_keys_in_position_order():
    """Regression for the trap the one-token fast path sets: a chunk's queries mask by position, so the ring
    must not hand them its slots in slot order. W = 3, 7 tokens seen, a chunk of 2: positions 5, 6, 7, 8."""
    layer = WindowLayer("ring", 3)
    for p in range(7):
        layer.update(torch.full((1, 1, 1, 1), float(p)), torch.zeros(1, 1, 1, 1))
    assert layer.get_mask_sizes(2) == (4, 5)
    k, _ = layer.update(torch.tensor([7.0, 8.0]).view(1, 1, 2, 1), torch.zeros(1, 1, 2, 1))
    assert k.flatten().tolist() == [5.0, 6.0, 7.0, 8.0]
    k, _ = layer.update(torch.full((1, 1, 1, 1), 9.0), torch.zeros(1, 1, 1, 1))
    assert sorted(k.flatten().tolist()) == [7.0, 8.0, 9.0] and layer.get_mask_sizes(1) == (3, 8)


# ----------------------------------------------------------------------- inside the real models
def margin(logits: torch.Tensor) -> float:
    """Smallest gap between the top two logits over the batch."""
    top2 = logits.float().topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).min().item()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-W{c[1]}-{c[2]}")
@pytest.mark.parametrize("kind", ["ring", "naive"])
@pytest.mark.parametrize("batch,prompt", [(1, 3), (2, "2W+3")])
def test_generate_equals_the_default_cache(case, kind, batch, prompt):
    """``model.generate(past_key_values=hf_cache(model))`` over W + 4W new tokens: greedy tokens identical to the
    default cache's unless HF's own top-2 margin is <= 1e-3 where they first differ, and every step's logits up
    to there within 1e-4 of the default cache's."""
    model, W = model_for(case), case[1]
    n = 3 if prompt == 3 else 2 * W + 3
    ids = torch.randint(0, DIMS["vocab_size"], (batch, n), generator=torch.Generator().manual_seed(batch + n))
    common = dict(max_new_tokens=5 * W, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        ref = model.generate(ids, **common)
        ours = model.generate(ids, **common, **{cache_kwarg(model): hf_cache(model, kind)})
    differ = (ours.sequences != ref.sequences).any(0).nonzero().flatten()
    last = int(differ[0]) - n if len(differ) else len(ref.logits) - 1  # the step of the first different token
    for step in range(last + 1):
        err = (ours.logits[step] - ref.logits[step]).abs().max().item()
        assert err <= TOL, f"step {step}: logits differ by {err:.2e} from the default cache's (> {TOL})"
    if len(differ):
        assert margin(ref.logits[last]) <= MARGIN, (
            f"greedy token {last} differs from the default cache's where HF's top-2 margin is "
            f"{margin(ref.logits[last]):.2e} > {MARGIN}")
        assert last >= W, f"tokens part after only {last} steps: too few compared"


CHUNKS = lambda W: [1, 2, 5, W - 1, W + 3, 1, 1]  # noqa: E731 - cycled after the prompt


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-W{c[1]}-{c[2]}")
@pytest.mark.parametrize("kind", ["ring", "naive"])
@pytest.mark.parametrize("batch,prompt", [(1, "W+2"), (2, 3)])
def test_manual_chunked_loop_equals_default_cache_and_full_forward(case, kind, batch, prompt):
    """``model(input_ids=chunk, past_key_values=cache)`` with chunks of 1, 2, 5, W-1, W+3 tokens, before and long
    after the window filled: each call's logits equal the default cache's and a full forward's (no cache)."""
    model, W = model_for(case), case[1]
    total = 7 * W
    ids = torch.randint(0, DIMS["vocab_size"], (batch, total), generator=torch.Generator().manual_seed(total + batch))
    with torch.no_grad():
        full = model(input_ids=ids).logits
    ours, default = hf_cache(model, kind), DynamicCache(config=model.config)
    pos, sizes, i = 0, [W + 2 if prompt == "W+2" else 3], 0
    while pos < total:
        q = min(sizes.pop() if sizes else CHUNKS(W)[i % 7], total - pos)
        i += not sizes
        chunk = ids[:, pos: pos + q]
        got, ref = run(model, ours, chunk), run(model, default, chunk)
        for name, want in (("the default cache", ref), ("a full forward", full[:, pos: pos + q])):
            err = (got - want).abs().max().item()
            assert err <= TOL, f"chunk of {q} at position {pos}: logits differ from {name}'s by {err:.2e}"
        pos += q
        assert ours.get_seq_length() == pos, "get_seq_length must count tokens seen, not stored"


@pytest.mark.parametrize("case", CASES[1:], ids=lambda c: f"{c[0]}-W{c[1]}-{c[2]}")
def test_int8_agrees_on_top1_with_hf_greedy(case):
    """``"int8"``: teacher-forced along HF's own greedy sequence (prompt 2W+1, then 5W tokens one at a time),
    its top-1 equals HF's next token on at least 95 % of steps."""
    model, W = model_for(case), case[1]
    ids = torch.randint(0, DIMS["vocab_size"], (1, 2 * W + 1), generator=torch.Generator().manual_seed(W))
    with torch.no_grad():
        seq = model.generate(ids, max_new_tokens=5 * W, do_sample=False)
    cache = hf_cache(model, "int8")
    logits = run(model, cache, ids)
    agree = []
    for t in range(ids.shape[1], seq.shape[1]):
        agree.append(int(logits[0, -1].argmax()) == int(seq[0, t]))
        logits = run(model, cache, seq[:, t: t + 1])
    assert sum(agree) / len(agree) >= 0.95, f"int8 top-1 agreed on {sum(agree)}/{len(agree)} steps"


# -------------------------------------------------------------------------------------- memory
def kv_storages(obj, batch: int, heads: int) -> dict[int, tuple[torch.Size, int]]:
    """Storage -> (shape, bytes) of every ``(batch, heads, ., .)`` tensor reachable from ``obj``'s attributes
    (through dicts, lists, tuples and nested objects); a view counts its whole storage, once."""
    found, todo, visited = {}, [obj], set()
    while todo:
        x = todo.pop()
        if id(x) in visited:
            continue
        visited.add(id(x))
        if isinstance(x, torch.Tensor):
            if x.dim() == 4 and tuple(x.shape[:2]) == (batch, heads):
                st = x.untyped_storage()
                found.setdefault(st.data_ptr(), (x.shape, st.nbytes()))
        elif isinstance(x, dict):
            todo += list(x.values())
        elif isinstance(x, (list, tuple)):
            todo += list(x)
        elif hasattr(x, "__dict__") and not isinstance(x, type):
            todo += list(vars(x).values())
    return found


@pytest.mark.parametrize("kind", HF_KINDS)
@pytest.mark.parametrize("feed", ["one token at a time", "chunks"])
def test_each_sliding_layer_holds_one_window_after_five(kind, feed):
    """After W + 4W tokens each sliding layer keeps at most W tokens' keys and values, counting every
    ``(batch, heads, ., .)`` storage it keeps alive (a view counts its whole storage): the ring exactly W slots,
    int8 W slots of int8 data and fp32 scales. Known extras, pinned so they cannot grow unseen: the naive cache
    keeps W + 1 after a one-token step (its W-token view of the (W+1)-token cat, see SlidingWindowKVCache.nbytes);
    int8 may keep a one-token fp32 layout template (``_like``), no more. Full layers keep all 5W, as HF's own do."""
    case = ("gemma2", 7, "eager")
    model, W = model_for(case), case[1]
    B, H, D = 2, DIMS["num_key_value_heads"], DIMS["head_dim"]
    ids = torch.randint(0, DIMS["vocab_size"], (B, 5 * W), generator=torch.Generator().manual_seed(5))
    cache = hf_cache(model, kind)
    run(model, cache, ids[:, :W])
    pos = W
    while pos < 5 * W:
        q = 1 if feed == "one token at a time" else min(W + 3, 5 * W - pos)
        run(model, cache, ids[:, pos: pos + q])
        pos += q
    if kind == "int8":
        per_token, extra = 2 * B * H * (D + 4), B * H * D * 4  # int8 k and v + an fp32 scale each; the template
    else:
        per_token, extra = 2 * B * H * D * 4, 0
    slots = W + 1 if kind in ("naive", "sliding") and feed == "one token at a time" else W
    for i, layer in enumerate(cache.layers):
        if not layer.is_sliding:
            assert layer.get_seq_length() == 5 * W
            continue
        held = kv_storages(layer, B, H)
        total = sum(nbytes for _, nbytes in held.values())
        assert slots * per_token <= total <= slots * per_token + extra, (
            f"layer {i} ({kind}, {feed}) keeps {total} bytes in {len(held)} storages "
            f"({[tuple(shape) for shape, _ in held.values()]}): {(total - extra) / per_token:.2f} tokens, "
            f"expected {slots}")
        assert layer.get_seq_length() == 5 * W and len(layer.cache) == W


# ------------------------------------------------------------------------------------ refusals
def test_refuses_a_model_without_a_window():
    model = transformers.MistralForCausalLM(transformers.MistralConfig(**DIMS, num_hidden_layers=1,
                                                                       sliding_window=None))
    with pytest.raises(ValueError, match="sliding_window is None"):
        hf_cache(model)


@pytest.mark.parametrize("kind", ["sinks", "lru", "paged", "Ring", ""])
def test_refuses_kinds_hf_masks_cannot_describe(kind):
    with pytest.raises(ValueError, match="kind must be one of"):
        hf_cache(model_for(CASES[0]), kind)


def test_refuses_bidirectional_gemma3():
    config = transformers.Gemma3TextConfig(**DIMS, num_hidden_layers=2, sliding_window=6,
                                           use_bidirectional_attention=True)
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        hf_cache(transformers.Gemma3ForCausalLM(config))


def test_refuses_unknown_layer_types():
    config = transformers.Gemma2Config(**DIMS, num_hidden_layers=2, sliding_window=6,
                                       layer_types=["sliding_attention", "full_attention"])
    config.layer_types = ["sliding_attention", "chunked_attention"]
    with pytest.raises(ValueError, match="chunked_attention"):
        hf_cache(transformers.Gemma2ForCausalLM(config))


@pytest.mark.parametrize("after", [0, 9])
def test_refuses_padding_and_leaves_the_cache_as_it_was(after):
    """A padded batch cannot be served (the ring's slot order vs HF's position-ordered padding mask):
    refused before any layer changes, fresh or after ``after`` tokens."""
    model = model_for(CASES[0])
    ids = torch.randint(0, DIMS["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    cache = hf_cache(model)
    if after:
        run(model, cache, ids[:, :after])
    before = [(layer.get_seq_length(), len(layer.cache)) for layer in cache.layers]
    mask = torch.ones(2, after + 3, dtype=torch.long)
    mask[1, 0] = 0
    with pytest.raises(ValueError, match="padded batch"):
        model(input_ids=ids[:, after: after + 3], attention_mask=mask, **{cache_kwarg(model): cache})
    assert [(layer.get_seq_length(), len(layer.cache)) for layer in cache.layers] == before
    with pytest.raises(ValueError, match="padded batch"):
        model.generate(ids[:, :4], attention_mask=mask[:, :4], max_new_tokens=2,
                       **{cache_kwarg(model): hf_cache(model)})


def test_refuses_a_new_batch_size_and_leaves_the_cache_as_it_was():
    model = model_for(CASES[0])
    ids = torch.randint(0, DIMS["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(2))
    cache = hf_cache(model)
    run(model, cache, ids[:1, :5])
    with pytest.raises(ValueError, match="input batch is 2 but this cache holds batch 1"):
        run(model, cache, ids[:, 5:6])
    assert cache.get_seq_length() == 5


def test_refuses_beam_search():
    model = model_for(CASES[0])
    ids = torch.randint(0, DIMS["vocab_size"], (1, 4), generator=torch.Generator().manual_seed(4))
    with pytest.raises(NotImplementedError, match="beam search"):
        model.generate(ids, num_beams=2, max_new_tokens=3, do_sample=False, **{cache_kwarg(model): hf_cache(model)})


# ------------------------------------------------------------------------------------- bench rows
def test_bench_section_reports_every_implementation_and_judges_only_what_holds_anywhere():
    """The bench's HF rows (quick sizes): one row per implementation, ring and naive greedy tokens equal to
    DynamicCache's, the ring's sliding layers holding W slots (2·B·H·W·D·4 bytes) plus its W-entry slot index
    (int64), and speed targets reported but not judged outside a full run."""
    from swkv_teach.bench.hf_cache import IMPLS, QUICK, SHAPE, section

    result = section(quick=True, judged=False)
    rows = {r["impl"]: r for r in result["rows"]}
    assert sorted(rows) == sorted(IMPLS)
    assert rows["ring"]["same_tokens_as_dynamic"] and rows["naive"]["same_tokens_as_dynamic"]
    W = QUICK["window"]
    kv = 2 * 1 * SHAPE["num_key_value_heads"] * W * SHAPE["head_dim"] * 4
    assert rows["ring"]["sliding_bytes_held"] == [kv + 8 * W] * SHAPE["num_hidden_layers"], (
        f"expected W slots of keys and values ({kv} B) + the slot index ({8 * W} B) per sliding layer; "
        f"got {rows['ring']['sliding_bytes_held']}")
    t = result["targets"]
    assert t["hf_same_tokens"]["met"] is True
    assert t["hf_ring_vs_dynamic"]["met"] is None and t["hf_ring_vs_static"]["met"] is None


# ------------------------------------------ config fields and hooks, each held on 5.15 and the newest (issue 30)
def test_refuses_a_window_the_config_switches_off():
    """Qwen2's switch: ``use_sliding_window=False`` with a ``sliding_window`` still written in the config (as the
    Qwen2.5 checkpoints ship theirs) means every layer attends to everything; a window cache there would drop keys
    the model reads. Transformers nulls the field at construction, so it is set afterwards, as an older config
    loaded field by field would have it."""
    config = transformers.Qwen2Config(**DIMS, num_hidden_layers=2, use_sliding_window=False)
    config.sliding_window = 6
    model = transformers.Qwen2ForCausalLM(config).eval()
    with pytest.raises(ValueError, match="use_sliding_window is False"):
        hf_cache(model)
    config.use_sliding_window = True  # the same model with its window switched on is served
    assert len(hf_cache(model).layers) == 2


def test_layer_types_longer_than_the_model_are_cut_to_its_layers():
    """A model cut short (``num_hidden_layers`` lowered, as when trimming a checkpoint's layers) keeps a longer
    ``layer_types``: the cache gets one layer per model layer, the first ``num_hidden_layers`` types, and
    generates what HF's own cache does."""
    config = transformers.Gemma2Config(**DIMS, num_hidden_layers=3, sliding_window=4, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).eval()
    config.layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
                          "sliding_attention"]
    cache = hf_cache(model)
    assert len(cache.layers) == 3, f"{len(cache.layers)} cache layers for a 3-layer model"
    assert cache.is_sliding == [True, False, True]
    ids = torch.randint(0, DIMS["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=9, do_sample=False)
        ours = model.generate(ids, max_new_tokens=9, do_sample=False, **{cache_kwarg(model): cache})
    assert torch.equal(ours, ref)


def test_the_guard_runs_once_a_forward_however_many_caches_were_made(monkeypatch):
    """``hf_cache(model)`` installs its pre-forward check once per model: a model served many caches in turn
    (one per request) must not pile up hooks, each of which would run the check again on every step."""
    from swkv_teach.hf_cache import WindowCache

    model = build("mistral", 5)
    calls = []
    check = WindowCache.check_call
    monkeypatch.setattr(WindowCache, "check_call", lambda self, *a: (calls.append(1), check(self, *a))[1])
    caches = [hf_cache(model) for _ in range(4)]
    ids = torch.randint(0, DIMS["vocab_size"], (1, 3), generator=torch.Generator().manual_seed(6))
    run(model, caches[-1], ids)
    assert len(calls) == 1, f"the batch/padding check ran {len(calls)} times in one forward (one hook per call?)"


def test_refuses_padding_passed_positionally():
    """``model(input_ids, attention_mask, ...)``: the forward's second positional argument is the mask, in 5.15
    as in the newest; a padded one is refused as the keyword one is, before any layer changes."""
    model = model_for(CASES[0])
    ids = torch.randint(0, DIMS["vocab_size"], (2, 4), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[0, 0] = 0
    cache = hf_cache(model)
    with pytest.raises(ValueError, match="padded batch"):
        with torch.no_grad():
            model(ids, mask, **{cache_kwarg(model): cache})
    assert cache.get_seq_length() == 0
    with torch.no_grad():  # an all-ones mask passed positionally is served
        model(ids, torch.ones_like(mask), **{cache_kwarg(model): cache})
    assert cache.get_seq_length() == 4


@pytest.mark.parametrize("kind", ["sinks", "lru", "paged", "Ring", ""])
def test_the_layer_itself_refuses_kinds_hf_masks_cannot_describe(kind):
    """``WindowLayer`` is public: built directly, it refuses what ``hf_cache`` refuses (sinks and lru keep
    positions (kv_length, kv_offset) cannot describe; paged serves batch 1)."""
    with pytest.raises(ValueError, match="kind must be one of"):
        WindowLayer(kind, 4)


def test_reset_replaces_full_layers_even_where_their_reset_keeps_the_keys(monkeypatch):
    """Regression, held on every version: transformers 5.15's ``DynamicLayer.reset`` is ``CacheLayerMixin.reset``,
    which zeroes the keys in place and keeps them (cache_utils.py:87-91 there); the newest drops them. Give the
    newest 5.15's reset, and a reset cache must still serve a new sequence exactly as a fresh cache does."""
    from transformers.cache_utils import CacheLayerMixin

    monkeypatch.setattr(DynamicLayer, "reset", CacheLayerMixin.reset)
    model = model_for(CASES[2])  # Gemma 2: sliding, full, sliding
    ids = torch.randint(0, DIMS["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(9))
    cache = hf_cache(model)
    run(model, cache, ids[:, :5])
    cache.reset()
    assert cache.get_seq_length() == 0 and [layer.get_seq_length() for layer in cache.layers] == [0, 0, 0]
    got = run(model, cache, ids)
    assert torch.equal(got, run(model, hf_cache(model), ids))
    assert [layer.get_seq_length() for layer in cache.layers] == [7, 7, 7]


def test_cache_kwarg_names_the_keyword_the_forward_takes():
    """Both spellings, whichever transformers is installed: ``cache`` (>= 5.2x) and ``past_key_values`` (5.15)."""
    class New(torch.nn.Module):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, **kwargs):
            return cache

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
            return past_key_values

    assert cache_kwarg(New()) == "cache"
    assert cache_kwarg(Old()) == "past_key_values"
    model = model_for(CASES[0])  # and the installed model takes the cache by that keyword: it fills the cache
    cache = hf_cache(model)
    run(model, cache, torch.zeros(1, 3, dtype=torch.long))
    assert cache.get_seq_length() == 3


# ------------------------------------------------ the compileable ring layer (issue 29): transformers' static layer, no roll
@pytest.mark.parametrize("window", [2, 3, 8])
def test_compileable_ring_layer_reports_and_returns_what_hf_static_sliding_layer_does(window):
    """Driven side by side with ``StaticSlidingWindowLayer`` through one-token steps and chunks (filling, crossing
    and past the window): the same ``get_mask_sizes`` and ``get_seq_length`` before each update, the same keys
    in the same order for chunks and while filling, the same keys in slot order for one token once full."""
    from swkv_teach.hf_cache import CompileableRingLayer
    from transformers.cache_utils import StaticSlidingWindowLayer

    g = torch.Generator().manual_seed(window)
    ours = CompileableRingLayer(max_cache_len=window, sliding_window=window)
    hf = StaticSlidingWindowLayer(max_cache_len=window, sliding_window=window)
    sizes = [1, 1, 1, 2, window, window + 3]
    seen = 0
    for step in range(60):
        q = sizes[int(torch.randint(len(sizes), (1,), generator=g))]
        assert ours.get_mask_sizes(q) == hf.get_mask_sizes(q) and ours.get_seq_length() == hf.get_seq_length() == seen
        k, v = torch.randn(2, 2, 3, q, 4, generator=g)
        k[..., 0] = torch.arange(seen, seen + q, dtype=torch.float)  # feature 0 carries the position
        got_k, got_v = ours.update(k, v)
        ref_k, ref_v = hf.update(k, v)
        if q == 1 and seen >= window:  # slot order: position p in slot p % W
            held = got_k[0, 0, :, 0].tolist()
            assert held[seen % window] == seen, f"step {step}: position {seen} not in slot {seen % window}: {held}"
            assert sorted(held) == list(range(seen - window + 1, seen + 1)), f"step {step}: holds {held}"
            order = torch.argsort(got_k[0, 0, :, 0])
            got_k, got_v = got_k.index_select(2, order), got_v.index_select(2, order)
        torch.testing.assert_close(got_k, ref_k, rtol=0, atol=0, msg=f"keys differ at step {step} ({q} tokens)")
        torch.testing.assert_close(got_v, ref_v, rtol=0, atol=0, msg=f"values differ at step {step} ({q} tokens)")
        seen += q


@pytest.mark.parametrize("prompt", [3, "2W+3"])
def test_compileable_cache_generates_what_hf_static_cache_does(prompt):
    """Eagerly (a CPU without a compile_config), ``generate`` with the compileable ring equals ``generate`` with
    transformers' static cache, 5·W tokens past a window of 6 (Mistral, SDPA); ``is_compileable`` is True."""
    from swkv_teach.hf_cache import hf_compileable_cache

    model = model_for(CASES[0])
    W = CASES[0][1]
    T = 2 * W + 3 if prompt == "2W+3" else prompt
    ids = torch.randint(0, DIMS["vocab_size"], (2, T), generator=torch.Generator().manual_seed(T))
    cache = hf_compileable_cache(model)
    assert cache.is_compileable
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=5 * W, do_sample=False, cache_implementation="static")
        ours = model.generate(ids, max_new_tokens=5 * W, do_sample=False, **{cache_kwarg(model): cache})
    assert torch.equal(ours, ref)


def test_compileable_cache_refuses_full_attention_layers():
    from swkv_teach.hf_cache import hf_compileable_cache

    with pytest.raises(ValueError, match="every layer slides"):
        hf_compileable_cache(model_for(CASES[2]))


@pytest.mark.slow
def test_transformers_compiled_generate_takes_the_compileable_ring():
    """transformers' compiled ``generate`` (allowed on a CPU through the CompileConfig) runs with our layer and
    decodes the static cache's greedy tokens; the bench rows have their documented fields (never timed here)."""
    from swkv_teach.bench.hf_cache import COMPILED_IMPLS, compiled_rows

    rows = compiled_rows(window=8, new_tokens=12, repeats=1)
    assert [r["impl"] for r in rows] == list(COMPILED_IMPLS)
    assert all(r["same_tokens_as_static"] for r in rows)
    assert all(r["us_per_step"]["median"] > 0 and len(r["us_per_step"]["samples"]) == 1 for r in rows)
    assert rows[-1]["ratio_to_ring"] == 1.0
