"""Block stores behind the pool: where a prefix cache's evicted blocks go, so another request (or process) skips
their prefill.

A block is the keys and values one full block of tokens wrote in every layer: ``keys`` and ``values`` each
``(num_layers, block_size, n_kv_heads, head_dim)``. It is stored under its *block hash*, the chained hash of the
tokens it holds and of every token before it (:func:`swkv_teach.caches.prefix.hash_block_tokens`), so a hit means
"these exact tokens, at these exact positions, were computed before". LMCache keeps vLLM's KV cache in such a
tier, Redis among its remote backends, under keys ``format@model_name@world_size@worker_id@chunk_hash``
(LMCache ``docs/source/kv_cache/storage_backends/redis.rst`` at commit fe1fb2f2, line 9 and "Step 3").

Two stores, one interface (``put_block``, ``get_block``, ``stats``):

* :class:`LocalStore` ``(max_bytes)``: in this process, least recently used evicted first, by bytes.
* :class:`RedisStore` ``(url, namespace=None)``: a Redis server, shared by every process that can reach it.
  The only module of the library that imports ``redis`` (lazily: ``import swkv_teach`` works without it).

Nothing a store returns can change a token. A stored value is ``MAGIC``, a JSON header (the
:func:`block_layout`, which carries a fingerprint of the model's config and weights, plus the block hash) and the
payload, followed by a SHA-256 of all of it. A value from another model, dtype or layout, a truncated or corrupted
one, or one filed under another block's hash is a miss, counted in ``store_rejected``, never used. A missing key
is a plain miss. A Redis that is down is a miss counted in ``store_errors``; no exception reaches the caller, and
the store tries the server again after a bounded backoff, so hits resume within seconds of it coming back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import socket
import struct
import subprocess
import time
from collections import OrderedDict

import torch

__all__ = ["FORMAT_VERSION", "LocalStore", "RedisServer", "RedisStore", "block_layout", "decode_block",
           "encode_block", "model_fingerprint", "store_key"]

FORMAT_VERSION = 1
MAGIC = b"SWKVBLK1"
_LEN = struct.Struct(">I")  # header length, big-endian uint32
_DIGEST = 32  # bytes of the trailing SHA-256
_LAYOUT_KEYS = ("format", "model", "dtype", "block_size", "num_layers", "n_kv_heads", "head_dim")


# ---------------------------------------------------------------------------------------------- the layout
def model_fingerprint(decoder) -> str:
    """A hex SHA-256 of ``decoder``'s config and every weight (names, dtypes, shapes, bytes).

    Two decoders share a fingerprint only if they compute the same keys and values, so blocks one wrote can be read
    by the other. A retrained or differently initialised model gets another fingerprint, hence other keys.
    """
    config = decoder.config
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(vars(config))
    h = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    for name, t in sorted(decoder.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def block_layout(decoder, block_size: int, dtype: torch.dtype | None = None) -> dict:
    """What a stored block of ``decoder`` holds: ``{format, model, dtype, block_size, num_layers, n_kv_heads,
    head_dim}`` (``model`` is :func:`model_fingerprint`; ``dtype`` defaults to the decoder's weights').

    A block read back must match it field by field, or it is a miss.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int; got {block_size!r}")
    if dtype is None:
        dtype = next(decoder.parameters()).dtype
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype such as torch.float32; got {dtype!r}")
    c = decoder.config
    return {"format": FORMAT_VERSION, "model": model_fingerprint(decoder), "dtype": str(dtype).replace("torch.", ""),
            "block_size": block_size, "num_layers": len(decoder.layers), "n_kv_heads": c.n_kv_heads,
            "head_dim": c.head_dim}


def _shape(layout: dict) -> tuple[int, int, int, int]:
    return (layout["num_layers"], layout["block_size"], layout["n_kv_heads"], layout["head_dim"])


def _dtype(layout: dict) -> torch.dtype:
    return getattr(torch, layout["dtype"])


def _check_layout(layout) -> None:
    if not isinstance(layout, dict) or any(k not in layout for k in _LAYOUT_KEYS):
        raise ValueError(f"layout must be the dict block_layout() returns, with keys {list(_LAYOUT_KEYS)}; "
                         f"got {layout!r}")


def _check_hash(block_hash) -> bytes:
    if not isinstance(block_hash, (bytes, bytearray)) or not block_hash:
        raise ValueError(f"block_hash must be non-empty bytes (caches.prefix.hash_block_tokens); got {block_hash!r}")
    return bytes(block_hash)


def _layout_tag(layout: dict) -> str:
    """A short, stable name for a layout, part of every key: the model's fingerprint, then a digest of the rest."""
    rest = json.dumps({k: layout[k] for k in _LAYOUT_KEYS if k != "model"}, sort_keys=True)
    return f"{layout['model'][:16]}:{hashlib.sha256(rest.encode()).hexdigest()[:8]}"


def store_key(block_hash: bytes, layout: dict, namespace: str | None = None) -> str:
    """The key a block is filed under: ``swkv[:namespace]:<model fingerprint>:<layout digest>:<block hash hex>``."""
    head = "swkv" if namespace is None else f"swkv:{namespace}"
    return f"{head}:{_layout_tag(layout)}:{_check_hash(block_hash).hex()}"


# ---------------------------------------------------------------------------------------------- the value
def encode_block(block_hash: bytes, layout: dict, keys: torch.Tensor, values: torch.Tensor) -> bytes:
    """``MAGIC | len(header) | header (JSON: layout + block hash) | keys | values | sha256(everything before)``.

    ``keys``, ``values``: ``(num_layers, block_size, n_kv_heads, head_dim)`` in the layout's dtype, any device.
    """
    _check_layout(layout)
    block_hash = _check_hash(block_hash)
    shape, dtype = _shape(layout), _dtype(layout)
    for name, t in (("keys", keys), ("values", values)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be (num_layers, block_size, n_kv_heads, head_dim) = {shape} "
                             f"{dtype} for this layout; got {got}")
    header = json.dumps({**{k: layout[k] for k in _LAYOUT_KEYS}, "hash": block_hash.hex()}, sort_keys=True).encode()
    body = b"".join([MAGIC, _LEN.pack(len(header)), header,
                     keys.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes(),
                     values.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()])
    return body + hashlib.sha256(body).digest()


def decode_block(data, block_hash: bytes, layout: dict):
    """``(keys, values)`` (CPU tensors) if ``data`` is a sound value of this block in this layout, else a string
    saying why not (checked in order: framing, checksum, header, block hash, length). Never raises on bad data."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return f"not bytes ({type(data).__name__})"
    data = bytes(data)
    if len(data) < len(MAGIC) + _LEN.size + _DIGEST or not data.startswith(MAGIC):
        return "not a stored block (bad magic or too short)"
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        return "checksum mismatch (truncated or corrupted)"
    (n,) = _LEN.unpack_from(body, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    try:
        header = json.loads(body[start : start + n])
    except ValueError:
        return "unreadable header"
    want = {k: layout[k] for k in _LAYOUT_KEYS}
    if not isinstance(header, dict):
        return "unreadable header"
    for k in _LAYOUT_KEYS:
        if header.get(k) != want[k]:
            return f"another layout: {k} is {header.get(k)!r}, expected {want[k]!r}"
    if header.get("hash") != bytes(block_hash).hex():
        return "filed under another block's hash"
    shape, dtype = _shape(layout), _dtype(layout)
    each = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    payload = body[start + n :]
    if len(payload) != 2 * each:
        return f"payload of {len(payload)} bytes, expected {2 * each}"
    raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return raw[:each].view(dtype).reshape(shape), raw[each:].view(dtype).reshape(shape)


class _Counters:
    """The counters both stores keep: ``hits``, ``misses`` (rejected values and errors included), ``puts``,
    ``store_rejected`` (values that were there but unusable), ``store_errors`` (operations the backend failed)."""

    def __init__(self):
        self.hits = self.misses = self.puts = self.store_rejected = self.store_errors = 0
        self.last_rejection: str | None = None

    def _reject(self, why: str):
        self.store_rejected += 1
        self.misses += 1
        self.last_rejection = why
        return None

    def _decoded(self, data, block_hash, layout):
        if data is None:
            self.misses += 1
            return None
        out = decode_block(data, block_hash, layout)
        if isinstance(out, str):
            return self._reject(out)
        self.hits += 1
        return out

    def _stats(self, bytes_held: int) -> dict:
        return {"hits": self.hits, "misses": self.misses, "puts": self.puts, "bytes_held": bytes_held,
                "store_rejected": self.store_rejected, "store_errors": self.store_errors}


# ---------------------------------------------------------------------------------------------- in process
class LocalStore(_Counters):
    """Blocks kept in this process, at most ``max_bytes`` of encoded values; the least recently used (put or hit)
    is evicted first. Values are stored encoded, exactly as Redis would hold them, so they are checked the same way.
    """

    def __init__(self, max_bytes: int):
        super().__init__()
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive int; got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.data: OrderedDict[str, bytes] = OrderedDict()  # key -> encoded value, least recently used first
        self.bytes_held = 0
        self.evicted = 0

    def key(self, block_hash: bytes, layout: dict) -> str:
        return store_key(block_hash, layout)

    def put_block(self, block_hash: bytes, layout: dict, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store a block (replacing an older value under the same key); evict the least recently used to fit."""
        value = encode_block(block_hash, layout, keys, values)
        key = self.key(block_hash, layout)
        if key in self.data:
            self.bytes_held -= len(self.data.pop(key))
        if len(value) > self.max_bytes:
            return  # a block larger than the whole store is never kept
        self.data[key] = value
        self.bytes_held += len(value)
        self.puts += 1
        while self.bytes_held > self.max_bytes:
            _, old = self.data.popitem(last=False)
            self.bytes_held -= len(old)
            self.evicted += 1

    def get_block(self, block_hash: bytes, layout: dict):
        """``(keys, values)`` ``(num_layers, block_size, n_kv_heads, head_dim)`` on the CPU, or None (a miss)."""
        key = self.key(block_hash, layout)
        data = self.data.get(key)
        if data is not None:
            self.data.move_to_end(key)
        return self._decoded(data, block_hash, layout)

    def stats(self) -> dict:
        return {**self._stats(self.bytes_held), "evicted": self.evicted}

    def __repr__(self) -> str:
        return f"LocalStore(max_bytes={self.max_bytes}, blocks={len(self.data)}, bytes_held={self.bytes_held})"


# ---------------------------------------------------------------------------------------------- Redis
INSTALL_HINT = "RedisStore needs the redis client: pip install redis (and a server: apt-get install redis-server)"


class RedisStore(_Counters):
    """Blocks kept in a Redis server at ``url`` (``redis://127.0.0.1:6379/0``), shared by every process using it.

    Keys are ``swkv[:namespace]:<model fingerprint>:<layout digest>:<block hash>`` (:func:`store_key`): two models,
    or one model in two dtypes, on one Redis never read each other's blocks; ``namespace`` separates deployments.
    Eviction is Redis's own (``maxmemory`` and ``maxmemory-policy``; ``allkeys-lru`` is the natural one).

    Faults: socket timeouts are short (``timeout`` seconds), and the client's own retries are off. When an
    operation fails, the store counts it in ``store_errors``, answers a miss (a put is dropped), and skips the
    server (more misses and errors, no waiting) for a backoff that doubles from ``backoff`` up to ``max_backoff``
    seconds; the first operation after it tries again, so hits resume within ``max_backoff`` of the server's return.
    """

    def __init__(self, url: str, namespace: str | None = None, timeout: float = 0.2, backoff: float = 0.05,
                 max_backoff: float = 1.0):
        super().__init__()
        try:
            import redis
        except ImportError as e:
            raise ImportError(INSTALL_HINT) from e
        if namespace is not None and (not isinstance(namespace, str) or not namespace or ":" in namespace):
            raise ValueError(f"namespace must be None or a non-empty string without ':'; got {namespace!r}")
        self.url, self.namespace = url, namespace
        self.backoff, self.max_backoff = backoff, max_backoff
        # any failure of the server or the link (down, timeout, OOM under noeviction, a key of another type) is a
        # miss: RedisError is the client's base class
        self._errors = (redis.exceptions.RedisError, OSError)
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                           retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
                                           health_check_interval=0)
        self._wait = 0.0  # current backoff, 0 while the server answers
        self._skip_until = 0.0
        self.last_error: str | None = None

    def key(self, block_hash: bytes, layout: dict) -> str:
        return store_key(block_hash, layout, self.namespace)

    def _call(self, fn, *args, count: bool = True):
        """``fn(*args)`` on the server, or ``_FAILED`` (counted in ``store_errors`` when ``count``) while it is down
        or backing off."""
        if time.monotonic() < self._skip_until:
            self.store_errors += count
            return _FAILED
        try:
            out = fn(*args)
        except self._errors as e:
            self.store_errors += count
            self.last_error = f"{type(e).__name__}: {e}"
            self._wait = min(self.max_backoff, max(self.backoff, 2 * self._wait))
            self._skip_until = time.monotonic() + self._wait
            return _FAILED
        self._wait = 0.0
        return out

    def put_block(self, block_hash: bytes, layout: dict, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store a block (replacing an older value under the same key); dropped, and counted, if Redis is down."""
        value = encode_block(block_hash, layout, keys, values)
        if self._call(self.client.set, self.key(block_hash, layout), value) is not _FAILED:
            self.puts += 1

    def get_block(self, block_hash: bytes, layout: dict):
        """``(keys, values)`` ``(num_layers, block_size, n_kv_heads, head_dim)`` on the CPU, or None (a miss)."""
        data = self._call(self.client.get, self.key(block_hash, layout))
        if data is _FAILED:
            self.misses += 1
            return None
        return self._decoded(data, block_hash, layout)

    def bytes_held(self) -> int | None:
        """Bytes of this namespace's values now in Redis (a SCAN; None if Redis is down)."""
        def count():
            total = 0
            head = "swkv:*" if self.namespace is None else f"swkv:{self.namespace}:*"
            keys = list(self.client.scan_iter(match=head, count=1000))
            if self.namespace is None:  # swkv:* also matches namespaced keys: keep the 4-part ones
                keys = [k for k in keys if k.count(b":") == 3]
            for k in range(0, len(keys), 500):
                pipe = self.client.pipeline(transaction=False)
                for key in keys[k : k + 500]:
                    pipe.strlen(key)
                total += sum(pipe.execute())
            return total

        out = self._call(count, count=False)  # reading the counters is not an operation of the store
        return None if out is _FAILED else out

    def stats(self) -> dict:
        return self._stats(self.bytes_held())

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, namespace={self.namespace!r})"


_FAILED = object()


# ---------------------------------------------------------------------------------------------- a throwaway server
class RedisServer:
    """A ``redis-server`` of our own on 127.0.0.1, no persistence (``--save '' --appendonly no``), for the tests,
    the lesson and the bench: ``start()``, ``stop()``, ``start()`` again on the same port (a restart), ``url``.

    ``config``: extra ``redis-server`` options, e.g. ``{"maxmemory": "2mb", "maxmemory-policy": "allkeys-lru"}``.
    Needs the ``redis-server`` program (Debian/Ubuntu/Colab: ``apt-get install redis-server``), not the client.
    """

    def __init__(self, port: int | None = None, config: dict | None = None):
        self.executable = shutil.which("redis-server")
        if self.executable is None:
            raise FileNotFoundError("redis-server is not installed: apt-get install redis-server (Colab: "
                                    "!apt-get install -y redis-server), or brew install redis")
        self.port = port or _free_port()
        self.config = dict(config or {})
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        if self.process is not None:
            return self
        args = [self.executable, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
        for k, v in self.config.items():
            args += [f"--{k}", str(v)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace")
                self.process = None
                raise RuntimeError(f"redis-server on port {self.port} exited at start: {err.strip()}")
            if _ping(self.port):
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING within {timeout} s")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stderr.close()
        self.process = None

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, running={self.process is not None})"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int) -> bool:
    """A raw RESP PING (no client needed): True once the server answers +PONG."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False
