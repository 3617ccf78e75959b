"""transformers' assisted generation on the course's ring: ``hf_cache(model, lookahead=L)`` under ``crop``.

transformers verifies ``k`` drafts in one forward of ``k + 1`` tokens, then calls ``cache.crop(-r)`` for the
``r`` rejected ones (``generation/utils.py`` lines 4186-4187 in 5.25, 3802-3803 in 5.15). On our cache that
is the ring's O(1) ``rollback``. Every expectation comes from Hugging Face itself: the same ``generate``
call with its default cache (``DynamicCache``, whose sliding layers record their past and slice it back),
plain greedy decoding, or its ``DynamicSlidingWindowLayer`` driven side by side with ours. Models are tiny,
random, built locally and run in float64 (so a greedy tie cannot hinge on rounding); prompts of 2W + 3
tokens and 3W new ones take every run past the window several times.

Under transformers 5.15 an assistant whose own layers slide fails inside HF's own assistant cache, whatever
the target's cache is (see ``test_a_sliding_assistant_fails_in_hf_itself_where_its_layer_returns_too_much``);
there the assistant attends to everything (its cache has no sliding layer) and the target keeps the ring.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason='transformers not installed: pip install -e ".[hf]"')

from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer  # noqa: E402

from swkv_teach.hf import hf_cache  # noqa: E402
from swkv_teach.hf_cache import WindowCache, WindowLayer, cache_kwarg  # noqa: E402

pytestmark = pytest.mark.hf

# HF's default initializer_range (0.02): at 0.1 the random Gemma models repeat one token, and every draft is accepted
DIMS = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=1024, bos_token_id=None, eos_token_id=None, pad_token_id=None)
LAYERS = {"mistral": 2, "gemma2": 3, "gemma3": 4}


def build(family: str, window: int, attn: str = "eager", slide: bool = True):
    """A random tiny float64 model; ``slide=False``: the same architecture with every layer full (an assistant)."""
    torch.manual_seed(0)
    n = LAYERS[family]
    full = dict(layer_types=["full_attention"] * n) if not slide else {}
    if family == "mistral":
        config = transformers.MistralConfig(**DIMS, num_hidden_layers=n, sliding_window=window if slide else None,
                                            attn_implementation=attn)
        return transformers.MistralForCausalLM(config).eval().double()
    if family == "gemma2":
        config = transformers.Gemma2Config(**DIMS, num_hidden_layers=n, sliding_window=window,
                                           attn_implementation=attn, **full)
        return transformers.Gemma2ForCausalLM(config).eval().double()
    config = transformers.Gemma3TextConfig(**DIMS, num_hidden_layers=n, sliding_window=window, sliding_window_pattern=3,
                                           attn_implementation=attn, **full)
    return transformers.Gemma3ForCausalLM(config).eval().double()


def _records_only_what_the_mask_sees() -> bool:
    """Whether HF's recording sliding layer returns ``W - 1 + q`` states when forwards run without a crop between
    (5.25, ``cache_utils.py`` lines 250-259), as an assistant's own ``generate`` does; 5.15 returns every state
    since the last crop (``cache_utils.py`` lines 252-261 there) while its mask covers ``W - 1 + q``."""
    layer = DynamicSlidingWindowLayer(sliding_window=2)
    layer.activate_past_recording()
    layer.update(torch.zeros(1, 1, 3, 1), torch.zeros(1, 1, 3, 1))
    keys, _ = layer.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
    return keys.shape[-2] == 2


SLIDING_ASSISTANT_OK = _records_only_what_the_mask_sees()
CASES = [("mistral", 6, "sdpa"), ("gemma2", 7, "eager"), ("gemma3", 6, "eager")]
_models, _plain = {}, {}


def model_for(case):
    if case not in _models:
        _models[case] = build(*case)
    return _models[case]


def prompt(W: int, repeat: bool) -> torch.Tensor:
    """2W + 3 tokens; ``repeat``: a 5-token phrase repeated, so prompt lookup finds matches from the start."""
    g = torch.Generator().manual_seed(W)
    if repeat:
        phrase = torch.randint(0, DIMS["vocab_size"], (1, 5), generator=g)
        return phrase.repeat(1, (2 * W + 3) // 5 + 1)[:, : 2 * W + 3]
    return torch.randint(0, DIMS["vocab_size"], (1, 2 * W + 3), generator=g)


def plain_greedy(case, ids):
    key = (case, tuple(ids.flatten().tolist()))
    if key not in _plain:
        with torch.no_grad():
            _plain[key] = model_for(case).generate(ids, max_new_tokens=3 * case[1], do_sample=False)
    return _plain[key]


def assistant_for(target, family: str, window: int, slide: bool, noise: float = 0.3):
    """The target's weights plus noise (so some drafts are accepted and some rejected), sliding or full attention."""
    assistant = build(family, window, target.config._attn_implementation, slide=slide)
    assistant.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in assistant.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return assistant


def drafting(assistant, k: int):
    """A constant ``k`` drafts a round (no confidence cut-off, which would shorten them)."""
    cfg = assistant.generation_config
    cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule, cfg.assistant_confidence_threshold = k, "constant", 0.0
    return assistant


@pytest.fixture
def crops(monkeypatch):
    """``(tokens seen before, r)`` for every ``WindowCache.crop(-r)`` transformers makes."""
    seen = []
    crop = WindowCache.crop

    def spy(self, tokens_to_remove):
        seen.append((self.layers[0].get_seq_length(), -int(tokens_to_remove)))
        return crop(self, tokens_to_remove)

    monkeypatch.setattr(WindowCache, "crop", spy)
    return seen


def generate(model, ids, cache=None, **kwargs):
    with torch.no_grad():
        extra = {cache_kwarg(model): cache} if cache is not None else {}
        return model.generate(ids, max_new_tokens=3 * model.config.sliding_window, **kwargs, **extra)


def rolled_back_past_the_window(crops, W: int, L: int) -> list[int]:
    """The rollbacks taken once the ring had wrapped (more tokens seen than its W + L slots)."""
    return [r for seen, r in crops if r and seen > W + L]


# -------------------------------------------------------------------------- prompt lookup
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-W{c[1]}-{c[2]}")
@pytest.mark.parametrize("k,lookahead", [(1, 1), (3, 2), (4, 4)])
def test_prompt_lookup_gives_hf_default_caches_tokens_past_the_window(case, k, lookahead, crops):
    """``generate(prompt_lookup_num_tokens=k)`` on ``hf_cache(model, lookahead=L)``: the same greedy tokens as the
    same call on HF's default cache and as plain greedy decoding, with drafts rejected (rolled back) after the ring
    wrapped. ``L = k - 1`` serves too: right after a verify the ring can take back ``L + 1`` tokens."""
    model, W = model_for(case), case[1]
    ids = prompt(W, repeat=True)
    ref = generate(model, ids, prompt_lookup_num_tokens=k, do_sample=False)
    cache = hf_cache(model, lookahead=lookahead)
    ours = generate(model, ids, cache, prompt_lookup_num_tokens=k, do_sample=False)
    assert torch.equal(ref, plain_greedy(case, ids)), "HF's own prompt lookup should equal greedy (test setup)"
    assert torch.equal(ours, ref), f"tokens differ from HF's default cache from step {first_difference(ours, ref)}"
    assert rolled_back_past_the_window(crops, W, lookahead), f"no draft rejected after the ring wrapped: {crops}"
    assert max(r for _, r in crops) <= k
    for layer in cache.layers:
        if isinstance(layer, WindowLayer):  # W + L slots, never more
            assert layer.cache.k_buf.shape[2] == W + lookahead


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    differ = (a != b).any(0).nonzero().flatten()
    return int(differ[0]) if len(differ) else -1


# -------------------------------------------------------------------------- a draft model
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-W{c[1]}-{c[2]}")
@pytest.mark.parametrize("k", [3])
@pytest.mark.parametrize("assistant_slides", [False, True], ids=["full-assistant", "sliding-assistant"])
def test_assistant_model_gives_hf_default_caches_tokens_past_the_window(case, k, assistant_slides, crops):
    """``generate(assistant_model=...)`` drafting ``k`` tokens a round, target on ``hf_cache(model, lookahead=k)``:
    the same greedy tokens as HF's default cache and as plain greedy, with drafts rejected after the ring wrapped.
    The assistant keeps HF's own cache (transformers never hands it the target's: ``cache`` is left out of the
    assistant's kwargs, ``generation/candidate_generator.py`` lines 124-129 in 5.25)."""
    if assistant_slides and not SLIDING_ASSISTANT_OK:
        pytest.skip("transformers 5.15: a sliding assistant fails in HF's own cache (pinned by the test below)")
    model, W = model_for(case), case[1]
    assistant = drafting(assistant_for(model, case[0], W, assistant_slides), k)
    ids = prompt(W, repeat=False)
    ref = generate(model, ids, assistant_model=assistant, do_sample=False)
    ours = generate(model, ids, hf_cache(model, lookahead=k), assistant_model=assistant, do_sample=False)
    assert torch.equal(ref, plain_greedy(case, ids)), "HF's own assisted generation should equal greedy (test setup)"
    assert torch.equal(ours, ref), f"tokens differ from HF's default cache from step {first_difference(ours, ref)}"
    assert rolled_back_past_the_window(crops, W, k), f"no draft rejected after the ring wrapped: {crops}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-W{c[1]}-{c[2]}")
def test_early_exit_drafts_give_hf_default_caches_tokens(case, crops):
    """``assistant_early_exit=1`` (``EarlyExitCandidateGenerator``, ``generation/candidate_generator.py`` line 1178 in
    5.25): the model's first layer drafts ``num_assistant_tokens`` tokens, 20 by default (``generation/
    configuration_utils.py`` line 643), so the ring is built with ``lookahead=20``: greedy tokens equal HF's default
    cache's and plain greedy. Under 5.15 HF's own run fails on Gemma (its assistant cache crops a full layer the
    early exit never filled: ``DynamicLayer.crop`` slices ``keys`` of None, ``cache_utils.py`` lines 186-188 there;
    5.25 returns first, line 176): pinned, ours fails the same way rather than giving other tokens. A model of its
    own: a draft that raises leaves the model cut to its first layer (``candidate_generator.py`` lines 1218-1221
    in 5.15 restore ``num_hidden_layers`` only after the draft returns)."""
    model, W = build(*case), case[1]
    ids = prompt(W, repeat=False)
    try:
        ref = generate(model, ids, assistant_early_exit=1, do_sample=False)
    except TypeError as e:
        assert transformers.__version__.startswith("5.15") and case[0] != "mistral", f"HF's own run failed: {e}"
        with pytest.raises(TypeError, match="not subscriptable"):
            generate(model, ids, hf_cache(model, lookahead=20), assistant_early_exit=1, do_sample=False)
        return
    ours = generate(model, ids, hf_cache(model, lookahead=20), assistant_early_exit=1, do_sample=False)
    assert torch.equal(ref, plain_greedy(case, ids)), "HF's own early exit should equal greedy (test setup)"
    assert torch.equal(ours, ref), f"tokens differ from HF's default cache from step {first_difference(ours, ref)}"
    assert any(r for _, r in crops), f"no draft rejected: {crops}"


def test_a_sliding_assistant_fails_in_hf_itself_where_its_layer_returns_too_much():
    """Pins why 5.15 cannot run a sliding assistant (on any target cache): the assistant's own ``DynamicCache``
    records its past (``generation/utils.py`` lines 2026-2028 there), its ``generate`` runs several forwards before
    the next crop, and 5.15's recording layer returns every state since that crop (``cache_utils.py`` lines 252-261)
    while the mask covers ``W - 1 + q`` (its ``get_mask_sizes``): a shape error, raised by HF with its own cache.
    5.25 slices to what the mask sees (``cache_utils.py`` lines 250-259) and runs it (the test above)."""
    case = CASES[0]
    model, W = model_for(case), case[1]
    assistant = drafting(assistant_for(model, case[0], W, slide=True), 3)
    ids = prompt(W, repeat=False)
    if SLIDING_ASSISTANT_OK:
        assert torch.equal(generate(model, ids, assistant_model=assistant, do_sample=False), plain_greedy(case, ids))
        return
    for cache in (None, hf_cache(model, lookahead=3)):  # HF's default cache, then ours: the same failure
        with pytest.raises(RuntimeError, match="must match the size"):
            generate(model, ids, cache, assistant_model=assistant, do_sample=False)


# -------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-W{c[1]}-{c[2]}")
def test_sampled_assisted_generation_draws_hf_default_caches_tokens_for_the_same_seed(case):
    """``do_sample=True``: prompt lookup (HF samples every position and keeps drafts to the first mismatch) and an
    assistant (HF's speculative sampling, ratio test): for the same seed the ring draws the default cache's tokens,
    since its keys come back in the same order, so the logits are the same numbers."""
    model, W = model_for(case), case[1]
    assistant = drafting(assistant_for(model, case[0], W, slide=SLIDING_ASSISTANT_OK), 3)
    for seed, how in ((W, dict(prompt_lookup_num_tokens=3)), (W + 1, dict(assistant_model=assistant))):
        ids = prompt(W, repeat="prompt_lookup_num_tokens" in how)
        torch.manual_seed(seed)
        ref = generate(model, ids, do_sample=True, **how)
        torch.manual_seed(seed)
        ours = generate(model, ids, hf_cache(model, lookahead=3), do_sample=True, **how)
        assert torch.equal(ours, ref), f"seed {seed}, {sorted(how)}: differ from step {first_difference(ours, ref)}"


# -------------------------------------------------------------------------- layer by layer
@pytest.mark.parametrize("window", [2, 3, 8])
@pytest.mark.parametrize("lookahead", [0, 2, 5])
def test_layer_under_verify_and_crop_reports_and_returns_what_hf_recording_layer_does(window, lookahead):
    """Assisted decoding's pattern, 60 rounds: a verify of ``1 + m`` tokens (``m <= L + 1`` drafts; the first round
    a prompt of up to 3W), then ``crop(-r)``, ``r <= m``. Before each update ``get_mask_sizes`` and ``get_seq_length``
    equal those of HF's ``DynamicSlidingWindowLayer`` after ``activate_past_recording``, and the keys and values
    returned are HF's, bit for bit and in order (a plain ring's one-token keys are in slot order: sorted first)."""
    g = torch.Generator().manual_seed(100 * window + lookahead)
    ours, hf = WindowLayer("ring", window, lookahead), DynamicSlidingWindowLayer(sliding_window=window)
    ours.activate_past_recording()
    hf.activate_past_recording()
    draw = lambda n: int(torch.randint(n, (1,), generator=g))  # noqa: E731 - 0 .. n - 1
    for step in range(60):
        q = 1 + draw(3 * window) if step == 0 else 1 + draw(lookahead + 2)
        assert ours.get_mask_sizes(q) == hf.get_mask_sizes(q), f"step {step}: {q} tokens, seen {hf.get_seq_length()}"
        assert ours.get_seq_length() == hf.get_seq_length()
        k, v = torch.randn(2, 2, 2, q, 4, generator=g)
        got_k, got_v = ours.update(k, v)
        ref_k, ref_v = hf.update(k, v)
        if q == 1 and lookahead == 0:
            order = torch.argsort(ours.cache.positions)
            got_k, got_v = got_k.index_select(2, order), got_v.index_select(2, order)
        torch.testing.assert_close(got_k, ref_k, rtol=0, atol=0, msg=f"keys differ at step {step} ({q} tokens)")
        torch.testing.assert_close(got_v, ref_v, rtol=0, atol=0, msg=f"values differ at step {step} ({q} tokens)")
        r = draw(q) if step else draw(min(q, lookahead + 2))
        ours.crop(-r)
        hf.crop(-r)


def test_crop_moves_a_counter_and_copies_no_tensor():
    """``crop(-r)`` is the ring's rollback: the same buffers, unchanged, and ``r`` fewer tokens seen."""
    layer = WindowLayer("ring", 4, lookahead=3)
    layer.update(torch.randn(1, 2, 11, 8), torch.randn(1, 2, 11, 8))
    k_buf, before = layer.cache.k_buf, layer.cache.k_buf.clone()
    layer.crop(-4)
    assert layer.cache.k_buf is k_buf and torch.equal(k_buf, before)
    assert layer.get_seq_length() == 7 and layer.get_mask_sizes(1) == (4, 4)


# -------------------------------------------------------------------------- refusals
def test_a_crop_past_what_the_ring_kept_is_refused_and_changes_nothing():
    """W = 4, L = 2, 12 tokens one at a time: the ring holds positions 6..11, and the query after a rollback of r
    needs 12 - r - 3 .. 12 - r - 1, so r = 3 is the most (``rollback_limit``): ``crop(-4)`` is refused by name."""
    g = torch.Generator().manual_seed(0)
    layer, twin = WindowLayer("ring", 4, lookahead=2), WindowLayer("ring", 4, lookahead=2)
    for _ in range(12):
        k, v = torch.randn(2, 1, 2, 1, 8, generator=g)
        layer.update(k, v)
        twin.update(k, v)
    assert layer.rollback_limit() == 3
    with pytest.raises(ValueError, match=r"crop\(-4\): this ring .*lookahead=2.* at most 3 tokens"):
        layer.crop(-4)
    layer.crop(-3)
    twin.crop(-3)
    k, v = torch.randn(2, 1, 2, 1, 8, generator=g)
    for a, b in zip(layer.update(k, v), twin.update(k, v)):
        assert torch.equal(a, b), "a refused crop must leave the layer as it was"


@pytest.mark.parametrize("first", ["sliding_attention", "full_attention"])
def test_a_ring_without_lookahead_refuses_two_and_no_layer_is_cut(first):
    """A plain ring (W slots) past its window can take back one token, not two: ``crop(-2)`` is refused before any
    layer changes, a full-attention layer ahead of it included (Gemma 2 with layer 0 ``first``)."""
    config = transformers.Gemma2Config(**DIMS, num_hidden_layers=2, sliding_window=4, attn_implementation="eager",
                                       layer_types=[first, "full_attention" if first != "full_attention"
                                                    else "sliding_attention"])
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).eval()
    cache = hf_cache(model)
    with torch.no_grad():
        model(input_ids=torch.arange(9).view(1, 9), **{cache_kwarg(model): cache})
    with pytest.raises(ValueError, match=r"lookahead=0.*at most 1 tokens"):
        cache.crop(-2)
    assert [layer.get_seq_length() for layer in cache.layers] == [9, 9]
    cache.crop(-1)
    assert [layer.get_seq_length() for layer in cache.layers] == [8, 8]


def test_generate_refuses_drafts_longer_than_the_ring_can_take_back():
    """``prompt_lookup_num_tokens=4`` on a plain ring: refused by name, never wrong tokens. transformers 5.25 says
    the draft length up front (``activate_past_recording(recurrent_states_to_keep=4)``, ``generation/utils.py``
    line 4002), so the refusal comes before any forward; 5.15 does not (line 3632), so it comes at the first crop
    that needs more than one token back, after that verify's forward and before any token is chosen from it."""
    case = CASES[0]
    model, W = model_for(case), case[1]
    with pytest.raises(ValueError, match=r"lookahead=0.*at most 1\b"):
        generate(model, prompt(W, repeat=True), hf_cache(model), prompt_lookup_num_tokens=4, do_sample=False)


def test_only_the_ring_takes_part_in_assisted_decoding():
    """Other kinds cannot take tokens back: refused when transformers starts assisted decoding (``activate_past_
    recording``, called before the first forward in 5.15 and 5.25), by name; ``lookahead`` is the ring's alone."""
    model = model_for(CASES[0])
    cache = hf_cache(model, "naive")
    with pytest.raises(NotImplementedError, match="only kind 'ring'"):
        generate(model, prompt(6, repeat=True), cache, prompt_lookup_num_tokens=2, do_sample=False)
    assert cache.get_seq_length() == 0, "refused before the first forward"
    with pytest.raises(ValueError, match="lookahead is the ring's"):
        hf_cache(model, "naive", lookahead=2)
    with pytest.raises(NotImplementedError, match="only kind 'ring'"):
        WindowLayer("int8", 4).crop(-1)
    assert not WindowLayer("naive", 4).is_croppable and WindowLayer("ring", 4).is_croppable


def test_bad_crop_arguments_are_refused_by_name():
    layer = WindowLayer("ring", 4, lookahead=2)
    layer.update(torch.randn(1, 1, 9, 8), torch.randn(1, 1, 9, 8))
    with pytest.raises(ValueError, match=r"crop\(3\): a positive count is the legacy"):
        layer.crop(3)
    with pytest.raises(TypeError, match="tokens_to_remove must be an int <= 0"):
        layer.crop(-1.0)
    with pytest.raises(TypeError, match="tokens_to_remove must be an int <= 0"):
        layer.crop(True)
    with pytest.raises(ValueError, match="lookahead"):
        WindowLayer("ring", 4, lookahead=-1)
    assert layer.get_seq_length() == 9
    layer.crop(torch.tensor(-2))  # 5.15 passes a 0-dim tensor (n_matches is a .sum(), generation/utils.py line 3774)
    assert layer.get_seq_length() == 7


def test_past_recording_refuses_a_draft_length_beyond_the_ring():
    """``activate_past_recording(recurrent_states_to_keep=k)`` (5.25's form): ``k <= L + 1`` accepted, more refused,
    and the message names the lookahead to build with."""
    layer = WindowLayer("ring", 4, lookahead=2)
    layer.activate_past_recording(recurrent_states_to_keep=3)
    assert layer.record_past
    with pytest.raises(ValueError, match=r"drafts 4 tokens.*lookahead=2.*hf_cache\(model, lookahead=4\)"):
        WindowLayer("ring", 4, lookahead=2).activate_past_recording(recurrent_states_to_keep=4)
    WindowLayer("ring", 4).activate_past_recording()  # 5.15's form: no length, nothing to check yet


def test_default_cache_reference_is_a_recording_dynamic_cache():
    """The reference is what the docstring says: under assisted decoding HF's default cache for these models is a
    ``DynamicCache`` whose sliding layers are ``DynamicSlidingWindowLayer`` (recording their past)."""
    model = model_for(CASES[1])
    cache = DynamicCache(config=model.config)
    generate(model, prompt(7, repeat=True), cache, prompt_lookup_num_tokens=2, do_sample=False)
    kinds = {type(layer).__name__ for layer in cache.layers}
    assert "DynamicSlidingWindowLayer" in kinds and all(
        layer.record_past for layer in cache.layers if isinstance(layer, DynamicSlidingWindowLayer))
