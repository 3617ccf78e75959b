"""The shipped checkpoint: it loads, it was really trained, and the cache reproduces the no-cache model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import swkv_teach
from swkv_teach.model import Decoder
from swkv_teach.pretrained import CHECKPOINT, METADATA, CharTokenizer, load_pretrained

DATA = Path(swkv_teach.__file__).parent / "data"


@pytest.fixture(scope="module")
def pretrained():
    torch.manual_seed(0)
    return load_pretrained()


@pytest.fixture(scope="module")
def metadata():
    return json.loads((DATA / METADATA).read_text())


def test_load_pretrained_gives_eval_float32_decoder(device):
    decoder, tok = load_pretrained(device=device)
    assert not decoder.training
    assert all(p.dtype == torch.float32 and p.device.type == device.type for p in decoder.parameters())
    assert decoder.config.vocab_size == tok.vocab_size
    assert decoder.config.window_size == 64


def test_checkpoint_is_small(metadata):
    size = sum((DATA / name).stat().st_size for name in (CHECKPOINT, METADATA))
    assert size <= 2 * 1024 * 1024, f"checkpoint is {size / 1e6:.2f} MB; the package ships at most 2 MB"
    assert metadata["steps"] > 0 and metadata["corpus"]["stdlib_files"]


def test_tokenizer_roundtrip_and_unknown():
    tok = CharTokenizer()
    text = 'def f(x):\n\treturn {"a": x ** 2}  # ~`|\\'
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("é") == [tok.unk_id] and tok.decode([tok.unk_id]) == CharTokenizer.UNKNOWN
    assert tok.decode(torch.tensor(tok.encode("abc"))) == "abc"
    with pytest.raises(ValueError, match="token ids must be in"):
        tok.decode([tok.vocab_size])
    with pytest.raises(TypeError, match="text must be a str"):
        tok.encode(b"bytes")


def test_trained_model_beats_uniform_on_heldout_stdlib(pretrained, metadata):
    """A real check that the weights were trained: held-out stdlib files, far below log(vocab) nats per char."""
    from swkv_teach.train import HELDOUT_FILES, evaluate, read_stdlib

    decoder, tok = pretrained
    try:
        text, _ = read_stdlib(HELDOUT_FILES)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    loss = evaluate(decoder, torch.tensor(tok.encode(text)), max_batches=2)
    uniform = math.log(tok.vocab_size)
    print(f"held-out loss {loss:.3f} nats/char (uniform {uniform:.3f}, recorded {metadata['heldout_loss']})")
    assert loss < uniform - 2.0
    untrained = Decoder(decoder.config).eval()
    assert evaluate(untrained, torch.tensor(tok.encode(text)), max_batches=1) > uniform - 0.2


def test_greedy_ring_generation_equals_full_recompute(pretrained):
    """Token for token, for several windows: the ring cache vs forward over the whole sequence so far."""
    decoder, tok = pretrained
    prompt = torch.tensor([tok.encode("import os\n\n\ndef ")])
    n = 150  # > 2 windows of 64 past the prompt
    cached = decoder.generate(prompt, n, cache="ring")
    ids = prompt
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, decoder(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, ids), tok.decode(cached[0]) + "\n---\n" + tok.decode(ids[0])


def test_memory_flat_while_generating(pretrained):
    decoder, tok = pretrained
    caches = decoder.new_caches("ring")
    W = decoder.config.window_size
    x = torch.tensor([tok.encode("class ")])
    sizes = []
    with torch.no_grad():
        decoder.step(x, caches)
        for _ in range(2 * W):
            x = decoder.step(x[:, -1:], caches)[:, -1:].argmax(-1)
            sizes.append(sum(c.nbytes for c in caches))
    assert len(set(sizes[W:])) == 1 and max(sizes) == sizes[-1]


def test_train_smoke(tmp_path):
    """``python -m swkv_teach.train`` end to end in a few steps: a checkpoint load_pretrained accepts, and a plot."""
    from swkv_teach.train import main

    argv = ["--steps", "3", "--batch-size", "2", "--eval-batches", "1", "--quiet"]
    argv += ["--out", str(tmp_path), "--plot", str(tmp_path / "loss.png")]
    assert main(argv) == 0
    meta = json.loads((tmp_path / METADATA).read_text())
    assert meta["steps"] == 3 and meta["seed"] == 0 and meta["python"] and meta["torch"] == torch.__version__
    decoder, tok = load_pretrained(directory=tmp_path)
    assert decoder.generate(torch.tensor([tok.encode("def ")]), 5).shape == (1, 9)
    assert (tmp_path / "loss.png").stat().st_size > 1000


def test_load_pretrained_names_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m swkv_teach.train"):
        load_pretrained(directory=tmp_path)


def test_training_is_reproducible(tmp_path):
    """Same seed, same steps: bit-identical weights (the shipped checkpoint can be made again)."""
    from swkv_teach.pretrained import load_checkpoint
    from swkv_teach.train import main

    states = []
    for run in ("a", "b"):
        argv = ["--steps", "2", "--batch-size", "2", "--eval-batches", "1", "--quiet", "--out", str(tmp_path / run)]
        assert main(argv) == 0
        states.append(load_checkpoint(tmp_path / run)[0])
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
