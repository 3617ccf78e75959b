"""Exercise 13's check beyond the catalogue: a salted hash written in a notebook (rebuilt from its cell's source in
a second process), and the solution's stored outputs. The catalogue itself runs in tests/test_grading.py."""

from __future__ import annotations

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
