"""Right answers to exercise 14, written differently: each holds accept, speculative_caches and verify.

The acceptance rules differ in how they draw (a uniform per draft compared with a division or a product, all
uniforms drawn up front, a draw from p compared with the draft as transformers does for one-hot drafts, inverse-CDF
sampling, the Gumbel-max trick, float64 arithmetic) and so consume the generator differently: the check must judge
only the distribution. The verifies differ in how they count (a loop, a cumulative product), how they feed (ids by
torch.cat, a forward written from the model's parts as in exercise 05) and how much lookahead the rings get.
"""

import torch

from swkv_teach.caches import RingBufferKVCache
from swkv_teach.model import LayerCaches
from tests.right_answers import right

CHECK = "check_speculative_decoding"


# ------------------------------------------------------------------ the verifies and caches
def loop_caches(model, k):
    W = model.config.window_size
    return LayerCaches([RingBufferKVCache(W, lookahead=k) for _ in model.layers], W)


def roomy_caches(model, k):
    """Two more lookahead slots than needed, in a plain list (model.step takes the config's window)."""
    return [RingBufferKVCache(model.config.window_size, lookahead=k + 2) for _ in range(model.config.n_layers)]


def loop_verify(model, caches, pending, drafts):
    ids = torch.tensor([[pending] + list(drafts)], device=next(model.parameters()).device)
    best = model.step(ids, caches)[0].argmax(dim=-1).tolist()
    a = 0
    while a < len(drafts) and best[a] == drafts[a]:
        a += 1
    for cache in caches:
        cache.rollback(len(drafts) - a)
    return a, best[a]


def cumprod_verify(model, caches, pending, drafts):
    """Vectorised: the agreeing prefix by a cumulative product; ids built with torch.cat; rollback skipped at 0."""
    dev = model.lm_head.weight.device
    ids = torch.cat([torch.tensor([pending], device=dev), torch.tensor(drafts, dtype=torch.long, device=dev)])
    best = model.step(ids[None], caches)[0].argmax(-1)  # (m + 1,)
    agree = best[:-1] == ids[1:]
    a = int(agree.long().cumprod(0).sum())
    rejected = len(drafts) - a
    if rejected:
        for cache in caches:
            cache.rollback(rejected)
    return a, int(best[a])


@torch.inference_mode()
def parts_verify(model, caches, pending, drafts):
    """The forward written from the model's parts, as exercise 05's decode step: still one pass per layer."""
    dev = next(model.parameters()).device
    ids = torch.tensor([[pending, *drafts]], device=dev)
    start = caches[0].seen
    positions = torch.arange(start, start + ids.shape[1], device=dev)
    x = model.embed(ids)
    for layer, cache in zip(model.layers, caches):
        q, k, v = layer.attn.qkv(layer.attn_norm(x), positions)
        k, v = cache.update(k, v)
        x = x + layer.attn.attend(q, k, v, positions, cache.positions.to(dev))
        x = x + layer.mlp(layer.mlp_norm(x))
    best = model.lm_head(model.norm(x))[0].argmax(-1).tolist()
    a = next((i for i, (d, b) in enumerate(zip(drafts, best)) if d != b), len(drafts))
    for cache in caches:
        cache.rollback(len(drafts) - a)
    return a, best[a]


# ------------------------------------------------------------------ the acceptance rules
def _residual(p, q, i, d):
    if q is None:
        r = p[i].clone()
        r[d] = 0
        return r
    return torch.clamp(p[i] - q[i], min=0)


@right(CHECK)
class DivisionLoop:
    """The statement's loop: u < p/q, multinomial on the unnormalised residual."""

    speculative_caches = staticmethod(loop_caches)
    verify = staticmethod(loop_verify)

    @staticmethod
    def accept(p, drafts, q, generator):
        for i, d in enumerate(drafts):
            q_d = 1.0 if q is None else q[i, d].item()
            if torch.rand(1, generator=generator).item() < p[i, d].item() / q_d:
                continue
            return i, torch.multinomial(_residual(p, q, i, d), 1, generator=generator).item()
        return len(drafts), torch.multinomial(p[len(drafts)], 1, generator=generator).item()


@right(CHECK)
class UniformsUpFront:
    """Vectorised: all m uniforms drawn first, the first rejection found with a cumulative product."""

    speculative_caches = staticmethod(roomy_caches)
    verify = staticmethod(cumprod_verify)

    @staticmethod
    def accept(p, drafts, q, generator):
        m = len(drafts)
        if m:
            d = torch.tensor(drafts)
            p_d = p[torch.arange(m), d]
            q_d = torch.ones(m, dtype=p.dtype) if q is None else q[torch.arange(m), d]
            u = torch.rand(m, generator=generator, dtype=p.dtype)
            kept = (u * q_d < p_d).long().cumprod(0)
            a = int(kept.sum())
        else:
            a = 0
        if a == m:
            return m, int(torch.multinomial(p[m], 1, generator=generator))
        return a, int(torch.multinomial(_residual(p, q, a, drafts[a]), 1, generator=generator))


@right(CHECK)
class SampleAndCompare:
    """One-hot drafts as transformers treats them: draw t from p[i]; keep the draft iff t equals it, else emit t
    (the same law: kept with probability p(d), otherwise t follows p without d). Sampling drafters: the ratio."""

    speculative_caches = staticmethod(loop_caches)
    verify = staticmethod(parts_verify)

    @staticmethod
    def accept(p, drafts, q, generator):
        for i, d in enumerate(drafts):
            if q is None:
                t = int(torch.multinomial(p[i], 1, generator=generator))
                if t == d:
                    continue
                return i, t
            if float(torch.rand((), generator=generator)) * float(q[i, d]) < float(p[i, d]):
                continue
            return i, int(torch.multinomial(_residual(p, q, i, d), 1, generator=generator))
        return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def _inverse_cdf(row, generator):
    c = torch.cumsum(row.double(), 0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * c[-1]
    return int(torch.searchsorted(c, u, right=True).clamp(max=len(row) - 1))


@right(CHECK)
class InverseCdfFloat64:
    """float64 throughout; tokens by inverse-CDF (searchsorted on a cumulative sum), recursion over the drafts."""

    speculative_caches = staticmethod(loop_caches)
    verify = staticmethod(loop_verify)

    @staticmethod
    def accept(p, drafts, q, generator, i=0):
        p64 = p.double()
        if i == len(drafts):
            return i, _inverse_cdf(p64[i], generator)
        d = drafts[i]
        ratio = p64[i, d] / (1.0 if q is None else q.double()[i, d])
        if torch.rand((), generator=generator, dtype=torch.float64) < ratio:
            return InverseCdfFloat64.accept(p, drafts, q, generator, i + 1)
        # tokens of probability 0 are never drawn: searchsorted(right=True) lands past runs of equal cumulative sums
        return i, _inverse_cdf(_residual(p64, None if q is None else q.double(), i, d), generator)


def _gumbel_max(row, generator):
    g = -torch.log(-torch.log(torch.rand(row.shape, generator=generator, dtype=torch.float64).clamp_min(1e-300)))
    scores = torch.log(row.double()) + g  # log 0 = -inf: a token of probability 0 never wins
    return int(scores.argmax())


@right(CHECK)
class GumbelMax:
    """Tokens by the Gumbel-max trick (argmax of log p + Gumbel noise), the acceptance as a product u * q < p."""

    speculative_caches = staticmethod(loop_caches)
    verify = staticmethod(cumprod_verify)

    @staticmethod
    def accept(p, drafts, q, generator):
        a = 0
        for i, d in enumerate(drafts):
            u = torch.rand((), generator=generator)
            if u * (1.0 if q is None else q[i, d]) >= p[i, d]:
                return a, _gumbel_max(_residual(p, q, i, d), generator)
            a += 1
        return a, _gumbel_max(p[a], generator)
