"""The shipped checkpoints: two small character-level :class:`~swkv_teach.model.Decoder` s trained on Python's stdlib.

``load_pretrained()`` returns ``(decoder, tokenizer)`` from ``swkv_teach/data/``;
nothing is downloaded. Two checkpoints ship, the same recipe with two masks:

* ``name="window"`` (the default): sliding-window attention, ``W = 64``;
  ``data/char_decoder.json`` says how it was made (corpus files, Python and
  torch versions, steps, seed, losses); ``python -m swkv_teach.train`` makes it again.
* ``name="full"``: full causal attention over its whole training sequence
  (its ``window_size`` is that context); ``data/char_decoder_full.json``;
  ``python -m swkv_teach.train --attention full`` makes it again. Attention-aware
  eviction (H2O, TOVA) and attention sinks are about models like this one.

The tokenizer's vocabulary is fixed (tab, newline, printable ASCII and one
unknown character), so it does not depend on the corpus it met.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch

from swkv_teach.model import Decoder, DecoderConfig

__all__ = ["CHECKPOINT", "CHECKPOINTS", "METADATA", "CharTokenizer", "load_checkpoint", "load_pretrained"]

CHECKPOINT = "char_decoder.pt"
METADATA = "char_decoder.json"
CHECKPOINTS = {  # name -> (weights file, metadata file)
    "window": (CHECKPOINT, METADATA),
    "full": ("char_decoder_full.pt", "char_decoder_full.json"),
}


class CharTokenizer:
    """One token per character: ``"\\t"``, ``"\\n"``, the 95 printable ASCII characters, and an unknown.

    Any other character encodes to :attr:`unk_id` and decodes as ``"\\ufffd"``.

        >>> tok = CharTokenizer()
        >>> tok.decode(tok.encode("def f(x):\\n"))
        'def f(x):\\n'
    """

    UNKNOWN = "\ufffd"

    def __init__(self):
        self.chars = "\t\n" + "".join(chr(c) for c in range(32, 127)) + self.UNKNOWN
        self.unk_id = len(self.chars) - 1
        self._ids = {ch: i for i, ch in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        return [self._ids.get(ch, self.unk_id) for ch in text]

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        try:
            return "".join(self.chars[i] for i in ids)
        except IndexError:
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            raise ValueError(f"token ids must be in [0, {self.vocab_size}); got {bad[:5]}") from None

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def _data_dir() -> Path:
    return Path(str(resources.files("swkv_teach") / "data"))


def _files(name: str) -> tuple[str, str]:
    if not isinstance(name, str) or name not in CHECKPOINTS:
        raise ValueError(f"name must be one of {sorted(CHECKPOINTS)}; got {name!r}")
    return CHECKPOINTS[name]


def load_checkpoint(directory: str | Path | None = None, name: str = "window") -> tuple[dict, dict]:
    """``(state_dict, metadata)`` of checkpoint ``name`` from ``directory`` (default: the shipped ``swkv_teach/data/``)."""
    checkpoint, metadata_file = _files(name)
    directory = _data_dir() if directory is None else Path(directory)
    pt, meta = directory / checkpoint, directory / metadata_file
    for path in (pt, meta):
        if not path.is_file():
            raise FileNotFoundError(
                f"checkpoint file {path} is missing; run "
                f"`python -m swkv_teach.train --attention {name} --out {directory}`"
            )
    metadata = json.loads(meta.read_text())
    state = torch.load(pt, map_location="cpu", weights_only=True)
    return state, metadata


def load_pretrained(
    device="cpu", directory: str | Path | None = None, name: str = "window"
) -> tuple[Decoder, CharTokenizer]:
    """The trained decoder (on ``device``, eval mode, float32) and its tokenizer.

    Args:
        device: where to put the decoder (``swkv_teach.device()`` picks the best).
        directory: a folder written by ``python -m swkv_teach.train --out``; default the shipped one.
        name: ``"window"`` (sliding window W = 64, the default) or ``"full"`` (full causal
            attention over its training context).
    """
    state, metadata = load_checkpoint(directory, name)
    decoder = Decoder(DecoderConfig(**metadata["config"]))
    decoder.load_state_dict({k: v.float() for k, v in state.items()})
    tokenizer = CharTokenizer()
    if tokenizer.vocab_size != decoder.config.vocab_size:
        raise ValueError(
            f"checkpoint vocab_size={decoder.config.vocab_size} does not match the tokenizer's {tokenizer.vocab_size}"
        )
    return decoder.to(device=torch.device(device), dtype=torch.float32).eval(), tokenizer
