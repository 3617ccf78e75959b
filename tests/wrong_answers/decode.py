"""Wrong answers to exercise 06, decode_step(model, input_ids, caches)."""

import torch

from tests.wrong_answers import wrong


def _run(model, input_ids, caches, positions, window_size=None, use_cache=True):
    x = model.embed(input_ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), positions)
        kpos = positions
        if use_cache:
            k, v = cache.update(k, v)
            kpos = cache.positions.to(x.device)
        x = x + layer.attn.attend(q, k, v, positions, kpos, window_size=window_size)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))


@wrong("check_cached_decode", "len(cache)", "cache.seen")
def decode_len_positions(model, input_ids, caches):
    """RoPE (and query) positions from len(cache): right until the window is full."""
    start = len(caches[0])
    return _run(model, input_ids, caches, torch.arange(start, start + input_ids.shape[1], device=input_ids.device))


@wrong("check_cached_decode", "outside the window")
def decode_ignores_window(model, input_ids, caches):
    """Masks causally only (a huge window): a prompt chunk's queries see keys outside the window."""
    start = caches[0].seen
    pos = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    return _run(model, input_ids, caches, pos, window_size=10**6)


@wrong("check_cached_decode", "start of the sequence")
def decode_without_cache(model, input_ids, caches):
    """Forgets the caches: every call starts at position 0 and sees only its own tokens."""
    pos = torch.arange(input_ids.shape[1], device=input_ids.device)
    return _run(model, input_ids, caches, pos, use_cache=False)


@wrong("check_cached_decode", "one row of logits per new token")
def decode_last_only(model, input_ids, caches):
    """Returns only the last token's logits (B, vocab)."""
    start = caches[0].seen
    pos = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    return _run(model, input_ids, caches, pos)[:, -1]


@wrong("check_cached_decode", "model.step")
def decode_calls_step(model, input_ids, caches):
    """Calls the library's finished answer instead of the parts."""
    return model.step(input_ids, caches)


@wrong("check_cached_decode", "not implemented yet")
def decode_stub(model, input_ids, caches):
    """The exercise as generated: the stub."""
    raise NotImplementedError("exercise 06: replace these two lines with your code")
