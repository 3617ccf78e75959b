"""The second checkpoint, name="full": full causal attention over its training context, same recipe as "window"."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import swkv_teach
from swkv_teach.pretrained import CHECKPOINTS, load_checkpoint, load_pretrained

DATA = Path(swkv_teach.__file__).parent / "data"
REQUIRED = ("name", "config", "tokenizer", "corpus", "python", "torch", "steps", "batch_size", "context", "lr",
            "seed", "threads", "train_seconds", "final_train_loss", "heldout_loss", "uniform_loss", "parameters")


@pytest.fixture(scope="module")
def full():
    return load_pretrained(name="full")


@pytest.fixture(scope="module")
def metadata():
    return json.loads((DATA / CHECKPOINTS["full"][1]).read_text())


def test_default_is_still_the_windowed_checkpoint():
    decoder, _ = load_pretrained()
    assert decoder.config.window_size == 64
    assert torch.equal(decoder.lm_head.weight, load_pretrained(name="window")[0].lm_head.weight)


def test_full_checkpoint_sees_its_whole_training_sequence(full, metadata):
    decoder, tok = full
    assert not decoder.training and decoder.config.vocab_size == tok.vocab_size
    assert metadata["name"] == "full"
    assert decoder.config.window_size == metadata["context"] >= 256  # a window as wide as every training sequence


def test_same_recipe_as_the_windowed_one_but_the_mask(metadata):
    window = json.loads((DATA / CHECKPOINTS["window"][1]).read_text())
    for key in ("tokenizer", "seed", "batch_size", "lr", "parameters"):
        assert metadata[key] == window[key], key
    assert metadata["corpus"] == window["corpus"]
    differ = {k for k in window["config"] if window["config"][k] != metadata["config"][k]}
    assert differ == {"window_size"}, f"the two checkpoints should differ in the mask only; also differ: {differ}"


def test_metadata_is_complete_and_files_are_small(metadata):
    missing = [k for k in REQUIRED if k not in metadata]
    assert not missing, f"metadata lacks {missing}"
    assert metadata["steps"] > 0 and metadata["train_seconds"] > 0 and metadata["seed"] == 0
    assert metadata["corpus"]["heldout_files"] and metadata["corpus"]["stdlib_files"]
    for name in CHECKPOINTS["full"]:
        size = (DATA / name).stat().st_size
        assert size < 2 * 1024 * 1024, f"{name} is {size / 1e6:.2f} MB; each shipped file stays under 2 MB"


def test_trained_and_the_recorded_heldout_loss_is_its_own(full, metadata):
    """Recompute the held-out loss the way train.py did: it must match the metadata (these weights, that run)."""
    from swkv_teach.train import HELDOUT_FILES, evaluate, read_stdlib

    decoder, tok = full
    try:
        text, files = read_stdlib(HELDOUT_FILES)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    if files != metadata["corpus"]["heldout_files"]:
        pytest.skip(f"this Python's held-out files {files} differ from the run's")
    loss = evaluate(decoder, torch.tensor(tok.encode(text)), metadata["context"])
    assert loss < math.log(tok.vocab_size) - 2.0
    assert abs(loss - metadata["heldout_loss"]) < 0.01, f"recomputed {loss:.4f}, recorded {metadata['heldout_loss']}"


@pytest.mark.parametrize("T", [37, 256, 300])  # short, exactly the window, past it (the ring then evicts)
def test_cached_scoring_equals_the_full_forward(full, T):
    decoder, tok = full
    text = "import os\n\n\ndef walk(top, topdown=True):\n    for name in os.listdir(top):\n" * 8
    ids = torch.tensor([tok.encode(text[:T])])
    with torch.no_grad():
        expected = decoder(ids)
    torch.testing.assert_close(decoder.score(ids, "ring"), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(decoder.score(ids, "ring", chunk_size=16), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["Full", "", None, "full ", "dense"])
def test_bad_names_are_refused_with_the_choices(name):
    with pytest.raises(ValueError, match=r"name must be one of \['full', 'window'\]"):
        load_pretrained(name=name)
    with pytest.raises(ValueError, match="name must be one of"):
        load_checkpoint(name=name)


def test_a_folder_without_the_full_checkpoint_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="--attention full"):
        load_pretrained(directory=tmp_path, name="full")


def test_train_flag_writes_a_full_attention_checkpoint(tmp_path):
    from swkv_teach.train import main

    argv = ["--attention", "full", "--context", "48", "--steps", "2", "--batch-size", "2", "--eval-batches", "1",
            "--quiet", "--out", str(tmp_path)]
    assert main(argv) == 0
    state, meta = load_checkpoint(tmp_path, name="full")
    assert meta["name"] == "full" and meta["context"] == 48 and meta["config"]["window_size"] == 48
    assert not (tmp_path / CHECKPOINTS["window"][0]).exists()  # the windowed checkpoint's files are left alone
    decoder, tok = load_pretrained(directory=tmp_path, name="full")
    assert decoder.config.window_size == 48


def test_a_windowed_run_refuses_a_context_shorter_than_its_window(tmp_path, capsys):
    from swkv_teach.train import main

    with pytest.raises(SystemExit):
        main(["--context", "32", "--steps", "1", "--quiet", "--out", str(tmp_path)])
    assert "--context must be at least the window 64" in capsys.readouterr().err
