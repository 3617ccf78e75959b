"""Exercise 11, part 2: the learner's ``ring_cache(model)`` inside tiny random transformers models.

Mistral (every layer slides; windows 1, 2, 3, 5), Gemma 2 (sliding, full) and Gemma 3 (sliding, sliding,
full) are built on the CPU from a config, seeded inside ``fork_rng`` (the caller's random state is left
alone), with eager attention, so the mask is built in full from ``get_mask_sizes``. ``ring_cache(model)``
must give the learner's class to the sliding layers and something unwindowed to the full ones
(:func:`cache_of`); then chunked ``model(...)`` calls and greedy ``generate`` are held, logit by logit, to
one forward of the whole sequence without a cache (:func:`models`).
"""

from __future__ import annotations

import torch

from swkv_teach.grading._report import ExerciseFailed, call, fail, rehint, show
from swkv_teach.grading._report import learner_name as _name

__all__ = ["ATOL", "DIMS", "build", "cache_of", "models", "signature_hint"]

ATOL = 1e-4  # logits, float32, against transformers' own forward


def signature_hint(run):
    """``run()``; a TypeError about update's arguments gets the signature transformers needs."""
    try:
        return run()
    except ExerciseFailed as e:
        text = str(e)
        if getattr(e, "generic", False) and "TypeError" in text and ("argument" in text or "kwargs" in text):
            raise rehint(e, "transformers calls layer.update(key_states, value_states, kwargs={...}) (5.24; 5.15.0 "
                         "passes nothing more): keep the signature update(self, key_states, value_states, *args, "
                         "**kwargs).") from None
        raise


DIMS = dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=256, initializer_range=0.1, bos_token_id=None, eos_token_id=None,
            pad_token_id=None, attn_implementation="eager")  # eager: the mask is built in full, from get_mask_sizes


def build(tf, family: str, W: int, layers: int = 2):
    """A tiny random model on the CPU, seeded without touching the caller's random state.

    ``layers``: Mistral's and Gemma 2's layer count (a ring_cache that hard-codes two layers shows with 1, 3, 5).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(W)
        if family == "Mistral":
            model = tf.MistralForCausalLM(tf.MistralConfig(**DIMS, num_hidden_layers=layers, sliding_window=W))
        elif family == "Gemma 2":  # sliding and full in turn (sliding, full, sliding for 3)
            model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**DIMS, num_hidden_layers=layers, sliding_window=W))
        else:  # Gemma 3: sliding, sliding, full (not a plain alternation)
            types = ["sliding_attention", "sliding_attention", "full_attention"]
            text = tf.Gemma3TextConfig(**DIMS, num_hidden_layers=3, sliding_window=W, layer_types=types)
            if family == MULTIMODAL:  # the image-text model: its config keeps the language model's in text_config
                vision = tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, image_size=14, patch_size=7)
                model = tf.Gemma3ForConditionalGeneration(tf.Gemma3Config(
                    text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4))
            else:
                model = tf.Gemma3ForCausalLM(text)
    return model.eval()


MULTIMODAL = "Gemma 3 image-text (Gemma3ForConditionalGeneration)"


def multimodal(tf, cls, ring_cache) -> None:
    """``ring_cache`` on an image-text Gemma 3, whose top config has no ``num_hidden_layers`` or ``sliding_window``
    (they are in ``text_config``): the layers only, no forward (that needs images)."""
    try:
        cache_of(tf, cls, ring_cache, build(tf, MULTIMODAL, 2), MULTIMODAL, 2)
    except ExerciseFailed as e:
        if "AttributeError" in str(e) or getattr(e, "generic", False):
            raise rehint(e, "an image-text model's config holds its language model's settings in text_config (its "
                         "top config has no num_hidden_layers or sliding_window): read them from "
                         "model.config.get_text_config(decoder=True), which is the config itself for a text-only "
                         "model.") from None
        raise


def cache_of(tf, cls, ring_cache, model, family: str, W: int):
    """``ring_cache(model)``, checked layer by layer against the config's layer types."""
    config = model.config.get_text_config(decoder=True)
    types = list(getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers)
    case = f"{_name(ring_cache)}(model) for a tiny {family} (W = {W}, layer types {types})"
    try:
        cache = call(case, f"{_name(ring_cache)}(model)", ring_cache, model)
    except ExerciseFailed as e:
        if family == "Mistral" and getattr(e, "generic", False):
            raise rehint(e, "Mistral's config has no layer_types (getattr(config, 'layer_types', None) is None): "
                         "every one of its layers slides, so give each a RingLayer.") from None
        raise
    if not isinstance(cache, tf.cache_utils.Cache):
        raise fail(case, f"it returned {show(cache)}.", hint="return transformers' Cache(layers=[...]).")
    layers = list(getattr(cache, "layers", []))
    if len(layers) != len(types):
        raise fail(case, f"the cache has {len(layers)} layers; the model has {len(types)}.",
                   hint="one cache layer per model layer, however many the model has: is a layer count hard-coded? "
                   "Without config.layer_types (Mistral) every layer slides: build config.num_hidden_layers of "
                   "them, [RingLayer(W) for _ in range(config.num_hidden_layers)].")
    first = {}
    for i, layer in enumerate(layers):
        j = first.setdefault(id(layer), i)
        if j != i:
            raise fail(case, f"layers {j} and {i} are one and the same {type(layer).__name__} object.", hint="each "
                       "model layer has its own keys and values: build a new layer object per model layer "
                       "([RingLayer(W) for ...], not [layer] * n), or the second layer overwrites the first's.")
    for i, (t, layer) in enumerate(zip(types, layers)):
        if t == "full_attention" and (isinstance(layer, cls) or getattr(layer, "is_sliding", False)):
            raise fail(case, f"layer {i} is a full-attention layer (config.layer_types[{i}] = 'full_attention') but "
                       f"the cache gives it {type(layer).__name__}, a window.", hint="full layers attend to every "
                       "past token: windowing them changes the model. Give them transformers' DynamicLayer().")
        if t == "sliding_attention" and not isinstance(layer, cls):
            raise fail(case, f"layer {i} slides (config.layer_types[{i}] = 'sliding_attention') but the cache gives "
                       f"it {type(layer).__name__}, not your {_name(cls)}.",
                       hint=f"build the sliding layers as {_name(cls)}(config.sliding_window).")
    return cache


def models(tf, cls, ring_cache) -> tuple[int, int]:
    """Part 2; returns (chunked calls, generate steps) checked."""
    from swkv_teach.hf_cache import cache_kwarg

    calls = gen_steps = 0
    # (family, window, layers): 1, 3 and 5 layers beside 2, so no layer count can be assumed
    scenarios = [("Mistral", 1, 1), ("Mistral", 2, 3), ("Mistral", 3, 2), ("Mistral", 5, 5), ("Gemma 2", 3, 3),
                 ("Gemma 2", 1, 2), ("Gemma 3", 2, 3)]
    for family, W, layers in scenarios:
        model = build(tf, family, W, layers)
        kw = cache_kwarg(model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(100 + W)
            ids = torch.randint(0, DIMS["vocab_size"], (2, 10 * W + 24))
        for batch, first, rest in ((2, max(W - 1, 1), [1, 2, 5, W - 1, W + 3, 1, 1]), (1, W + 3, [1, W + 3, 2, 1])):
            chunks = [first] + [c for c in rest if c > 0]
            x = ids[:batch, : sum(chunks)]
            with torch.no_grad():
                full = model(x, use_cache=False).logits
                cache = cache_of(tf, cls, ring_cache, model, family, W)
                s = 0
                for q in chunks:
                    case = (f"tiny {family} (W = {W}, {model.config.num_hidden_layers} layers) with your cache, batch "
                            f"{batch}, chunks {chunks}: model(input_ids=tokens {s}..{s + q - 1})")
                    out = signature_hint(lambda: call(case, "the model with your cache", model,
                                                       input_ids=x[:, s: s + q], use_cache=True, **{kw: cache}))
                    err = float((out.logits - full[:, s: s + q]).abs().max())
                    if not err <= ATOL:
                        raise fail(case, f"its logits differ from transformers' (one forward of the whole sequence, "
                                   f"no cache) by {err:.3g}, more than {ATOL:g}.", hint="your layer passed every "
                                   "direct probe above, so look at how it meets transformers: the window it is built "
                                   "with (config.sliding_window), is_sliding, and ring_cache's layer per layer type.")
                    s += q
                    calls += 1
        gen_steps += _generate(tf, cls, ring_cache, model, family, W, ids[:, : W + 2], kw)
    multimodal(tf, cls, ring_cache)
    return calls, gen_steps


def _generate(tf, cls, ring_cache, model, family, W, prompt, kw) -> int:
    """Greedy ``generate`` with ``ring_cache(model)``: each step's logits against one forward, no cache, of the
    sequence it generated. transformers' default cache is not the reference: with ``sliding_window = 1`` its
    ``DynamicSlidingWindowLayer`` keeps every token (``full_key_states[:, :, -self.sliding_window + 1 :, :]``
    is ``[0:]``; ``cache_utils.py`` line 246 in 5.24, 253 in 5.15.0), and on this check's tiny Mistral its
    logits then differ from the no-cache forward by about 2 from the second generated token on (both versions)."""
    common = dict(max_new_tokens=4 * W + 4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    case = f"tiny {family} (W = {W}): model.generate(prompt of {prompt.shape[1]} tokens, batch 2, greedy)"
    P = prompt.shape[1]
    with torch.no_grad():
        cache = cache_of(tf, cls, ring_cache, model, family, W)
        out = call(case, "generate with your cache", model.generate, prompt, **common, **{kw: cache})
        full = model(out.sequences[:, :-1], use_cache=False).logits
    for t, a in enumerate(out.logits):
        err = float((a - full[:, P - 1 + t]).abs().max())
        if not err <= ATOL:
            raise fail(case, f"new token {t + 1}: the logits differ from transformers' (one forward of the sequence, "
                       f"no cache) by {err:.3g}, more than {ATOL:g}.", hint="chunked calls passed, so the difference "
                       "comes with generate's one-token steps: the one-token update and its mask sizes.")
    return len(out.logits)
