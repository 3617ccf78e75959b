"""One cache per layer of a decoder: :class:`LayerCaches`, a list of caches plus the mask rule they were made for.

Below :mod:`swkv_teach.model` (which builds them in ``new_caches``) and :mod:`swkv_teach.compiled_ring` (whose ring
buffers they wrap): it knows caches only through their interface and nothing of models.
"""

from __future__ import annotations

from swkv_teach.caches._state import load_many, sum_stats

__all__ = ["LayerCaches"]


class LayerCaches(list):
    """One :class:`~swkv_teach.caches.KVCache` per layer, plus the mask rule they were made for.

    A plain list would do for the caches; the two attributes save ``step``
    from asking again which window and how many sinks to mask with.
    """

    def __init__(self, caches, window_size: int, num_sinks: int = 0):
        super().__init__(caches)
        self.window_size = window_size
        self.num_sinks = num_sinks

    def stats(self) -> dict:
        """Every layer's :meth:`~swkv_teach.caches.KVCache.stats` summed, each layer's own dict under ``"layers"``."""
        return sum_stats([cache.stats() for cache in self])

    def state_dict(self) -> dict:
        """``{"kind": "LayerCaches", "window_size", "num_sinks", "layers": [each cache's state_dict()]}``.

        Plain tensors and Python values: ``torch.save`` it, ``torch.load(path, weights_only=True)``
        it, and :meth:`load_state_dict` into ``decoder.new_caches(kind)`` continues bit for bit.
        """
        return {"kind": "LayerCaches", "window_size": self.window_size, "num_sinks": self.num_sinks,
                "layers": [cache.state_dict() for cache in self]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load every layer's state, all or nothing: every layer is checked before any changes.

        Raises ``ValueError`` naming what differs (layer count, window, sinks, a layer's
        kind, settings or layout) and leaves every cache as it was.
        """
        if not isinstance(state_dict, dict) or state_dict.get("kind") != "LayerCaches":
            got = state_dict.get("kind") if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"kind differs: expected a LayerCaches state (LayerCaches.state_dict()); got {got!r}")
        layers = state_dict.get("layers")
        if not isinstance(layers, list):
            raise ValueError(f"LayerCaches: state['layers'] must be a list of cache states; got {type(layers).__name__}")

        def check_mask_rule():  # after the layers' checks, so a state of another kind says so first
            differs = [f"{k} is {state_dict.get(k)!r} in the state but {getattr(self, k)!r} here"
                       for k in ("window_size", "num_sinks") if state_dict.get(k) != getattr(self, k)]
            if differs:
                raise ValueError("LayerCaches: " + "; ".join(differs))

        load_many(self, layers, check_mask_rule)
