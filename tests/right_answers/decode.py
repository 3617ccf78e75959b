"""Right answers to exercise 05, decode_step(model, input_ids, caches)."""

import torch

from tests.right_answers import right


@right("check_cached_decode")
def decode_layer_major(model, input_ids, caches):
    """The solution's style: all new tokens through layer 0, then layer 1, ..."""
    start = caches[0].seen
    positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), positions)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, positions, cache.positions.to(x.device))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@right("check_cached_decode")
def decode_with_block_forward(model, input_ids, caches):
    """Uses each Block's own forward with the cache (a right answer from the parts one level up)."""
    start = caches[0].seen
    pos = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        x = layer(x, pos, cache)
    return model.lm_head(model.norm(x))


@right("check_cached_decode")
def decode_token_by_token(model, input_ids, caches):
    """A chunk fed one token at a time through every layer (token-major), logits concatenated."""
    out = []
    for t in range(input_ids.shape[1]):
        p = torch.tensor([caches[0].seen], device=input_ids.device)
        x = model.embed(input_ids[:, t : t + 1])
        for layer, cache in zip(model.layers, caches):
            q, k, v = layer.attn.qkv(layer.attn_norm(x), p)
            k, v = cache.update(k, v)
            x = x + layer.attn.attend(q, k, v, p, cache.positions.to(x.device))
            x = x + layer.mlp(layer.mlp_norm(x))
        out.append(model.lm_head(model.norm(x)))
    return torch.cat(out, dim=1)


@right("check_cached_decode")
@torch.inference_mode()
def decode_in_inference_mode(model, input_ids, caches):
    """Decorated with @torch.inference_mode(); positions computed on the CPU and the window passed explicitly."""
    start = caches[0].seen
    positions = torch.arange(start, start + input_ids.shape[1])
    x = model.embed(input_ids)
    W = model.config.window_size
    for layer, cache in zip(model.layers, caches):
        h = layer.attn_norm(x)
        q, k, v = layer.attn.qkv(h, positions.to(x.device))
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, positions, cache.positions, window_size=W)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@right("check_cached_decode")
def decode_tiles_kv_heads_correctly(model, input_ids, caches):
    """Expands the key/value heads itself, the grouped-query way (repeat_interleave), before attend."""
    start = caches[0].seen
    positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    g = model.config.n_heads // model.config.n_kv_heads
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), positions)
        k, v = cache.update(k, v)
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        x = x + layer.attn.attend(q, k, v, positions, cache.positions.to(x.device))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@right("check_cached_decode")
def decode_sorts_keys_with_their_positions(model, input_ids, caches):
    """Sorts each cache's keys, values and positions together, chronologically: consistent, so right."""
    start = caches[0].seen
    pos = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k, v)
        kpos = cache.positions.to(x.device)
        order = torch.argsort(kpos)
        x = x + layer.attn.attend(q, k[:, :, order], v[:, :, order], pos, kpos[order])
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@right("check_cached_decode")
def decode_pairs_layers_with_caches_reversed(model, input_ids, caches):
    """Layer i always uses cache n - 1 - i: every layer still has its own cache, so the logits are the same."""
    start = caches[0].seen
    pos = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, list(caches)[::-1]):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, pos, cache.positions.to(x.device))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))
