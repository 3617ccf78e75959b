"""Tensor-parallel decoding under torchrun (CPU, gloo, two processes on loopback), snapshots and resume.

The specification (issue 23): ``torchrun --nproc-per-node 2 -m swkv_teach.distributed`` gives the tokens of
single-process ``Decoder.generate``; each rank holds 1/P of the cache bytes; a world size that does not
divide the KV heads is refused; with ``--snapshot-dir/--snapshot-every`` and ``--fail-at-token`` under
``torchrun --max-restarts 1``, every rank resumes from the last snapshot and the tokens are unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from swkv_teach import Decoder, DecoderConfig, load_pretrained
from swkv_teach.distributed import check_world_size, main, shard_decoder, shard_state

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "class Counter:\n    def __init__(self"
NEW = 30


def config(n_heads=4, n_kv_heads=2):
    return DecoderConfig(vocab_size=20, dim=24, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=6,
                         hidden_dim=16, window_size=5)


# --------------------------------------------------------------------------- the split, in one process
@pytest.mark.parametrize("n_heads,n_kv_heads,world", [(4, 2, 1), (4, 2, 2), (8, 4, 2), (8, 4, 4), (6, 3, 3)])
def test_the_shards_weights_put_back_together_are_the_checkpoint(n_heads, n_kv_heads, world):
    """Rank r's q rows are query heads r*nh/P.., its k and v rows key heads r*nkv/P..; o_proj columns follow q."""
    cfg = config(n_heads, n_kv_heads)
    torch.manual_seed(0)
    state = Decoder(cfg).state_dict()
    hd = cfg.head_dim
    shards = [shard_state(state, cfg, r, world) for r in range(world)]
    w = state["layers.1.attn.qkv_proj.weight"]
    q, k, v = w.split([n_heads * hd, n_kv_heads * hd, n_kv_heads * hd])
    parts = [s["layers.1.attn.qkv_proj.weight"].split([n_heads // world * hd, n_kv_heads // world * hd,
                                                       n_kv_heads // world * hd]) for s in shards]
    assert torch.equal(torch.cat([p[0] for p in parts]), q)
    assert torch.equal(torch.cat([p[1] for p in parts]), k)
    assert torch.equal(torch.cat([p[2] for p in parts]), v)
    o = torch.cat([s["layers.1.attn.o_proj.weight"] for s in shards], dim=1)
    assert torch.equal(o, state["layers.1.attn.o_proj.weight"])
    assert torch.equal(shards[-1]["layers.0.mlp.down_proj.weight"], state["layers.0.mlp.down_proj.weight"])


@pytest.mark.parametrize("world", [1, 2])
def test_partial_attention_outputs_sum_to_the_full_one_and_each_rank_caches_its_heads(world):
    """One layer: the shards' o_proj outputs (not yet reduced) add up to the full layer's; rank r's
    cache holds exactly key heads r*nkv/P .. of the full cache."""
    cfg = config()
    torch.manual_seed(1)
    full = Decoder(cfg).eval()
    shards = [shard_decoder(full, r, world, reduce=lambda y: None) for r in range(world)]
    x = torch.randn(1, 7, cfg.dim)
    pos = torch.arange(7)
    whole_cache = full.new_caches("ring")
    q, k, v = full.layers[0].attn.qkv(x, pos)
    k_all, v_all = whole_cache[0].update(k, v)
    expected = full.layers[0].attn.attend(q, k_all, v_all, pos, whole_cache[0].positions)
    total = torch.zeros_like(expected)
    per = cfg.n_kv_heads // world
    for r, shard in enumerate(shards):
        caches = shard.new_caches("ring")
        q, k, v = shard.layers[0].attn.qkv(x, pos)
        ks, vs = caches[0].update(k, v)
        total += shard.layers[0].attn.attend(q, ks, vs, pos, caches[0].positions)
        assert torch.equal(caches[0].k_buf, whole_cache[0].k_buf[:, r * per : (r + 1) * per])
        assert caches[0].nbytes * world == whole_cache[0].nbytes
    torch.testing.assert_close(total, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("world", [3, 4, 0])
def test_a_world_size_that_does_not_divide_the_kv_heads_is_refused(world):
    with pytest.raises(ValueError, match=rf"world size {world} does not divide the checkpoint's n_kv_heads=2.*\[1, 2\]"):
        check_world_size(config(), world)


def test_the_command_refuses_a_bad_world_size_before_starting_a_process_group(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="world size 3 does not divide"):
        main(["--prompt", "x", "--max-new-tokens", "2"])
    assert not dist.is_initialized()


def test_one_process_without_torchrun_decodes_as_generate(monkeypatch, capsys):
    """World size 1 (no launcher, a HashStore): the whole model on one rank, the same tokens as generate()."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["--prompt", PROMPT, "--max-new-tokens", "12", "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    model, tok = load_pretrained()
    assert out["tokens"] == model.generate(torch.tensor([tok.encode(PROMPT)]), 12)[0].tolist()
    assert out["world_size"] == 1 and out["resumed_from"] is None
    assert out["cache_bytes_per_rank"] == [single_process_cache_bytes(model)]
    assert not dist.is_initialized()


def test_a_rerun_on_the_same_snapshot_folder_resumes_and_says_so(monkeypatch, capsys, tmp_path):
    """Text mode, one process: the first run leaves snapshots after 4 and 8 new tokens (LATEST names 8);
    running the same command again resumes from 8, prints where from, and ends with the same text."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    args = ["--prompt", PROMPT, "--max-new-tokens", "11", "--snapshot-dir", str(tmp_path), "--snapshot-every", "4",
            "--device", "cpu"]
    model, tok = load_pretrained()
    text = tok.decode(model.generate(torch.tensor([tok.encode(PROMPT)]), 11)[0])
    assert main(args) == 0
    assert capsys.readouterr().out == text + "\n"
    assert json.loads((tmp_path / "LATEST").read_text()) == {"token": 8, "world_size": 1}
    assert main(args) == 0
    assert capsys.readouterr().out == "[resumed from the snapshot after 8 new tokens]\n" + text + "\n"


def test_a_snapshot_of_another_prompt_is_refused(monkeypatch, tmp_path):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    common = ["--max-new-tokens", "6", "--snapshot-dir", str(tmp_path), "--snapshot-every", "2", "--json", "--device", "cpu"]
    assert main(["--prompt", "def f(x):", *common]) == 0
    with pytest.raises(ValueError, match="another prompt"):
        main(["--prompt", "import os", *common])
    assert not dist.is_initialized()


def single_process_cache_bytes(model) -> int:
    """Ring caches of the whole model, worked out from the config: layers x (k, v) x heads x W x head_dim x 4 bytes."""
    c = model.config
    return c.n_layers * 2 * c.n_kv_heads * c.window_size * c.head_dim * 4


# --------------------------------------------------------------------------- torchrun, for real
def torchrun(*args: str, restarts: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), "-m", "swkv_teach.distributed", "--checkpoint", "shipped",
           "--prompt", PROMPT, "--max-new-tokens", str(NEW), "--seed", "0", "--device", "cpu", "--json", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def expected():
    model, tok = load_pretrained()
    return model.generate(torch.tensor([tok.encode(PROMPT)]), NEW)[0].tolist(), single_process_cache_bytes(model)


def last_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, f"expected one JSON line (rank 0's); got {len(lines)}:\n{stdout}"
    return json.loads(lines[0])


def test_two_processes_decode_the_tokens_of_one_with_half_the_cache_each(expected):
    tokens, total = expected
    done = torchrun()
    assert done.returncode == 0, done.stderr[-4000:]
    out = last_json(done.stdout)
    assert out["tokens"] == tokens
    assert out["world_size"] == 2
    assert out["cache_bytes_per_rank"] == [total // 2, total // 2]
    assert out["resumed_from"] is None


def test_a_rank_killed_mid_generation_resumes_from_the_last_snapshot(expected, tmp_path):
    """Snapshots at 8, 16, 24 new tokens; rank 1 dies after 20 (first attempt only); torchrun restarts both;
    they resume from 16, not from the prompt, and end with the uninterrupted run's tokens."""
    tokens, total = expected
    snap = tmp_path / "snap"
    done = torchrun("--snapshot-dir", str(snap), "--snapshot-every", "8", "--fail-at-token", "20", restarts=1)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "fault injected: rank 1 stops after 20 new tokens" in done.stderr
    out = last_json(done.stdout)
    assert out["resumed_from"] == 16
    assert out["tokens"] == tokens
    assert out["cache_bytes_per_rank"] == [total // 2, total // 2]
    assert "attempt 0" in (snap / "FAULT").read_text()
    assert json.loads((snap / "LATEST").read_text()) == {"token": 24, "world_size": 2}
    assert sorted(p.name for p in snap.glob("rank*.pt")) == ["rank0-24.pt", "rank1-24.pt"]  # older ones dropped


def test_latest_is_committed_only_between_barriers(monkeypatch, tmp_path):
    """Guards the snapshot protocol's order (module docstring): each rank writes its file, *a barrier*, rank 0
    commits LATEST, a barrier, old files go. Without the first barrier rank 0 could name a snapshot whose other
    rank files are not on disk yet (a crash then resumes from a half-written snapshot)."""
    from swkv_teach import distributed

    events = []
    real_replace = os.replace
    monkeypatch.setattr(distributed.dist, "barrier", lambda *a, **k: events.append("barrier"))
    monkeypatch.setattr(distributed.os, "replace",
                        lambda src, dst: (events.append(Path(dst).name), real_replace(src, dst))[1])

    class Caches:
        def state_dict(self):
            return {"layers": []}

    snaps = distributed.Snapshots(tmp_path, 4, rank=0, world_size=2)
    snaps.save(4, torch.zeros(1, 6, dtype=torch.long), Caches())
    snaps.save(8, torch.zeros(1, 10, dtype=torch.long), Caches())
    assert events == ["rank0-4.pt", "barrier", "LATEST", "barrier", "rank0-8.pt", "barrier", "LATEST", "barrier"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "rank0-8.pt"]  # the older file went
