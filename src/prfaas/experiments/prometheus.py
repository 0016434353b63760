"""A real Prometheus server for live checks of the alert rules, and the rules on a faster clock.

`PrometheusServer` runs the `prometheus` binary (Debian's package; `make prometheus` installs
it) on a free loopback port with its own temporary data folder, scraping `file_sd` targets
(serve/deploy/scrape.py) with the given rule files; `stop()` ends it by its pid and removes the
folder. `alerts()` and `query()` read its HTTP API.

`scaled_rules` rewrites a rule file's durations, and only them: every `for:` and every range
or subquery window in an expression, multiplied by one factor. Expressions, thresholds, labels
and annotations stay as shipped, so a live run on seconds exercises the same conditions the
shipped rules check on minutes (their minute-scale timing is what `promtool test rules`
checks).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from prfaas.core.errors import PrfaasError
from prfaas.serve.ports import free_port

_UNITS_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0,
            "y": 31536000.0}
_DURATION = re.compile(r"(\d+)(ms|[smhdwy])")
_RANGE = re.compile(r"\[(\s*[0-9smhdwy]+\s*)(?::(\s*[0-9smhdwy]*\s*))?\]")


class PrometheusError(PrfaasError):
    """The server did not start or answer (with its log tail)."""


def duration_s(text: str) -> float:
    """A Prometheus duration ("1m", "1h30m", "500ms") in seconds."""
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNITS_S[u] for n, u in parts)


def _ms(seconds: float) -> str:
    return f"{max(round(seconds * 1000), 1)}ms"


def scale_expr(expr: str, factor: float) -> str:
    """Every `[range]` and `[range:step]` in a PromQL expression times `factor`."""
    def one(m: re.Match[str]) -> str:
        rng = _ms(duration_s(m.group(1)) * factor)
        if m.group(2) is None:
            return f"[{rng}]"
        step = m.group(2).strip()
        return f"[{rng}:{_ms(duration_s(step) * factor) if step else ''}]"
    return _RANGE.sub(one, expr)


def scaled_rules(text: str, factor: float) -> dict[str, Any]:
    """The rule file `text` with every duration times `factor` (see the module docstring)."""
    rules: dict[str, Any] = yaml.safe_load(text)
    for group in rules["groups"]:
        if "interval" in group:
            group["interval"] = _ms(duration_s(group["interval"]) * factor)
        for rule in group["rules"]:
            rule["expr"] = scale_expr(rule["expr"], factor)
            if "for" in rule:
                rule["for"] = _ms(duration_s(rule["for"]) * factor)
    return rules


class PrometheusServer:
    def __init__(self, targets: list[dict[str, Any]], rules: dict[str, Any],
                 scrape_interval_s: float = 1.0, eval_interval_s: float = 0.5,
                 binary: str = "prometheus") -> None:
        path = shutil.which(binary)
        if path is None:
            raise PrometheusError(f"{binary} not on PATH (Debian: apt-get install prometheus; "
                                  "`make prometheus` does it)")
        self.binary = path
        self.targets, self.rules = targets, rules
        self.scrape_interval_s, self.eval_interval_s = scrape_interval_s, eval_interval_s
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="prfaas-prometheus-"))
        (self.dir / "targets.json").write_text(json.dumps(self.targets))
        (self.dir / "rules.yml").write_text(yaml.safe_dump(self.rules, sort_keys=False))
        config = {
            "global": {"scrape_interval": _ms(self.scrape_interval_s),
                       "scrape_timeout": _ms(self.scrape_interval_s),
                       "evaluation_interval": _ms(self.eval_interval_s)},
            "rule_files": [str(self.dir / "rules.yml")],
            "scrape_configs": [{"job_name": "prfaas", "file_sd_configs": [
                {"files": [str(self.dir / "targets.json")], "refresh_interval": "1s"}]}]}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        log = open(self.dir / "prometheus.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise PrometheusError(f"prometheus did not become ready:\n{tail}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def log_tail(self, num_bytes: int = 3000) -> str:
        path = self.dir / "prometheus.log" if self.dir else None
        return path.read_bytes()[-num_bytes:].decode(errors="replace") if path and \
            path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise PrometheusError(f"{path}: {body}")
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing): each with `labels`, `state`, `activeAt`."""
        data: list[dict[str, Any]] = self._get("/api/v1/alerts")["alerts"]
        return data

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        data = self._get("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result
