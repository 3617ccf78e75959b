"""Wrong answers to exercise 05, decode_step(model, input_ids, caches)."""

import torch

from tests.wrong_answers import wrong


def _positions(caches, input_ids, start=None):
    s = caches[0].seen if start is None else start
    return torch.arange(s, s + input_ids.shape[1], device=input_ids.device)


def _run(model, input_ids, caches, positions, window_size=None, use_cache=True, rope_positions=None,
         keys=lambda k, L: k):
    x = model.embed(input_ids)
    for L, (layer, cache) in enumerate(zip(model.layers, caches)):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), positions if rope_positions is None else rope_positions)
        kpos = positions
        if use_cache:
            k, v = cache.update(k, v)
            kpos = cache.positions.to(x.device)
        x = x + layer.attn.attend(q, keys(k, L), keys(v, L), positions, kpos, window_size=window_size)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "len(cache)", "caches[0].seen")
def decode_len_positions(model, input_ids, caches):
    """RoPE (and query) positions from len(cache): right until the window is full."""
    return _run(model, input_ids, caches, _positions(caches, input_ids, start=len(caches[0])))


@wrong("check_cached_decode", "outside the window")
def decode_ignores_window(model, input_ids, caches):
    """Masks causally only (a huge window): a prompt chunk's queries see keys outside the window."""
    return _run(model, input_ids, caches, _positions(caches, input_ids), window_size=10**6)


@wrong("check_cached_decode", "never updated", "caches[0].seen")
def decode_without_cache(model, input_ids, caches):
    """Forgets the caches: every call starts at position 0 and sees only its own tokens."""
    pos = torch.arange(input_ids.shape[1], device=input_ids.device)
    return _run(model, input_ids, caches, pos, use_cache=False)


@wrong("check_cached_decode", "one row of logits per new token")
def decode_last_only(model, input_ids, caches):
    """Returns only the last token's logits (B, vocab)."""
    return _run(model, input_ids, caches, _positions(caches, input_ids))[:, -1]


@wrong("check_cached_decode", "model.step")
def decode_calls_step(model, input_ids, caches):
    """Calls the library's finished answer instead of the parts."""
    return model.step(input_ids, caches)


@wrong("check_cached_decode", "not implemented yet")
def decode_stub(model, input_ids, caches):
    """The exercise as generated: the stub."""
    raise NotImplementedError("exercise 05: replace these two lines with your code")


# ---------------------------------------------------------------- issue 10: each misses by >= 10x the tolerance
@wrong("check_cached_decode", "recomputed inside the layer loop")
def decode_positions_in_loop(model, input_ids, caches):
    """Recomputes positions from caches[0].seen inside the layer loop: layer 1 sees them shifted by c."""
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        pos = _positions(caches, input_ids)
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, pos, cache.positions.to(x.device))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "kv heads tiled wrongly", "repeat_interleave")
def decode_tiles_kv_heads(model, input_ids, caches):
    """Expands the key/value heads with .repeat (h, h + n_kv, ...) instead of grouping them."""
    g = model.config.n_heads // model.config.n_kv_heads
    return _run(model, input_ids, caches, _positions(caches, input_ids), keys=lambda t, L: t.repeat(1, g, 1, 1))


@wrong("check_cached_decode", "no rope offset")
def decode_rope_from_zero(model, input_ids, caches):
    """Caches and masks right, but rotates the new tokens at positions 0..c-1 in every call."""
    pos = _positions(caches, input_ids)
    return _run(model, input_ids, caches, pos, rope_positions=torch.arange(input_ids.shape[1]))


@wrong("check_cached_decode", "cut", "all c new keys")
def decode_truncates_chunk(model, input_ids, caches):
    """Caches only the chunk's last W keys ('the cache only needs W'): the chunk's first queries lose theirs."""
    W = model.config.window_size
    pos = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k[:, :, -W:], v[:, :, -W:])
        x = x + layer.attn.attend(q, k, v, pos, cache.positions.to(x.device))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "one norm shared by attention and mlp")
def decode_shares_attn_norm(model, input_ids, caches):
    """Uses layer.attn_norm before the MLP too (one norm for both sub-layers)."""
    pos = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, pos, cache.positions.to(x.device))
        x = x + layer.mlp(layer.attn_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "mlp_norm", "weight")
def decode_drops_norm_weight(model, input_ids, caches):
    """Normalises before the MLP by hand (x / rms(x)), dropping mlp_norm's weight."""
    pos = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, pos, cache.positions.to(x.device))
        x = x + layer.mlp(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "before cache.update", "previous call")
def decode_positions_before_update(model, input_ids, caches):
    """Reads cache.positions before cache.update: the keys' positions of the previous call."""
    pos = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        kpos = cache.positions.to(x.device)
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, pos, kpos)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "model.norm was not applied")
def decode_skips_final_norm(model, input_ids, caches):
    """Forgets the final norm: lm_head(x)."""
    pos = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, pos, cache.positions.to(x.device))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(x)


@wrong("check_cached_decode", "entering layer 1", "layer 0")
def decode_mlp_without_residual(model, input_ids, caches):
    """x = layer.mlp(...) instead of x = x + layer.mlp(...): no bug the watcher names; it says where it differs."""
    pos = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, pos, cache.positions.to(x.device))
        x = layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


def _layers(model, input_ids, caches, attn_in=lambda layer: layer.attn_norm, mlp_in=lambda layer: layer.mlp_norm,
            kpos=None, dtype=None, final=lambda model, x: model.norm(x), residual_from_norm=False):
    start = caches[0].seen
    pos = torch.arange(start, start + input_ids.shape[1], device=input_ids.device, dtype=dtype)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        h = attn_in(layer)(x)
        q, k, v = layer.attn.qkv(h, pos)
        k, v = cache.update(k, v)
        x = (h if residual_from_norm else x) + layer.attn.attend(q, k, v, pos, cache.positions if kpos is None else pos)
        x = x + layer.mlp(mlp_in(layer)(x))
    return model.lm_head(final(model, x))


@wrong("check_cached_decode", "k_positions", "cache.positions")
def decode_new_positions_as_key_positions(model, input_ids, caches):
    """Passes the new tokens' positions as k_positions: one position per new token, not per cached key."""
    return _layers(model, input_ids, caches, kpos="new")


@wrong("check_cached_decode", "integer tensor")
def decode_float_positions(model, input_ids, caches):
    """torch.arange(..., dtype=torch.float32) positions: RoPE takes them, the window mask refuses them."""
    return _layers(model, input_ids, caches, dtype=torch.float32)


@wrong("check_cached_decode", "attention's input with mlp_norm")
def decode_swaps_the_norms(model, input_ids, caches):
    """mlp_norm before attention and attn_norm before the MLP."""
    return _layers(model, input_ids, caches, attn_in=lambda layer: layer.mlp_norm, mlp_in=lambda layer: layer.attn_norm)


@wrong("check_cached_decode", "entering each layer match", "from the end")
def decode_final_norm_twice(model, input_ids, caches):
    """Applies model.norm twice before lm_head: every layer right, the end wrong."""
    return _layers(model, input_ids, caches, final=lambda model, x: model.norm(model.norm(x)))


@wrong("check_cached_decode", "entering layer 1", "residual")
def decode_residual_from_the_normed_input(model, input_ids, caches):
    """x = attn_norm(x) + attention(...): the residual starts from the normalised input."""
    return _layers(model, input_ids, caches, residual_from_norm=True)


@wrong("check_cached_decode", "never updated its own cache", "zip(model.layers, caches)")
def decode_first_cache_for_every_layer(model, input_ids, caches):
    """Uses caches[0] in every layer: layer 1's keys land in layer 0's cache."""
    start = caches[0].seen
    pos = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    x = model.embed(input_ids)
    for layer in model.layers:
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = caches[0].update(k, v)
        x = x + layer.attn.attend(q, k, v, pos, caches[0].positions)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "model.forward", "through the caches")
def decode_reruns_model_on_the_prefix(model, input_ids, caches):
    """Keeps every token id on the caches list and reruns model(...) over the whole prefix: no KV cache at all."""
    caches.ids = input_ids if not hasattr(caches, "ids") else torch.cat([caches.ids, input_ids], dim=1)
    return model(caches.ids)[:, -input_ids.shape[1] :]


@wrong("check_cached_decode", "never updated in this call", "o(t^2)", "reruns the whole prefix")
def decode_reruns_layers_on_the_prefix(model, input_ids, caches):
    """Reruns every layer without its cache over the whole prefix: right logits, quadratic cost, caches unused."""
    caches.ids = input_ids if not hasattr(caches, "ids") else torch.cat([caches.ids, input_ids], dim=1)
    pos = torch.arange(caches.ids.shape[1], device=input_ids.device)
    x = model.embed(caches.ids)
    for layer in model.layers:
        x = layer(x, pos)
    return model.lm_head(model.norm(x))[:, -input_ids.shape[1] :]


# ---------------------------------------------------------------- red team, round 2: the class, the keys, their order
@wrong("check_cached_decode", "type(model).forward")
def decode_class_forward_on_the_prefix(model, input_ids, caches):
    """Reruns the oracle through the class, type(model).forward(model, ids), with dummy zero cache updates."""
    caches.ids = input_ids if caches[0].seen == 0 else torch.cat([caches.ids, input_ids], dim=1)
    d = model.config
    for cache in caches:
        z = torch.zeros(input_ids.shape[0], d.n_kv_heads, input_ids.shape[1], d.head_dim, device=input_ids.device)
        cache.update(z, z)
    return type(model).forward(model, caches.ids)[:, -input_ids.shape[1] :]


@wrong("check_cached_decode", "type(model).step")
def decode_class_step(model, input_ids, caches):
    """Calls the library's finished answer through the class: type(model).step(model, ids, caches)."""
    return type(model).step(model, input_ids, caches)


@wrong("check_cached_decode", "was handed keys", "all zeros", "not for the right reason")
def decode_layers_on_the_prefix_with_dummy_updates(model, input_ids, caches):
    """Reruns every layer without a cache over the whole prefix and feeds the caches zeros to look cached."""
    caches.ids = input_ids if caches[0].seen == 0 else torch.cat([caches.ids, input_ids], dim=1)
    d = model.config
    for cache in caches:
        z = torch.zeros(input_ids.shape[0], d.n_kv_heads, input_ids.shape[1], d.head_dim, device=input_ids.device)
        cache.update(z, z)
    pos = torch.arange(caches.ids.shape[1], device=input_ids.device)
    x = model.embed(caches.ids)
    for layer in model.layers:
        x = layer(x, pos)
    return model.lm_head(model.norm(x))[:, -input_ids.shape[1] :]


def _kpos(model, input_ids, caches, kpos):
    pos = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), pos)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, pos, kpos(cache, pos, k))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "built by hand", "torch.arange(end - n, end)", "[3, 1, 2]")
def decode_key_positions_by_arange(model, input_ids, caches):
    """k_positions = torch.arange(end - n, end): assumes the keys come back chronologically (a wrapped ring's don't)."""
    def kpos(cache, pos, k):
        end = int(pos[-1]) + 1
        return torch.arange(end - k.shape[2], end, device=k.device)

    return _kpos(model, input_ids, caches, kpos)


@wrong("check_cached_decode", "sorted chronologically", "[3, 1, 2]", "cache.positions as it is")
def decode_key_positions_sorted(model, input_ids, caches):
    """k_positions = sorted(cache.positions): the right set, but a wrapped ring returns its keys in slot order."""
    return _kpos(model, input_ids, caches, lambda cache, pos, k: torch.sort(cache.positions).values.to(k.device))


@wrong("check_cached_decode", "cache.positions read before the update", "[3]", "[4]", "caches[0].seen")
def decode_start_after_last_position(model, input_ids, caches):
    """Next position = cache.positions[-1] + 1: in slot order the last entry is not the newest after a wrap."""
    start = int(caches[0].positions[-1]) + 1 if caches[0].seen else 0
    return _run(model, input_ids, caches, _positions(caches, input_ids, start=start))


# ---------------------------------------------------------------- issue 18: holes and true diagnoses


@wrong("check_cached_decode", "post-norm", "attn_norm(x)")
def decode_post_norm(model, input_ids, caches):
    """Post-norm blocks: x = norm(x + attn(x)), as in the original Transformer, not pre-norm."""
    positions = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(x, positions)
        k, v = cache.update(k, v)
        x = layer.attn_norm(x + layer.attn.attend(q, k, v, positions, cache.positions.to(x.device)))
        x = layer.mlp_norm(x + layer.mlp(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "cache.positions", "caches[0].seen")
def decode_start_from_numel(model, input_ids, caches):
    """Start position from caches[0].positions.numel(), the keys stored: stops growing once the window is full."""
    return _run(model, input_ids, caches, _positions(caches, input_ids, start=caches[0].positions.numel()))


@wrong("check_cached_decode", "numel()", "input_ids.shape[1]")
def decode_positions_from_input_numel(model, input_ids, caches):
    """c = input_ids.numel() (batch * tokens), not input_ids.shape[1]."""
    s = caches[0].seen
    return _run(model, input_ids, caches, torch.arange(s, s + input_ids.numel(), device=input_ids.device))


# ---------------------------------------------------------------- issue 18: written as a learner would, unseen


@wrong("check_cached_decode", "new key(s) it gave cache.update", "not over what update returned")
def decode_attends_new_keys_only(model, input_ids, caches):
    """Updates the caches but attends over the new keys only (ignores what update returns)."""
    positions = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), positions)
        cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, positions, positions)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "k_positions [0, 1, 2]", "pass cache.positions")
def decode_mask_from_len(model, input_ids, caches):
    """k_positions built as arange(len(cache)) after the update (keys numbered from 0)."""
    positions = _positions(caches, input_ids)
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), positions)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, positions, torch.arange(k.shape[2]))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "logits are right here", "dtype float32", "integer tensor")
def decode_float_rope_positions(model, input_ids, caches):
    """Float positions handed to qkv only (RoPE, which rotates them as it does integers), integer ones to attend:
    right logits, but the table asks for an integer tensor, and float32 rounds positions past 2**24."""
    pos = _positions(caches, input_ids)
    return _run(model, input_ids, caches, pos, rope_positions=pos.float())
