"""The door to Hugging Face ``transformers``, both ways.

* ``from_hf``: a ``MistralForCausalLM`` as a :class:`~swkv_teach.model.Decoder` with the same weights (here).
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

__all__ = ["config_from_hf", "from_hf", "hf_cache"]



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
