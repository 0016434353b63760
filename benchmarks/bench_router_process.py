"""The router process alone: start time, resident memory and whether libtorch is mapped.

Method: write the embedded `local` topology with a free router port, start
`python -m <proc module> --topology FILE --name router` (no workers: the router starts and
answers /health without them; its health checks of the workers just fail), poll
`GET /health` every 10 ms and take the start time as spawn -> first HTTP 200. Then read the
process's VmRSS from /proc/PID/status and look for a `libtorch` path in /proc/PID/maps; stop it
with SIGTERM. `--runs` starts (default 5); median and min are reported.

`--src DIR` runs another checkout (e.g. main before the split: `--src /work/main/src
--module prfaas.serve.proc`); the JSON goes to benchmarks/results/router_process.json, or
`--out`. Run on a quiet machine: the start time is mostly imports, i.e. disk cache and CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from prfaas.serve.ports import free_port

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
TOPOLOGY = SRC / "prfaas" / "data" / "topologies" / "local.yaml"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def torch_mapped(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def one_start(src: Path, module: str, folder: Path, timeout_s: float) -> dict[str, object]:
    port = free_port()
    topo = yaml.safe_load(TOPOLOGY.read_text())
    topo["router"] = {"host": "127.0.0.1", "port": port}
    path = folder / f"router-{port}.yaml"
    path.write_text(yaml.safe_dump(topo))
    env = {**os.environ, "PYTHONPATH": str(src)}
    env.pop("PRFAAS_API_KEY", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", module, "--topology", str(path), "--name",
                             "router"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"router exited {proc.returncode}: "
                                   f"{proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            if time.perf_counter() - t0 > timeout_s:
                raise RuntimeError(f"router not up after {timeout_s} s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.01)
        start_s = time.perf_counter() - t0
        time.sleep(0.2)  # let start-up allocations settle before reading RSS
        return {"start_s": start_s, "rss_bytes": rss_bytes(proc.pid),
                "libtorch_mapped": torch_mapped(proc.pid)}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=SRC)
    ap.add_argument("--module", default="prfaas.serve.deploy.proc")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "router_process.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_start(args.src.resolve(), args.module, Path(tmp), args.timeout_s)
                for _ in range(args.runs)]
    starts = [float(r["start_s"]) for r in runs]  # type: ignore[arg-type]
    rss = [int(r["rss_bytes"]) for r in runs]  # type: ignore[call-overload]
    result = {"src": str(args.src), "module": args.module, "runs": runs,
              "start_s_median": round(statistics.median(starts), 3),
              "start_s_min": round(min(starts), 3),
              "rss_mib_median": round(statistics.median(rss) / 2**20, 1),
              "libtorch_mapped": any(bool(r["libtorch_mapped"]) for r in runs),
              "loadavg_1m": os.getloadavg()[0]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
