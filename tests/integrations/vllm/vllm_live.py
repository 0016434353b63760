"""Helpers of the live vLLM tests: a deployment of a vLLM topology on free ports with traces,
extra routers (other policies) over the same instances, a standalone reference instance, and
requests. Every process is stopped by pid (process group) when its fixture ends."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prfaas.bench.loadgen import sse_payloads
from prfaas.bench.stdlib_text import heldout_windows
from prfaas.integrations.vllm.model_builder import ensure_model
from prfaas.integrations.vllm.reference import deployment_with_reference, post_completion
from prfaas.serve.deploy.launcher import Deployment
from prfaas.serve.ports import free_port
from prfaas.serve.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[3]
SERVED = "tiny"


def topology(name: str, model_dir: Path, **overrides: Any) -> Topology:
    topo = load_topology(ROOT / "topologies" / name)
    assert topo.vllm is not None
    vllm = dataclasses.replace(topo.vllm, model_dir=str(model_dir))
    workers = tuple(dataclasses.replace(w, port=0, kv_port=0) for w in topo.workers)
    return dataclasses.replace(topo, vllm=vllm, workers=workers, router_port=0, **overrides)


def build(arch: str, root: Path) -> Path:
    return ensure_model(arch, root / arch, seed=0)


@contextlib.contextmanager
def workdir(name: str) -> Iterator[Path]:
    """A private temp dir (not pytest's basetemp: concurrent pytest runs on one host prune
    each other's old basetemps, and these instances live for a whole module)."""
    path = Path(tempfile.mkdtemp(prefix=f"prfaas-{name}-"))
    try:
        yield path
    finally:
        if not os.environ.get("PRFAAS_TEST_KEEP_LOGS"):  # set: keep instance logs to read
            shutil.rmtree(path, ignore_errors=True)


deployment = deployment_with_reference  # the instances + router, and a reference alongside


class ExtraRouter:
    """Another router process over the deployment's instances (e.g. all-pd / all-prfaas)."""

    def __init__(self, dep: Deployment, log_dir: Path, name: str, **overrides: Any) -> None:
        topo = dataclasses.replace(dep.topology, router_port=free_port(), **overrides)
        self.url = topo.router_url
        path = log_dir / f"topology.{name}.yaml"
        topo.dump(path)
        log = open(log_dir / f"router-{name}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "prfaas.serve.deploy.proc",
                                      "--topology", str(path), "--name", "router"], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 120
        while not _healthy(self.url):
            assert self.proc.poll() is None, (log_dir / f"router-{name}.log").read_text()
            assert time.monotonic() < deadline, f"router {name} not healthy"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(url: str, timeout_s: float = 600) -> None:
    """Until `url`/health answers 200: an instance the supervisor restarts (after a kill test)
    takes ~40 s, longer on a loaded host."""
    deadline = time.monotonic() + timeout_s
    while not _healthy(url):
        assert time.monotonic() < deadline, f"{url} not healthy after {timeout_s:.0f} s"
        time.sleep(0.5)


def post(url: str, body: dict[str, Any], timeout_s: float = 600) -> tuple[int, dict[str, Any]]:
    return post_completion(url, body, timeout_s)


def routed(url: str, prompt: list[int] | str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    status, reply = post(url, {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens,
                               "temperature": 0, **extra})
    assert status == 200, reply
    return reply


def stream_routed(url: str, prompt: list[int] | str, max_tokens: int,
                  on_first: Any = None) -> dict[str, Any]:
    """A streamed greedy completion through a router, read chunk by chunk; `on_first()` runs
    once the first token's chunk is in. The last chunk's `prfaas` object (it carries every
    token id, retries and resumes) with the number of chunks that carried a token."""
    body = json.dumps({"model": SERVED, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    last: dict[str, Any] = {}
    chunks = 0
    with urllib.request.urlopen(req, timeout=1200) as resp:
        assert resp.status == 200
        for chunk in sse_payloads(resp):
            assert "error" not in chunk, chunk
            if chunk.get("choices"):
                chunks += 1
                if on_first is not None:
                    on_first()
                    on_first = None
            last = chunk
    return {**last["prfaas"], "chunks": chunks}


def members(url: str) -> dict[str, Any]:
    """The router's view of its workers (GET /health: up, restarts, last error)."""
    with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
        out: dict[str, Any] = json.loads(resp.read())["members"]
    return out


def wait_back(dep: Deployment, router_url: str, name: str, old_pid: int,
              timeout_s: float = 900) -> float:
    """Until the supervisor's new process for `name` answers and the router holds it up;
    the seconds it took (readiness-driven: a restart takes 35-200 s here, longer loaded)."""
    t0 = time.monotonic()
    while True:
        new = dep.pid(name)
        if new != old_pid and _healthy(dep.topology.worker(name).url) and \
                members(router_url)[name]["up"]:
            return time.monotonic() - t0
        assert time.monotonic() < t0 + timeout_s, (name, members(router_url)[name])
        time.sleep(0.5)


def event_counts(url: str, worker: str) -> dict[str, float]:
    """A router's `prfaas_cache_events_total` for one worker, by kind (stored_blocks, ...)."""
    import re

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pat = re.compile(r'^prfaas_cache_events_total\{kind="(\w+)",worker="' + re.escape(worker)
                     + r'"\} (\S+)$', re.M)
    return {kind: float(v) for kind, v in pat.findall(text)}


def pd_request(dep: Deployment, prompt: list[int], max_tokens: int, transfer_id: int,
               recv: dict[str, Any] | None = None, prefill: str = "prfaas-0",
               send: dict[str, Any] | None = None, **sampling: Any) -> dict[str, Any]:
    """One P/D request straight to the instances (the router's two bodies, sent at once):
    the decoder's reply. `recv` / `send`: more `kv_transfer_params.prfaas` keys for the
    decoder / the prefill instance (e.g. the benchmark knobs `rate_gbps`, `after_prefill`)."""
    import threading

    pre, dec = dep.topology.worker(prefill), dep.topology.by_role("pd-d")[0]
    base = {"model": SERVED, "prompt": prompt, "return_token_ids": True, **sampling}
    out: dict[str, Any] = {}
    send_keys = dict(send or {})  # (the thread below must not shadow it: it read the thread)
    prefill_thread = threading.Thread(target=lambda: out.update(p=post(pre.url, {
        **base, "max_tokens": 1, "kv_transfer_params": {"prfaas": {
            "role": "send", "transfer_id": transfer_id, "dest_host": dec.host,
            "dest_port": dec.kv_port, **send_keys}}})))
    prefill_thread.start()
    status, reply = post(dec.url, {**base, "max_tokens": max_tokens, "kv_transfer_params": {
        "prfaas": {"role": "recv", "transfer_id": transfer_id, **(recv or {})}}})
    prefill_thread.join(300)
    assert status == 200, reply
    assert out["p"][0] == 200, out["p"]
    return reply


def prompts(lengths: list[int], seed: int) -> list[list[int]]:
    """Token-id prompts (ids 3..999: no special tokens), one per length."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(n)] for n in lengths]


def text_prompts(model_dir: Path, lengths: list[int], seed: int) -> list[list[int]]:
    """Prompts of held-out stdlib docstrings (text the trained models never saw, where their
    next-token distributions are peaked), in the model's own tokens, one per length."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return heldout_windows(lambda text: list(tok.encode(text).ids), lengths, seed)


def trace(trace_dir: Path, worker: str) -> list[dict[str, Any]]:
    path = trace_dir / f"{worker}.trace"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def process_tree(pid: int) -> list[Any]:
    """A process and all its descendants (psutil), listed now: killing them later is instant
    (listing walks /proc, which takes tens of ms on a loaded host)."""
    import psutil

    proc = psutil.Process(pid)
    return [*proc.children(recursive=True), proc]


def kill_procs(victims: list[Any]) -> None:
    import psutil

    for p in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once (a crashed vLLM instance)."""
    kill_procs(process_tree(pid))


class EventTap:
    """A second subscriber to one instance's KV events (vLLM's PUB socket serves any number),
    beside the router's: each batch goes into one GlobalKVCacheManager per mapping in
    `mappings` (name -> fn(index, events)), so that the router's count can be held against
    other translations of the very same events (the negative controls). `counted(name,
    prompt)` is the tokens of `prompt` that mapping counts on the instance."""

    def __init__(self, endpoint: str, topic: str, block_size_tokens: int,
                 mappings: dict[str, Any]) -> None:
        import threading

        import zmq

        from prfaas.cache import GlobalKVCacheManager
        from prfaas.cache.block_events import EngineBlockIndex

        self.topic, self.bs = topic, block_size_tokens
        self.mappings = mappings
        self.managers = {name: GlobalKVCacheManager(block_size_tokens) for name in mappings}
        for m in self.managers.values():
            m.add_instance(topic, "pd")
        self.indexes = {name: EngineBlockIndex(topic, m, block_size_tokens)
                        for name, m in self.managers.items()}
        self.batches = 0
        self.last_batch_s = time.monotonic()
        self.lock = threading.Lock()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sock.connect(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from prfaas.integrations.vllm.kv_events import parse_batch

        while not self._stop.is_set():
            if not self._sock.poll(100):
                continue
            frames = self._sock.recv_multipart()
            events = parse_batch(frames[2])
            with self.lock:
                for name, apply in self.mappings.items():
                    apply(self.indexes[name], events)
                self.batches += 1
                self.last_batch_s = time.monotonic()

    def counted(self, name: str, prompt: list[int]) -> int:
        from prfaas.cache import chain_hashes

        with self.lock:
            match = self.managers[name].match(chain_hashes(prompt, self.bs), exact=True)
            return int(match.cached_tokens(self.topic))

    def stats(self, name: str) -> dict[str, int]:
        with self.lock:
            return dataclasses.asdict(self.indexes[name].stats)

    def quiet(self, for_s: float) -> bool:
        with self.lock:
            return time.monotonic() - self.last_batch_s >= for_s

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)
        self._ctx.term()


async def serve_completions(handler: Any) -> tuple[Any, int]:
    """A stand-in instance: aiohttp serving `handler` at POST /v1/completions on a free
    loopback port; (its runner, to `cleanup()`, and the port)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
