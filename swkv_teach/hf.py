"""The door to Hugging Face ``transformers``, both ways.

* ``from_hf``: a ``MistralForCausalLM`` as a :class:`~swkv_teach.model.Decoder` with the same weights (here);
  ``to_hf`` the other way (the shipped checkpoint inside Hugging Face's own serving code, ``bench/hf_batching.py``).
* ``hf_cache``: our caches as a ``transformers`` Cache inside ``model.generate`` (:mod:`swkv_teach.hf_cache`,
  imported on first use, so ``import swkv_teach.hf`` works without transformers).

With :mod:`swkv_teach.hf_cache` the only modules of the package that touch ``transformers``
(besides ``bench/``; install it with ``pip install -e ".[hf]"``). The parity tests use it
to hold the decoder, its caches and its window convention against Hugging
Face's: same logits from a full forward, same tokens from greedy generation.

Mapping (Hugging Face -> ours)::

    hidden_size -> dim              num_attention_heads -> n_heads     num_key_value_heads -> n_kv_heads
    head_dim -> head_dim            intermediate_size -> hidden_dim    num_hidden_layers -> n_layers
    sliding_window -> window_size   rms_norm_eps -> norm_eps           tie_word_embeddings -> tie_embeddings
    rope_theta (4.x) or rope_parameters["rope_theta"] (5.x) -> rope_theta

Both sides use the same window rule (``kv_idx > q_idx - sliding_window``,
see :mod:`swkv_teach.masks`) and the same RoPE layout (``rotate_half`` on
split halves), so no weight needs permuting.
"""

from __future__ import annotations

import torch

from swkv_teach._hf_hint import INSTALL_HINT
from swkv_teach.model import Decoder, DecoderConfig

__all__ = ["config_from_hf", "from_hf", "hf_cache", "mistral_config", "to_hf"]



def __getattr__(name: str):
    # hf_cache subclasses transformers' classes, so it is imported when first asked for (PEP 562)
    if name == "hf_cache":
        from swkv_teach.hf_cache import hf_cache

        return hf_cache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _require_transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(INSTALL_HINT) from e
    return transformers


def _rope_theta(hf_config) -> float:
    """RoPE base from either layout: ``config.rope_parameters`` (transformers 5.x) or ``config.rope_theta`` (4.x)."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        # 5.x writes "rope_type"; a dict carried over from 4.x may still say "type"
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError(f"rope_parameters['rope_type'] must be 'default' (plain RoPE: the decoder has "
                                      f"no scaled or extended RoPE); got {rope_type!r} in {params!r}")
        return float(params["rope_theta"])
    scaling = getattr(hf_config, "rope_scaling", None)
    if scaling:
        raise NotImplementedError(f"config.rope_scaling must be None (plain RoPE: the decoder has no scaled or "
                                  f"extended RoPE); got {scaling!r}")
    return float(getattr(hf_config, "rope_theta", 10000.0))


def config_from_hf(hf_config) -> DecoderConfig:
    """A :class:`DecoderConfig` from a ``MistralConfig``.

    ``sliding_window=None`` or absent (Llama), or ``layer_types`` all ``"full_attention"`` (Qwen2 with
    ``use_sliding_window=False``), is full causal attention: a window of ``max_position_embeddings``,
    the same thing for any sequence the model accepts. Refused: ``layer_types`` mixing both kinds,
    scaled RoPE (``rope_scaling``, or a ``rope_parameters`` type other than ``"default"``), an activation
    other than SiLU.
    """
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise NotImplementedError(f"config.hidden_act must be 'silu' (SwiGLU); got {act!r}")
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    # Llama has no sliding_window at all; Qwen2 keeps one it may not use (layer_types says which layers do)
    window = getattr(hf_config, "sliding_window", None)
    kinds = set(getattr(hf_config, "layer_types", None) or ())
    if len(kinds) > 1:
        raise NotImplementedError(f"config.layer_types mixes {sorted(kinds)}; the decoder gives every layer one "
                                  f"window (a model of only sliding or only full layers converts)")
    if kinds == {"full_attention"} or window is None:
        window = hf_config.max_position_embeddings
    return DecoderConfig(
        vocab_size=hf_config.vocab_size,
        dim=hf_config.hidden_size,
        n_layers=hf_config.num_hidden_layers,
        n_heads=hf_config.num_attention_heads,
        n_kv_heads=hf_config.num_key_value_heads,
        head_dim=head_dim,
        hidden_dim=hf_config.intermediate_size,
        window_size=window,
        rope_theta=_rope_theta(hf_config),
        norm_eps=hf_config.rms_norm_eps,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )


def from_hf(model) -> Decoder:
    """A :class:`Decoder` with ``model``'s config and weights, on its device and in its dtype.

    Args:
        model: a ``transformers.MistralForCausalLM`` (any object with its
            module layout and a ``MistralConfig`` works: a ``LlamaForCausalLM`` with plain RoPE does).
    Raises:
        NotImplementedError: what :func:`config_from_hf` refuses, or weights the decoder has no place
            for (Qwen2's q/k/v biases, Gemma 2's extra norms): converting them would drop them silently.
    """
    _require_transformers()
    if not (hasattr(model, "config") and hasattr(model, "model") and hasattr(model, "lm_head")):
        raise TypeError(f"model must be a transformers MistralForCausalLM; got {type(model).__name__}")
    config = config_from_hf(model.config)
    hf = model.state_dict()
    ours = {"embed.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"]}
    ours["lm_head.weight"] = hf.get("lm_head.weight", hf["model.embed_tokens.weight"])
    for i in range(config.n_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        ours[dst + "attn_norm.weight"] = hf[src + "input_layernorm.weight"]
        ours[dst + "mlp_norm.weight"] = hf[src + "post_attention_layernorm.weight"]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            ours[dst + f"attn.{proj}.weight"] = hf[src + f"self_attn.{proj}.weight"]
        for proj in ("gate_proj", "up_proj", "down_proj"):
            ours[dst + f"mlp.{proj}.weight"] = hf[src + f"mlp.{proj}.weight"]
    # a weight with no place here would be dropped silently (Qwen2's q/k/v biases, Gemma 2's extra norms)
    used = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    used |= {f"model.layers.{i}.{name}" for i in range(config.n_layers) for name in (
        "input_layernorm.weight", "post_attention_layernorm.weight",
        *(f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
        *(f"mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")))}  # fmt: skip
    left = sorted(set(hf) - used)
    if left:
        raise NotImplementedError(f"{type(model).__name__} has weights the decoder has no place for "
                                  f"({len(left)}, first {left[:3]}): only Mistral's layout (no biases) converts")
    ref = hf["model.embed_tokens.weight"]
    decoder = Decoder(config).to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        decoder.load_state_dict(ours, strict=True)
    return decoder.eval()


def mistral_config(config: DecoderConfig, attn_implementation: str = "sdpa", sliding_window: bool = True,
                   max_position_embeddings: int = 1 << 16):
    """The ``MistralConfig`` of a :class:`DecoderConfig` (the inverse of :func:`config_from_hf`).

    ``sliding_window`` is the decoder's ``window_size`` (the same window rule, :mod:`swkv_teach.masks`); with
    ``sliding_window=False`` it is None (full causal attention: the same model for sequences of at most
    ``window_size`` tokens, longer ones differ). No special token ids, so nothing stops or pads on a character
    the char tokenizer gives.
    """
    transformers = _require_transformers()
    return transformers.MistralConfig(
        vocab_size=config.vocab_size, hidden_size=config.dim, intermediate_size=config.hidden_dim,
        num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads, head_dim=config.head_dim,
        sliding_window=config.window_size if sliding_window else None,
        max_position_embeddings=max_position_embeddings, rope_theta=config.rope_theta, rms_norm_eps=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings, attn_implementation=attn_implementation,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )


def to_hf(decoder: Decoder, attn_implementation: str = "sdpa", sliding_window: bool = True):
    """A ``MistralForCausalLM`` with ``decoder``'s config (:func:`mistral_config`, ``sliding_window`` passed on) and
    weights, eval mode, on its device and in its dtype.

    The decoder keeps q/k/v in one ``qkv_proj`` (rows: ``n_heads·head_dim`` of q, then ``n_kv_heads·head_dim`` of
    k, then of v) and gate/up in one ``gate_up_proj`` (gate rows first); Hugging Face keeps them apart, so they
    are split here, in the order :meth:`Decoder.load_state_dict` stacks them back (``from_hf(to_hf(d))`` has
    ``d``'s weights).
    """
    transformers = _require_transformers()
    if not isinstance(decoder, Decoder):
        raise TypeError(f"decoder must be a swkv_teach Decoder; got {type(decoder).__name__}")
    c = decoder.config
    ours = decoder.state_dict()
    hf = {"model.embed_tokens.weight": ours["embed.weight"], "model.norm.weight": ours["norm.weight"],
          "lm_head.weight": ours["lm_head.weight"]}
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    for i in range(c.n_layers):
        src, dst = f"layers.{i}.", f"model.layers.{i}."
        hf[dst + "input_layernorm.weight"] = ours[src + "attn_norm.weight"]
        hf[dst + "post_attention_layernorm.weight"] = ours[src + "mlp_norm.weight"]
        parts = ours[src + "attn.qkv_proj.weight"].split([q, kv, kv])
        for proj, w in zip(("q_proj", "k_proj", "v_proj"), parts):
            hf[dst + f"self_attn.{proj}.weight"] = w
        hf[dst + "self_attn.o_proj.weight"] = ours[src + "attn.o_proj.weight"]
        gate, up = ours[src + "mlp.gate_up_proj.weight"].chunk(2)
        hf[dst + "mlp.gate_proj.weight"], hf[dst + "mlp.up_proj.weight"] = gate, up
        hf[dst + "mlp.down_proj.weight"] = ours[src + "mlp.down_proj.weight"]
    ref = ours["embed.weight"]
    config = mistral_config(c, attn_implementation, sliding_window)
    model = transformers.MistralForCausalLM(config).to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        model.load_state_dict({k: v.clone() for k, v in hf.items()}, strict=True)
    return model.eval()
