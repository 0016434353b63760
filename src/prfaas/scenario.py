"""Scenarios: model, hardware profiles, clusters, link and workload in one YAML file.

A scenario is validated once, when loaded: unknown keys are rejected and every error names the
field and value. It is never mutated; planner, simulator and CLI read it. The schema:

    name, description
    model: catalog name or spec file (optional; used when `kv: {from: model}`)
    kv: {from: model} | {profile: PATH} | {fit: linear, points: [{length_tokens, mib | bytes}]}
    hardware: {<hw>: {gpus_per_instance, prefill: PREFILL, decode: {bs_max, step_s},
                      cost_per_gpu_hour (optional: enables throughput-per-cost)}
                     | {profile: PATH}}   (a measured profile file, models/profile_file.py)
        PREFILL = {fit: quadratic, points: [{length_tokens, time_s}, ...]}
                | {scale_of: <hw>, factor: F}          (keep c0, scale the rest)
                | {roofline: {gpu, mfu, overhead_s}}
    clusters: {prfaas: {hardware, instances}, pd: {hardware, instances}}
    baselines: {homogeneous_pd: {hardware, instances},
                naive_heterogeneous: {prefill: {hardware, instances},
                                      decode: {hardware, instances}}}
    link: {gbps, intra_gbps, schedule, pipelined, connections, per_connection_gbps,
           order,   (shared | fifo: transfers interleaved, as the native worker sends, or one
                     at a time in start order, as the vLLM connector does; default shared)
           rtt_ms, loss, mss_bytes,   (the TCP path terms: models/tcp.py)
           wire_dtype,   (bf16 | fp8_e4m3: full-attention KV on the wire; default the cache
                          dtype. The planner and simulator then move `wire_kv` bytes)
           compression,  (none | lz4 | zstd | auto: a lossless codec on the wire, chosen as
                          the live sender chooses, its ratio measured on real KV; default none)
           codec_kv}     (whose measured codec figures: a KV of data/codec_speeds.json;
                          default native_tiny, the KDA:MLA hybrid engine's KV)
    workload: {input: LENGTHS, output_tokens}
    planner: {t_step_tokens, mode}
    reference: paper figures to print beside ours (optional, free-form)
    pd_clusters: several PD clusters sharing the PrfaaS cluster (optional):
        [{name, hardware, instances, link: LINK + egress_budget_gbps,
          workload: {input, output_tokens, rate_rps}, tenant_weight}]; `clusters.pd`, `link`
        and `workload` then default to the first one's; baselines.whole_request_routing:
        {hardware, instances} is what replaces the PrfaaS cluster under whole-request routing
        (default: the PrfaaS instance count on the first PD cluster's hardware).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from prfaas.core.errors import ConfigError, UnknownNameError
from prfaas.core.files import read_text
from prfaas.models.catalog import resolve_model
from prfaas.models.compression import MODES as COMPRESSION_MODES
from prfaas.models.compression import CodecSpeed, measured_speeds, planned_codec
from prfaas.models.kv import geometry, wire_dtype_name
from prfaas.models.kv_release import KvRelease, parse_release
from prfaas.models.profile import DecodeTime, HardwareProfile, KVSize, PrefillTime
from prfaas.models.profile_file import kv_from_profile, load_profile_file
from prfaas.models.roofline import roofline_profile
from prfaas.models.spec import ModelSpec
from prfaas.models.tcp import DEFAULT_MSS_BYTES, TcpPath
from prfaas.workload.lengths import LengthDistribution, from_config

MIB = 1024**2
DEFAULT_CODEC_KV = "native_tiny"  # KDA:MLA, the architecture of the catalog's Kimi-Linear


@dataclass(frozen=True, slots=True)
class Pool:
    """`instances` instances of one hardware profile."""

    hardware: HardwareProfile
    instances: int

    @property
    def cost_per_hour(self) -> float | None:
        rate = self.hardware.cost_per_gpu_hour
        return None if rate is None else rate * self.hardware.gpus_per_instance * self.instances


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    kv: KVSize
    hardware: dict[str, HardwareProfile]
    prfaas: Pool
    pd: Pool
    homogeneous: Pool
    naive_prefill: Pool
    naive_decode: Pool
    link_gbps: float
    intra_gbps: float
    lengths: LengthDistribution
    output_tokens: int
    t_step_tokens: int
    mode: str
    model: ModelSpec | None = None
    tcp: TcpPath = field(default_factory=TcpPath)  # RTT/loss/connections of the link
    wire_dtype: str | None = None  # link.wire_dtype (None: KV travels in its cache dtype)
    compression: str = "none"  # link.compression (models/compression.py)
    link_order: str = "shared"  # link.order: how concurrent transfers cross (LINK_ORDERS)
    # link.release: when a prefill hands its KV to the link (models/kv_release.py); None: the
    # paper's layer-by-layer streaming
    kv_release: KvRelease | None = None
    codec_kv: str = DEFAULT_CODEC_KV  # link.codec_kv: whose measured codec figures
    reference: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    path: str = ""
    pd_clusters: tuple[PdCluster, ...] = ()  # empty: the one PD cluster above
    # with pd_clusters: what whole-request routing gets in place of the PrfaaS cluster
    whole_request_extra: Pool | None = None

    @property
    def cache_dtype(self) -> str:
        return self.model.dtype if self.model else "bf16"

    @property
    def codec_speeds(self) -> tuple[CodecSpeed, ...]:
        """The codecs as measured on `codec_kv`'s KV in the dtype this link sends it in."""
        if self.compression == "none":
            return ()
        return measured_speeds(self.codec_kv, self.wire_dtype or self.cache_dtype)

    @property
    def wire_codec(self) -> str:
        """The codec the link's senders use: `compression`, with `auto` decided by the live
        sender's rule (models/compression.py) on the link's rate and connections."""
        return self._codec()[0]

    def _codec(self) -> tuple[str, float]:
        return planned_codec(self.compression, self.link_gbps, self.tcp.connections,
                             self.codec_speeds)

    @property
    def wire_kv(self) -> KVSize:
        """S_kv(l) as it crosses a link: `kv` with the full-attention part in `wire_dtype`,
        then shrunk by the codec's measured ratio."""
        codec, ratio = self._codec()
        return self.kv.on_wire(self.wire_dtype, self.cache_dtype).compressed(ratio, codec)

    @property
    def flow_cap_gbps(self) -> float | None:
        """What one transfer's connections carry in wire Gbps: the TCP path's bound and, with
        a codec, each connection's compress / decompress rate (tensor Gbps, one thread each
        side, as measured) over the ratio. None: unbounded."""
        caps = [c for c in (self.tcp.transfer_cap_gbps(),) if c is not None]
        codec = self.wire_codec
        for speed in self.codec_speeds:
            if speed.name == codec:
                caps.append(self.tcp.connections * min(speed.compress_gbps,
                                                       speed.decompress_gbps) / speed.ratio)
        return min(caps) if caps else None


@dataclass(frozen=True)
class PdCluster:
    """One of several PD clusters served by the PrfaaS cluster: its pool, its own link to the
    PrfaaS cluster, its own workload, and its weight as a PrfaaS tenant."""

    name: str
    pool: Pool
    link_gbps: float
    tcp: TcpPath
    egress_budget_gbps: float | None  # a cap on the PrfaaS egress toward it (None: the link's)
    lengths: LengthDistribution
    output_tokens: int
    rate_rps: float | None  # its offered rate (None: a fraction of its planned capacity)
    tenant_weight: float

    @property
    def usable_gbps(self) -> float:
        """What the PrfaaS cluster may send it: the link's TCP-effective rate, capped by the
        egress budget."""
        eff = self.tcp.effective_gbps(self.link_gbps)
        return eff if self.egress_budget_gbps is None else min(eff, self.egress_budget_gbps)


_TOP_KEYS = {"name", "description", "model", "kv", "hardware", "clusters", "baselines", "link",
             "workload", "planner", "reference", "simulation", "policy", "cache", "pd_clusters"}


def _mapping(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(where, raw, "expected a mapping")
    return raw


def _check_keys(raw: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}", raw[key],
                              f"unknown key; allowed: {sorted(allowed)}")


def _number(raw: dict[str, Any], key: str, where: str, positive: bool = True) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}.{key}", value, "missing or not a number")
    if positive and value <= 0:
        raise ConfigError(f"{where}.{key}", value, "must be positive")
    return float(value)


def _count(raw: dict[str, Any], key: str, where: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key}", value, "missing or not an integer")
    if value <= 0:
        raise ConfigError(f"{where}.{key}", value, "must be at least 1")
    return value


def _resolve(path: object, base: str) -> str:
    """A path in a scenario is relative to the scenario file's folder when not found as is."""
    p = Path(str(path))
    if not p.is_absolute() and not p.exists() and base:
        return str(Path(base).parent / p)
    return str(p)


def _kv(raw: dict[str, Any], model: ModelSpec | None, base: str = "") -> KVSize:
    raw = _mapping(raw, "kv")
    if "profile" in raw:
        return kv_from_profile(_resolve(raw["profile"], base))
    if raw.get("from") == "model":
        if model is None:
            raise ConfigError("kv.from", "model", "needs a `model:` in the scenario")
        return KVSize.from_geometry(geometry(model))
    _check_keys(raw, {"fit", "points", "source"}, "kv")
    points = raw.get("points")
    if not isinstance(points, list) or len(points) < 2:
        raise ConfigError("kv.points", points, "need a list of >= 2 {length_tokens, mib|bytes}")
    lengths, sizes = [], []
    for i, p in enumerate(points):
        p = _mapping(p, f"kv.points[{i}]")
        lengths.append(_number(p, "length_tokens", f"kv.points[{i}]"))
        sizes.append(_number(p, "bytes", f"kv.points[{i}]") if "bytes" in p
                     else _number(p, "mib", f"kv.points[{i}]") * MIB)
    return KVSize.fit(lengths, sizes, str(raw.get("source", "")))


def _prefill(raw: object, where: str, built: dict[str, HardwareProfile], model: ModelSpec | None,
             gpus: int) -> PrefillTime:
    raw = _mapping(raw, where)
    if "scale_of" in raw:
        _check_keys(raw, {"scale_of", "factor", "source"}, where)
        base = built.get(str(raw["scale_of"]))
        if base is None or base.prefill is None:
            raise ConfigError(f"{where}.scale_of", raw["scale_of"],
                              "must name a hardware with a prefill profile defined above it")
        return base.prefill.scaled(_number(raw, "factor", where), str(raw.get("source", "")))
    if "roofline" in raw:
        if model is None:
            raise ConfigError(f"{where}.roofline", raw["roofline"], "needs a `model:`")
        r = _mapping(raw["roofline"], f"{where}.roofline")
        _check_keys(r, {"gpu", "mfu", "overhead_s"}, f"{where}.roofline")
        prof = roofline_profile(model, str(r.get("gpu")), gpus, float(r.get("mfu", 0.4)),
                                float(r.get("overhead_s", 0.3)))
        assert prof.prefill is not None
        return prof.prefill
    _check_keys(raw, {"fit", "points", "source"}, where)
    points = raw.get("points")
    if not isinstance(points, list):
        raise ConfigError(f"{where}.points", points, "need a list of {length_tokens, time_s}")
    xs = [_number(_mapping(p, f"{where}.points[{i}]"), "length_tokens", f"{where}.points[{i}]")
          for i, p in enumerate(points)]
    ys = [_number(p, "time_s", f"{where}.points[{i}]") for i, p in enumerate(points)]
    return PrefillTime.fit(xs, ys, str(raw.get("source", "")))


def _decode(raw: object, where: str) -> DecodeTime:
    raw = _mapping(raw, where)
    _check_keys(raw, {"bs_max", "step_s", "step_points", "source"}, where)
    points: tuple[tuple[int, float], ...] = ()
    if "step_points" in raw:
        points = tuple((int(p["batch"]), float(p["step_s"])) for p in raw["step_points"])
    bs_max = _count(raw, "bs_max", where)
    step = (_number(raw, "step_s", where) if "step_s" in raw
            else dict(points).get(bs_max, points[-1][1] if points else 0.0))
    return DecodeTime(bs_max, step, points, str(raw.get("source", "")))


def _hardware(raw: object, kv: KVSize, model: ModelSpec | None, base: str = ""
              ) -> dict[str, HardwareProfile]:
    built: dict[str, HardwareProfile] = {}
    for name, spec in _mapping(raw, "hardware").items():
        where = f"hardware.{name}"
        spec = _mapping(spec, where)
        if "profile" in spec:
            _check_keys(spec, {"profile", "notes"}, where)
            # the scenario's key names the hardware (pools refer to it), not the file's own name
            built[name] = replace(load_profile_file(_resolve(spec["profile"], base), kv),
                                  name=name)
            continue
        _check_keys(spec, {"gpus_per_instance", "prefill", "decode", "notes", "gpu",
                           "cost_per_gpu_hour"}, where)
        gpus = _count(spec, "gpus_per_instance", where)
        prefill = _prefill(spec["prefill"], f"{where}.prefill", built, model, gpus) \
            if "prefill" in spec else None
        decode = _decode(spec["decode"], f"{where}.decode") if "decode" in spec else None
        cost = _number(spec, "cost_per_gpu_hour", where) if "cost_per_gpu_hour" in spec else None
        built[name] = HardwareProfile(name, gpus, prefill, decode, kv, str(spec.get("notes", "")),
                                      cost)
    return built


def _pool(raw: object, where: str, hardware: dict[str, HardwareProfile]) -> Pool:
    raw = _mapping(raw, where)
    _check_keys(raw, {"hardware", "instances", "gpus"}, where)
    hw_name = raw.get("hardware")
    if hw_name not in hardware:
        raise UnknownNameError(f"{where}.hardware", hw_name, list(hardware))
    return Pool(hardware[str(hw_name)], _count(raw, "instances", where))


def parse_scenario(raw: object, path: str = "") -> Scenario:
    raw = _mapping(raw, "scenario")
    _check_keys(raw, _TOP_KEYS, "scenario")
    if "pd_clusters" in raw:
        return _parse_regions(raw, path)
    model = resolve_model(str(raw["model"])) if raw.get("model") else None
    kv = _kv(raw.get("kv", {"from": "model"}), model, path)
    hardware = _hardware(raw.get("hardware"), kv, model, path)
    clusters = _mapping(raw.get("clusters"), "clusters")
    baselines = _mapping(raw.get("baselines", {}), "baselines")
    prfaas = _pool(clusters.get("prfaas"), "clusters.prfaas", hardware)
    pd = _pool(clusters.get("pd"), "clusters.pd", hardware)
    homog = _pool(baselines.get("homogeneous_pd", {"hardware": pd.hardware.name,
                  "instances": prfaas.instances + pd.instances}), "baselines.homogeneous_pd",
                  hardware)
    naive = _mapping(baselines.get("naive_heterogeneous", {}), "baselines.naive_heterogeneous")
    naive_p = _pool(naive.get("prefill", {"hardware": prfaas.hardware.name,
                    "instances": prfaas.instances}), "baselines.naive_heterogeneous.prefill",
                    hardware)
    naive_d = _pool(naive.get("decode", {"hardware": pd.hardware.name,
                    "instances": pd.instances}), "baselines.naive_heterogeneous.decode", hardware)
    if pd.instances < 2:
        raise ConfigError("clusters.pd.instances", pd.instances,
                          "the PD cluster needs at least 2 instances (one prefill, one decode)")
    link = _mapping(raw.get("link"), "link")
    _check_keys(link, {"gbps", "intra_gbps", "schedule", "connections", "per_connection_gbps",
                       "pipelined", "order", "release", "rtt_ms", "loss", "mss_bytes",
                       "wire_dtype", "compression", "codec_kv"}, "link")
    workload = _mapping(raw.get("workload"), "workload")
    _check_keys(workload, {"input", "output_tokens", "trace", "arrivals"}, "workload")
    planner = _mapping(raw.get("planner", {}), "planner")
    _check_keys(planner, {"t_step_tokens", "mode"}, "planner")
    mode = str(planner.get("mode", "paper"))
    if mode not in ("paper", "exact"):
        raise ConfigError("planner.mode", mode, "must be paper or exact")
    scenario = Scenario(
        name=str(raw.get("name", Path(path).stem)), description=str(raw.get("description", "")),
        kv=kv, hardware=hardware, prfaas=prfaas, pd=pd, homogeneous=homog,
        naive_prefill=naive_p, naive_decode=naive_d,
        link_gbps=_number(link, "gbps", "link"),
        intra_gbps=_number(link, "intra_gbps", "link") if "intra_gbps" in link else 800.0,
        lengths=from_config(_mapping(workload.get("input"), "workload.input")),
        output_tokens=_count(workload, "output_tokens", "workload"),
        t_step_tokens=int(planner.get("t_step_tokens", 100)), mode=mode, model=model,
        tcp=_tcp(link), wire_dtype=wire_dtype_name(link.get("wire_dtype")),
        compression=_compression(link), link_order=_link_order(link),
        kv_release=parse_release(link.get("release")),
        codec_kv=str(link.get("codec_kv", DEFAULT_CODEC_KV)),
        reference=dict(raw.get("reference") or {}), raw=raw, path=path,
    )
    scenario.wire_kv  # noqa: B018 (a codec without measured figures fails the load, not a run)
    return scenario


# how concurrent transfers cross the inter-cluster link (sim/link.py): interleaved (processor
# sharing) or one at a time in start order
LINK_ORDERS = ("shared", "fifo")


def _link_order(link: dict[str, Any]) -> str:
    order = str(link.get("order", "shared"))
    if order not in LINK_ORDERS:
        raise UnknownNameError("link.order", order, list(LINK_ORDERS))
    return order


def _compression(link: dict[str, Any]) -> str:
    mode = str(link.get("compression", "none"))
    if mode not in COMPRESSION_MODES:
        raise ConfigError("link.compression", mode,
                          f"must be one of {', '.join(COMPRESSION_MODES)}")
    return mode


def _tcp(link: dict[str, Any]) -> TcpPath:
    per = link.get("per_connection_gbps")
    return TcpPath(
        rtt_ms=_number(link, "rtt_ms", "link", positive=False) if "rtt_ms" in link else 0.0,
        loss=_number(link, "loss", "link", positive=False) if "loss" in link else 0.0,
        connections=_count(link, "connections", "link") if "connections" in link else 1,
        mss_bytes=_count(link, "mss_bytes", "link") if "mss_bytes" in link
        else DEFAULT_MSS_BYTES,
        per_connection_gbps=None if per is None else _number(link, "per_connection_gbps",
                                                             "link"))


_REGION_KEYS = {"name", "hardware", "instances", "link", "workload", "tenant_weight"}
_LINK_KEYS = {"gbps", "rtt_ms", "loss", "mss_bytes", "connections", "per_connection_gbps",
              "egress_budget_gbps", "source"}


def _parse_regions(raw: dict[str, Any], path: str) -> Scenario:
    """A scenario with `pd_clusters:`. The single-cluster fields (`clusters.pd`, `link`,
    `workload`) default to the first PD cluster's, so single-cluster commands read the first
    region; the regions themselves are in `Scenario.pd_clusters`."""
    regions = raw["pd_clusters"]
    if not isinstance(regions, list) or not regions:
        raise ConfigError("pd_clusters", regions, "need a list of at least one PD cluster")
    first = _mapping(regions[0], "pd_clusters[0]")
    single = {k: v for k, v in raw.items() if k != "pd_clusters"}
    clusters = dict(_mapping(raw.get("clusters", {}), "clusters"))
    clusters.setdefault("pd", {"hardware": first.get("hardware"),
                               "instances": first.get("instances")})
    single["clusters"] = clusters
    first_link = _mapping(first.get("link"), "pd_clusters[0].link")
    single.setdefault("link", {k: v for k, v in first_link.items()
                               if k not in ("egress_budget_gbps", "source")})
    first_work = _mapping(first.get("workload"), "pd_clusters[0].workload")
    single.setdefault("workload", {k: v for k, v in first_work.items() if k != "rate_rps"})
    base = parse_scenario(single, path)
    parsed = tuple(_region(r, i, base) for i, r in enumerate(regions))
    names = [r.name for r in parsed]
    if len(set(names)) != len(names):
        raise ConfigError("pd_clusters.name", names, "names must be unique")
    extra_raw = _mapping(raw.get("baselines", {}), "baselines").get(
        "whole_request_routing", {"hardware": parsed[0].pool.hardware.name,
                                  "instances": base.prfaas.instances})
    extra = _pool(extra_raw, "baselines.whole_request_routing", base.hardware)
    return replace(base, pd_clusters=parsed, whole_request_extra=extra, raw=raw)


def _region(raw: object, i: int, base: Scenario) -> PdCluster:
    where = f"pd_clusters[{i}]"
    raw = _mapping(raw, where)
    _check_keys(raw, _REGION_KEYS, where)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name", name, "need a non-empty name")
    pool = _pool({"hardware": raw.get("hardware"), "instances": raw.get("instances")}, where,
                 base.hardware)
    if pool.instances < 2:
        raise ConfigError(f"{where}.instances", pool.instances,
                          "a PD cluster needs at least 2 instances (one prefill, one decode)")
    link = _mapping(raw.get("link"), f"{where}.link")
    _check_keys(link, _LINK_KEYS, f"{where}.link")
    work = _mapping(raw.get("workload"), f"{where}.workload")
    _check_keys(work, {"input", "output_tokens", "rate_rps"}, f"{where}.workload")
    budget = link.get("egress_budget_gbps")
    return PdCluster(
        name=name, pool=pool, link_gbps=_number(link, "gbps", f"{where}.link"), tcp=_tcp(link),
        egress_budget_gbps=None if budget is None
        else _number(link, "egress_budget_gbps", f"{where}.link"),
        lengths=from_config(_mapping(work.get("input"), f"{where}.workload.input"),
                            f"{where}.workload.input"),
        output_tokens=_count(work, "output_tokens", f"{where}.workload"),
        rate_rps=_number(work, "rate_rps", f"{where}.workload") if "rate_rps" in work else None,
        tenant_weight=_number(raw, "tenant_weight", where) if "tenant_weight" in raw else 1.0)


def builtin_scenarios() -> list[str]:
    folder = resources.files("prfaas.data").joinpath("scenarios")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()
                  if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str) -> Scenario:
    """Load a built-in scenario by name, or a YAML file by path."""
    path = Path(name_or_path)
    if path.is_file():
        text = read_text(path, "scenario")
    else:
        builtin = resources.files("prfaas.data").joinpath("scenarios", f"{name_or_path}.yaml")
        if not builtin.is_file():
            raise UnknownNameError("scenario", name_or_path, builtin_scenarios())
        text, path = builtin.read_text(), Path(str(builtin))
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError("scenario", str(path), f"not valid YAML ({err})") from None
    return parse_scenario(raw, str(path))
