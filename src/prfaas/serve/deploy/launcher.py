"""Start a topology's router and workers as processes on this host, and stop them.

`Deployment(topology).start()` resolves port 0 to free ports, writes the resolved topology
beside the logs, spawns every worker then the router (`python -m prfaas.serve.deploy.proc`),
and waits until each answers `GET /health` (a process that exits early fails the start, with
the tail of its log; a worker that answers plain HTTP where the topology's TLS asks for HTTPS
fails it at once, naming it). Once up, a Supervisor (serve/deploy/supervisor.py) restarts any
process that exits, with backoff; nothing but `stop()` ends the deployment. `stop()` sends
SIGTERM, waits, then SIGKILLs what is left; it is also the context manager's exit. Workers
whose host is not this one, and those named `external`, are expected to be run by someone
else. With `link.emulation: netns` it first creates the shaped namespace
(serve/deploy/netns.py), runs the PrfaaS workers inside it and removes it on stop. Before any
process starts, every worker it starts that asks for a GPU must have it on this host
(serve/gpus.py: one line naming the worker and the device otherwise).
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from prfaas.core.errors import ConfigError, PrfaasError
from prfaas.security.apikey import ENV as API_KEY_ENV
from prfaas.security.certs import ROUTER
from prfaas.security.tls import Identity
from prfaas.serve.deploy.netns import NetnsLink
from prfaas.serve.deploy.supervisor import Supervisor
from prfaas.serve.engines import RUN_DIR_ENV, engine_backend
from prfaas.serve.gpus import check_devices
from prfaas.serve.topology import Topology

LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0")
DELAY_STAGE = "delay-stage"  # the process of serve/deploy/delay.py (link.delay_stage)


class DeploymentError(PrfaasError):
    """A component did not come up; names it and shows its log tail."""


class Deployment:
    def __init__(self, topology: Topology, log_dir: str | Path | None = None,
                 start_timeout_s: float = 300.0, external: frozenset[str] = frozenset(),
                 log: Callable[[str], None] | None = None, api_key: str | None = None,
                 router_env: dict[str, str] | None = None,
                 local_hosts: frozenset[str] = frozenset()) -> None:
        """`api_key`: the router requires it (passed in its environment, never on disk);
        `router_env`: more of the router's environment (e.g. its tenant key for a shared
        PrfaaS gateway); `local_hosts`: more addresses of this host whose workers it starts
        (e.g. the host ends of serve/deploy/regions.py's links)."""
        if topology.shape is not None:
            raise ConfigError("shape", "embedded launcher",
                              "role changes need a deployment that restarts a worker in "
                              "another role: run with --ray (docs/shape.md)")
        self.requested = topology
        self.api_key = api_key
        self.router_env = dict(router_env or {})
        self.local_hosts = local_hosts
        self._probe_tls = _probe_context(topology)  # checks every certificate up front
        self.topology = topology.with_ports()
        self.netns: NetnsLink | None = None  # link.emulation: netns (created by start)
        self.external = external  # workers someone else runs (another host, a test double)
        # a temp log dir we made ourselves is removed on stop; one the caller named is kept
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="prfaas-serve-"))
        self.start_timeout_s = start_timeout_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # as started; see supervisor
        self._path = self.log_dir / "topology.resolved.yaml"
        self._run_dir: Path | None = None  # private (0700), made by start, removed by stop
        self._echo = log
        self.supervisor = Supervisor(self._respawn, self.topology.restart, self._log)

    @property
    def url(self) -> str:
        return self.topology.router_url

    def __enter__(self) -> Deployment:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self._path
        local = set(LOCAL_HOSTS) | self.local_hosts
        try:
            if self.requested.link.emulation == "netns":
                rate = self.requested.link.rate_gbps
                assert rate is not None  # LinkSpec validates it
                self.netns = NetnsLink.create(rate)
                local |= {self.netns.host_ip, self.netns.ns_ip}
                self.topology = self.requested.in_namespace(
                    self.netns.host_ip, self.netns.ns_ip).with_ports()
            if self._run_dir is None:
                self._run_dir = Path(tempfile.mkdtemp(prefix="prfaas-run-"))  # 0700
            starts = frozenset(w.name for w in self.topology.workers
                               if w.host in local and w.name not in self.external)
            self.topology = engine_backend(self.topology).launch_topology(starts, self._run_dir)
            check_devices(self.topology, [w for w in self.topology.workers if w.name in starts])
            self.topology.dump(path)
            backend = engine_backend(self.topology)
            backend.prepare()  # e.g. vLLM: build the tiny model once, before any instance
            self.start_timeout_s = max(self.start_timeout_s, backend.start_timeout_s)
            if self.topology.link.delay_stage:
                self._start_delay_stage(path)
            for w in self.topology.workers:
                if w.host in local and w.name not in self.external:
                    self._spawn(w.name, path, inside=self.netns if w.role == "prfaas" else None)
            self._wait_all([(w.name, w.url) for w in self.topology.workers
                            if w.name not in self.external])
            self._spawn("router", path)
            self._wait_all([("router", self.topology.router_url)])
            for name, proc in self.procs.items():
                self.supervisor.add(name, proc)
            self.supervisor.start()
        except BaseException:
            self.stop()
            raise

    def _command(self, name: str, path: Path) -> list[str]:
        if name != DELAY_STAGE:
            return [sys.executable, "-m", "prfaas.serve.deploy.proc", "--topology", str(path),
                    "--name", name]
        assert self.netns is not None
        ports = ",".join(str(w.kv_port) for w in self.topology.by_role("pd-d"))
        return [sys.executable, "-m", "prfaas.serve.deploy.delay", "--listen", self.netns.ns_ip,
                "--ports", ports, "--target", self.netns.host_ip,
                "--control", str(self.log_dir / "link-delay-ms"),
                "--ready", str(self.log_dir / "delay-stage.ready")]

    def set_link_delay_ms(self, delay_ms: float) -> None:
        """The delay stage's added RTT from now on (link.delay_stage; a fault)."""
        tmp = self.log_dir / "link-delay-ms.tmp"
        tmp.write_text(f"{delay_ms}\n")
        tmp.replace(self.log_dir / "link-delay-ms")

    def _start_delay_stage(self, path: Path) -> None:
        ready = self.log_dir / "delay-stage.ready"
        ready.unlink(missing_ok=True)
        self.set_link_delay_ms(0.0)
        proc = self._spawn(DELAY_STAGE, path, inside=self.netns)
        deadline = time.monotonic() + self.start_timeout_s
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise DeploymentError(f"{DELAY_STAGE} did not start:\n"
                                      f"{self.log_tail(DELAY_STAGE)}")
            time.sleep(0.05)

    def _spawn(self, name: str, path: Path, inside: NetnsLink | None = None,
               append: bool = False) -> subprocess.Popen[bytes]:
        cmd = self._command(name, path)
        if inside is not None:
            cmd = inside.wrap(cmd)
        # a restart appends: the log keeps why the previous process ended
        log = open(self.log_dir / f"{name}.log", "ab" if append else "wb")  # noqa: SIM115
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self._run_dir is not None:
            env[RUN_DIR_ENV] = str(self._run_dir)
        if name == "router" and self.api_key is not None:
            env[API_KEY_ENV] = self.api_key
        if name == "router":
            env.update(self.router_env)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        self.procs[name] = proc
        return proc

    def _respawn(self, name: str, append: bool) -> subprocess.Popen[bytes]:
        """The supervisor's restart of `name`, in the namespace it ran in."""
        role = None if name in ("router", DELAY_STAGE) else self.topology.worker(name).role
        inside = self.netns if role == "prfaas" or name == DELAY_STAGE else None
        return self._spawn(name, self._path, inside, append)

    def _log(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        with open(self.log_dir / "launcher.log", "a") as f:
            f.write(f"{stamp} {message}\n")
        if self._echo is not None:
            self._echo(message)

    @property
    def restarts(self) -> dict[str, int]:
        return dict(self.supervisor.restarts)

    def pid(self, name: str) -> int:
        return self.supervisor.procs().get(name, self.procs[name]).pid

    def _wait_all(self, targets: list[tuple[str, str]], fail_on_exit: bool = True) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        pending = dict(targets)
        while pending:
            for name, url in list(pending.items()):
                proc = self.procs.get(name)
                if fail_on_exit and proc is not None and proc.poll() is not None:
                    raise DeploymentError(f"{name} exited with code {proc.returncode}:\n"
                                          f"{self.log_tail(name)}")
                health = _probe(url, self._probe_tls)
                if health == "ok":
                    del pending[name]
                elif health == "not TLS" and _speaks_plain_http(url):
                    raise DeploymentError(
                        f"{name} (engine {self.topology.engine}) answers plain HTTP at {url}: "
                        "the topology's security.tls needs HTTPS with client certificates "
                        "there, and it does not serve it")
            if pending and time.monotonic() > deadline:
                raise DeploymentError(f"not healthy after {self.start_timeout_s:.0f} s: "
                                      f"{sorted(pending)}")
            if pending:
                time.sleep(0.1)

    def log_tail(self, name: str, num_bytes: int = 3000) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_bytes()[-num_bytes:].decode(errors="replace") if path.exists() else ""

    def alive(self) -> dict[str, bool]:
        procs = self.supervisor.procs() or self.procs
        return {name: p.poll() is None for name, p in procs.items()}

    def wait_healthy(self, names: list[str] | None = None) -> None:
        """Wait (readiness-driven, start_timeout_s) until `names` (default all) answer /health."""
        targets = [("router", self.url)] if names is None or "router" in names else []
        targets += [(w.name, w.url) for w in self.topology.workers
                    if (names is None or w.name in names) and w.name not in self.external]
        self._wait_all(targets, fail_on_exit=False)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.supervisor.stop()
        self.procs.update(self.supervisor.procs())
        # router first, so no new work reaches the workers while they stop
        order = [self.procs[n] for n in sorted(self.procs, key=lambda n: n != "router")]
        terminate(order)
        reap(order, timeout_s)
        self.procs.clear()
        if self.netns is not None:
            self.netns.destroy()
            self.netns = None
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def terminate(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process still running, in order."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)


def reap(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Wait for every process within one `timeout_s` deadline; SIGKILL those still running."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _probe_context(topology: Topology) -> ssl.SSLContext | None:
    """With TLS: every member's certificate checked (a bad one fails here, naming the file),
    and the router's identity for probing the PrfaaS workers' HTTPS /health. The probe skips
    the hostname check (a netns deployment moves hosts); the chain is still verified."""
    tls_dir = topology.security.tls_dir
    if tls_dir is None:
        return None
    for w in topology.workers:
        Identity.load(tls_dir, w.name)
    ctx = Identity.load(tls_dir, ROUTER).client_context()
    ctx.check_hostname = False
    return ctx


def _speaks_plain_http(url: str) -> bool:
    """Whether the server at an https:// URL answers a plain HTTP request (a worker that does
    not serve the topology's TLS): the start fails at once, naming it, instead of timing out."""
    try:
        with urllib.request.urlopen("http:" + url[len("https:"):] + "/health",
                                    timeout=1.0) as resp:
            return bool(resp.status)
    except urllib.error.HTTPError:
        return True  # an HTTP answer, even an error, is plain HTTP
    except (urllib.error.URLError, OSError, ValueError):
        return False


# what OpenSSL says when the server's first bytes are not a TLS record (e.g. "HTTP/1.1 400")
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
            "HTTP_REQUEST")


def _probe(url: str, tls: ssl.SSLContext | None = None) -> str:
    """'ok' (GET /health answered 200), 'not TLS' (an https:// URL whose server answered the
    handshake with something that is not TLS), or 'down'."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0, context=tls) as resp:
            return "ok" if resp.status == 200 else "down"
    except urllib.error.URLError as exc:
        reason = getattr(exc.reason, "reason", None)
        return "not TLS" if isinstance(exc.reason, ssl.SSLError) and reason in _NOT_TLS \
            else "down"
    except (OSError, ValueError):
        return "down"
