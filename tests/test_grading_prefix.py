"""Exercise 13's check beyond the catalogue: a salted hash written in a notebook (rebuilt from its cell's source in
a second process), and the cells after the answer, run on right answers with other internals. The catalogue itself
runs in tests/test_grading.py."""

from __future__ import annotations

import importlib

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

SALTED = '''
import hashlib, struct
SEED = 7  # a constant the function reads: rebuilt in the other process too

def hash_block_tokens(parent_hash, token_ids):
    return hash((parent_hash, tuple(token_ids), SEED)).to_bytes(8, "little", signed=True)
'''

REST = '''
import importlib
right = importlib.import_module("tests.right_answers.prefix")
def block_hashes(token_ids, block_size):
    out, parent = [], None
    for s in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[s : s + block_size])
        out.append(parent)
    return out
from swkv_teach.grading import check_prefix_cache_lru
check_prefix_cache_lru(hash_block_tokens, block_hashes, right.OrderedDictCache)
'''


@pytest.mark.slow
def test_a_salted_hash_written_in_a_notebook_is_caught_in_a_second_process(tmp_path):
    """The cell's function is not importable: the check rebuilds it from its source (with the constant it reads)
    and runs it under another PYTHONHASHSEED. Everything else about this answer is right."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SALTED), nbformat.v4.new_code_cell(REST)])
    import pathlib

    root = str(pathlib.Path(__file__).resolve().parent.parent)
    nb.cells.insert(0, nbformat.v4.new_code_cell(f"import sys; sys.path.insert(0, {root!r})"))
    with pytest.raises(CellExecutionError) as info:
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": root}}).execute()
    assert "another Python process" in str(info.value) and "salted" in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["LinkedListCache", "TimestampCache"])
def test_the_cells_after_the_answer_run_on_a_right_answer_with_other_internals(answer):
    """Every cell after the learner's answer uses only what the statement specifies: the solution notebook, its
    answer cell replaced by a right answer of tests/right_answers/prefix.py that names its internals its own way
    (no ``free``, no ``ref``), runs to the end. (A cell reading ``cache.free`` failed here.)"""
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    nb = nbformat.read(root / "solutions" / "13_prefix_cache_lru.ipynb", as_version=4)
    (n,) = [i for i, c in enumerate(nb.cells) if c.metadata.get("swkv", {}).get("role") == "answer"]
    nb.cells[n].source = (f"import sys; sys.path.insert(0, {str(root)!r})\n"
                          f"from tests.right_answers.prefix import {answer} as PrefixCache\n"
                          "hash_block_tokens, block_hashes = PrefixCache.hash_block_tokens, PrefixCache.block_hashes")
    assert not hasattr(getattr(importlib.import_module("tests.right_answers.prefix"), answer)(3), "free")
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells[n + 1 :] if c.cell_type == "code" for o in c.outputs)
    assert "✅" in outputs and "the evicted block is the first's tail: True" in outputs, outputs


URANDOM_ROOT = '''
import os, struct
from hashlib import sha256
ROOT = os.urandom(32)  # drawn once per process: a second server draws other bytes

def hash_block_tokens(parent_hash, token_ids):
    ids = list(token_ids)
    return sha256((ROOT if parent_hash is None else parent_hash) + struct.pack(f"<{len(ids)}q", *ids)).digest()
'''

DERIVED_ROOT = '''
import struct
from hashlib import sha256
from struct import pack
NAME = b"first block"
ROOT = sha256(NAME + b"!").digest()  # made from constants: the same bytes in every process

def hash_block_tokens(parent_hash, token_ids):
    ids = list(token_ids)
    return sha256((ROOT if parent_hash is None else parent_hash) + pack(f"<{len(ids)}q", *ids)).digest()
'''


@pytest.mark.slow
@pytest.mark.parametrize("source, caught", [(URANDOM_ROOT, True), (DERIVED_ROOT, False)], ids=["urandom", "derived"])
def test_a_notebook_constant_is_made_again_in_the_second_process_not_copied(source, caught, tmp_path):
    """A first block's parent drawn with os.urandom in a notebook cell differs in another server: the check runs the
    cell's assignment again in the second Python (copying the bytes by value let it pass). A parent made from
    constants, with names imported from hashlib and struct, is rebuilt there and passes."""
    import pathlib

    root = str(pathlib.Path(__file__).resolve().parent.parent)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"import sys; sys.path.insert(0, {root!r})"),
                                         nbformat.v4.new_code_cell(source), nbformat.v4.new_code_cell(REST)])
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": root}})
    if caught:
        with pytest.raises(CellExecutionError) as info:
            client.execute()
        assert "another Python process" in str(info.value) and "os.urandom" in str(info.value), str(info.value)
    else:
        client.execute()
        out = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
        assert "✅" in out and "stably across processes" in out, out
