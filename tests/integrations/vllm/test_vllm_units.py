"""PrfaasConnector's parts that need no vLLM: params, settings, the topology, the link threads,
block moves, the served model's geometry, and the vLLM command a topology worker becomes."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from needs import needs
from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.link import Finish, RecvLink, SendLink, Tensor
from prfaas.integrations.vllm.params import RecvParams, SendParams, fingerprint, parse
from prfaas.integrations.vllm.server import VllmInstance, VllmSpec
from prfaas.serve.topology import load_topology, parse_topology
from prfaas.transport.receiver import ReceiverConfig
from prfaas.transport.sender import SenderConfig

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "topologies" / "vllm-local-llama.yaml"
HYBRID = ROOT / "topologies" / "vllm-local.yaml"


def test_params_roundtrip_and_bad_values() -> None:
    send = SendParams(7, "127.0.0.1", 9000)
    assert parse(send.to_body()) == send
    assert parse(RecvParams(7, 30.0).to_body()) == RecvParams(7, 30.0)
    assert parse(None) is None and parse({"do_remote_decode": True}) is None
    with pytest.raises(ConfigError, match="transfer_id"):
        parse({"prfaas": {"role": "send"}})
    with pytest.raises(ConfigError, match="role"):
        parse({"prfaas": {"role": "push", "transfer_id": 1}})
    with pytest.raises(ConfigError):
        parse({"prfaas": {"role": "recv", "transfer_id": 0}})


def test_fingerprint_binds_the_prompt() -> None:
    assert fingerprint([1, 2, 3]) == fingerprint([1, 2, 3])
    assert fingerprint([1, 2, 3]) != fingerprint([1, 2, 4])
    assert fingerprint([1, 2, 3]) != fingerprint([1, 2])


def test_vllm_topologies_load_with_their_sections() -> None:
    for path, arch in ((LLAMA, "llama"), (HYBRID, "qwen3_next")):
        topo = load_topology(path)
        assert topo.engine == "vllm" and topo.vllm is not None
        assert topo.vllm.arch == arch
        assert topo.vllm.max_model_len >= 4096
        assert topo.policy_args["threshold_tokens"] == 1024
        assert sorted(w.role for w in topo.workers) == ["pd-d", "pd-p", "prfaas"]
        assert Path(topo.vllm.model_dir).is_absolute()
        # a dumped copy (what the launcher hands each process) reads back the same
        again = parse_topology(json.loads(json.dumps(topo.to_dict())))
        assert again.vllm == topo.vllm and again.workers == topo.workers


def test_topology_rejects_bad_vllm_config() -> None:
    raw = load_topology(LLAMA).to_dict()
    with pytest.raises(ConfigError, match="vllm"):
        parse_topology({**raw, "vllm": None})
    with pytest.raises(ConfigError, match="arch"):
        parse_topology({**raw, "vllm": {**raw["vllm"], "model": {"arch": "gpt2"}}})
    with pytest.raises(ConfigError, match="unknown key"):
        parse_topology({**raw, "vllm": {**raw["vllm"], "max_len": 1}})
    mixed = [dict(raw["workers"][0], engine="native"), *raw["workers"][1:]]
    with pytest.raises(ConfigError, match="one engine"):
        parse_topology({**raw, "workers": mixed})


def test_worker_becomes_the_right_vllm_command() -> None:
    from prfaas.integrations.vllm.deploy import worker_spec

    topo = load_topology(LLAMA).with_ports()
    specs = {w.role: worker_spec(topo, w) for w in topo.workers}
    assert specs["prfaas"].kv_role == "kv_producer"
    assert specs["prfaas"].extra["rate_gbps"] == topo.link.rate_gbps  # the shaped link
    assert specs["pd-p"].extra["rate_gbps"] is None  # the intra link is unshaped
    dec = topo.by_role("pd-d")[0]
    assert specs["pd-d"].kv_role == "kv_consumer" and specs["pd-d"].extra["kv_port"] == dec.kv_port
    cmd = specs["prfaas"].command()
    kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_module_path"] == "prfaas.integrations.vllm.connector"
    assert kv["kv_connector"] == "PrfaasConnector"
    assert specs["pd-d"].environ()["VLLM_CPU_OMP_THREADS_BIND"] == dec.cores
    # the whole instance is pinned, not only vLLM's OMP threads (server.py: cpu_set)
    assert specs["pd-d"].cpu_set() == {int(dec.cores)}


class _FakeServer(VllmSpec):
    """A stand-in for vLLM's server that binds a unix socket in VLLM_RPC_BASE_PATH, as vLLM's
    ZMQ IPC does, then waits to be stopped."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import os, socket, time; "
                "s = socket.socket(socket.AF_UNIX); "
                "s.bind(os.path.join(os.environ['VLLM_RPC_BASE_PATH'], 'ipc')); "
                "time.sleep(120)"]


def test_vllm_ipc_sockets_live_in_a_folder_removed_on_stop(tmp_path: Path) -> None:
    """vLLM leaves a socket file per killed instance in the system temp folder; an instance
    we start keeps them in its own folder, gone after stop, also after a kill and a respawn."""
    inst = VllmInstance(_FakeServer(model_dir="unused", port=1), tmp_path / "fake.log")
    own = tmp_path / "own"
    own.mkdir()
    theirs = VllmInstance(_FakeServer(model_dir="unused", port=1,
                                      env={"VLLM_RPC_BASE_PATH": str(own)}),
                          tmp_path / "theirs.log")
    deadline = time.monotonic() + 120
    try:
        inst.spawn()
        folder = inst._rpc_tmp
        assert folder is not None and Path(folder).parent == Path(tempfile.gettempdir())
        sock = Path(folder) / "ipc"
        while not sock.exists():  # control: the socket is there while the instance runs
            assert time.monotonic() < deadline, inst.log_tail()
            time.sleep(0.05)
        inst.kill()
        inst.spawn()  # a respawn keeps the same folder
        assert inst._rpc_tmp == folder
        inst.stop()
        assert not Path(folder).exists()
        # a folder the caller's environment sets is used as it is, and not removed
        theirs.spawn()
        assert theirs._rpc_tmp is None
        while not (own / "ipc").exists():
            assert time.monotonic() < deadline, theirs.log_tail()
            time.sleep(0.05)
        theirs.stop()
        assert own.is_dir()
    finally:
        inst.stop()
        theirs.stop()
    # so is one a spec names (a deployment's worker, deploy.rpc_dir)
    named = tmp_path / "rpc"
    assert VllmSpec(model_dir="m", port=1, rpc_dir=str(named)).environ()[
        "VLLM_RPC_BASE_PATH"] == str(named)


def test_deployed_worker_keeps_ipc_sockets_in_the_run_dir(tmp_path: Path) -> None:
    from prfaas.integrations.vllm.deploy import rpc_dir

    path = rpc_dir("pdp-0", {"PRFAAS_RUN_DIR": str(tmp_path)})
    assert path == str(tmp_path / "vllm-rpc-pdp-0") and Path(path).is_dir()
    assert rpc_dir("pdp-0", {}) is None  # outside a launcher: vLLM's default


def test_cores_parse_to_cpu_sets_with_a_clear_error() -> None:
    from prfaas.integrations.vllm.server import VllmSpec

    assert VllmSpec("m", 1, cores="0-2,5").cpu_set() == {0, 1, 2, 5}
    assert VllmSpec("m", 1, cores=None).cpu_set() is None
    with pytest.raises(ConfigError, match="cores"):
        VllmSpec("m", 1, cores="one").cpu_set()
    with pytest.raises(ConfigError, match="cannot pin"):
        VllmSpec("m", 1, cores="4095").pin()  # no such CPU here


def test_link_compression_reaches_the_producers_sender_only() -> None:
    from prfaas.integrations.vllm.deploy import worker_spec

    topo = load_topology(LLAMA).with_ports()
    topo = replace(topo, link=replace(topo.link, compression="zstd"))
    specs = {w.role: worker_spec(topo, w) for w in topo.workers}
    assert specs["prfaas"].extra["compression"] == "zstd"
    assert specs["prfaas"].extra["link_rate_gbps"] == topo.link.rate_gbps  # what auto reads
    assert "compression" not in specs["pd-p"].extra  # the intra link stays uncompressed
    assert "compression" not in specs["pd-d"].extra  # a receiver reads the frames' codec bits


def test_served_model_geometry_from_hf_config(tmp_path: Path) -> None:
    from prfaas.integrations.vllm.served_model import ServedModel
    from prfaas.models.kv import geometry

    base = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "hidden_size": 256, "vocab_size": 1024}
    (tmp_path / "config.json").write_text(json.dumps(base))
    llama = geometry(ServedModel("tiny", 4096, 128, str(tmp_path)).to_spec())
    assert llama.kv_bytes_per_token == 4 * 2 * 2 * 64 * 2  # layers * K,V * heads * dim * bf16
    assert llama.linear_state_bytes == 0
    hybrid = {**base, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
              "linear_key_head_dim": 64, "linear_value_head_dim": 64,
              "linear_num_key_heads": 2, "linear_num_value_heads": 4,
              "linear_conv_kernel_dim": 4}
    (tmp_path / "config.json").write_text(json.dumps(hybrid))
    geo = geometry(ServedModel("tiny", 4096, 128, str(tmp_path)).to_spec())
    assert geo.kv_bytes_per_token == 1 * 2 * 2 * 64 * 2
    assert geo.linear_state_bytes > 0


def _wait(link: RecvLink, n: int, timeout_s: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += link.drain()
        time.sleep(0.02)
    return got


def test_send_and_recv_links_carry_a_transfer_and_report_its_end() -> None:
    arrived: list[tuple[int, int, str, np.ndarray]] = []
    recv = RecvLink(ReceiverConfig(port=0), lambda *t: arrived.append(t))
    send = SendLink(SenderConfig(num_connections=3, chunk_bytes=4096))
    try:
        dest = ("127.0.0.1", recv.receiver.port)
        layers = [np.arange(i, i + 5000, dtype=np.uint16).reshape(2, 2500) for i in range(4)]
        recv.expect(11, 20.0)
        for i, a in enumerate(layers):
            send.submit(dest, Tensor(11, i, f"b{i}", a, bfloat16=True))
        send.submit(dest, Finish(11))
        [done] = _wait(recv, 1)
        assert done.transfer_id == 11 and done.error is None
        assert sorted((t[1], t[2]) for t in arrived) == [(i, f"b{i}") for i in range(4)]
        for tid, layer, _, a in arrived:
            assert tid == 11 and np.array_equal(a, layers[layer])
        [sent] = _wait(send, 1)  # type: ignore[arg-type]
        assert sent.error is None and sent.first_s is not None and sent.first_s <= sent.done_s
    finally:
        send.stop()
        recv.stop()


def test_send_link_sends_transfers_to_one_decoder_one_after_another() -> None:
    """What the simulator's `link.order: fifo` stands for (VllmEngineBackend.link_order):
    layers for one decoder cross in the order they were submitted, whichever transfer they
    belong to, on a shaped link with several connections; so a transfer whose prefill starts
    after another's ends waits for it (the native worker's one task per transfer would
    interleave them, 1 2 1 2: processor sharing, `SharedLink`)."""
    arrived: list[int] = []
    recv = RecvLink(ReceiverConfig(port=0), lambda tid, *_: arrived.append(tid))
    send = SendLink(SenderConfig(num_connections=4, chunk_bytes=8192, rate_gbps=0.02,
                                 burst_bytes=16384))
    try:
        dest = ("127.0.0.1", recv.receiver.port)
        layer = np.zeros((2, 16384), dtype=np.uint16)  # 64 KiB a layer, ~26 ms at 2.5 MB/s
        for tid in (1, 2):
            recv.expect(tid, 60.0)
        for i in range(4):  # transfer 1's layers as its prefill makes them, 2's in between
            send.submit(dest, Tensor(1, i, f"a{i}", layer, bfloat16=True))
            if i == 1:
                send.submit(dest, Tensor(2, 0, "b0", layer, bfloat16=True))
        send.submit(dest, Finish(1))
        for i in range(1, 4):
            send.submit(dest, Tensor(2, i, f"b{i}", layer, bfloat16=True))
        send.submit(dest, Finish(2))
        done = {r.transfer_id: r for r in _wait(recv, 2, 60.0)}
        assert done[1].error is None and done[2].error is None
        # submit order, tensor by tensor: 2's first layer between 1's second and third
        assert arrived == [1, 1, 2, 1, 1, 2, 2, 2]
    finally:
        send.stop()
        recv.stop()


def test_send_link_reconnects_to_a_receiver_restarted_on_the_same_port() -> None:
    """A decode instance killed and restarted between two transfers: the producer's idle
    connections lead to the dead process, and the kernel accepts the first frames written to
    them. The next transfer must start on new connections and arrive whole (the live recovery
    run hung on this: the first transfer after a decoder restart failed with PeerGone at the
    producer while the decoder waited for it)."""
    send = SendLink(SenderConfig(num_connections=2, chunk_bytes=4096))
    first = RecvLink(ReceiverConfig(port=0), lambda *t: None)
    port = first.receiver.port
    dest = ("127.0.0.1", port)
    layers = [np.arange(i, i + 3000, dtype=np.uint16) for i in range(3)]

    def transfer(link: RecvLink, tid: int) -> tuple[object, object]:
        link.expect(tid, 10.0)
        for i, a in enumerate(layers):
            send.submit(dest, Tensor(tid, i, f"b{i}", a, bfloat16=True))
        send.submit(dest, Finish(tid))
        [got] = _wait(link, 1, 15.0)
        [sent] = _wait(send, 1, 15.0)  # type: ignore[arg-type]
        return got, sent

    second = None
    try:
        got, sent = transfer(first, 1)
        assert got.error is None and sent.error is None  # type: ignore[attr-defined]
        first.stop()  # the decoder dies: its end of every connection closes
        arrived: list[tuple[int, int, str, np.ndarray]] = []
        second = RecvLink(ReceiverConfig(port=port), lambda *t: arrived.append(t))
        got, sent = transfer(second, 2)
        assert sent.error is None, sent  # type: ignore[attr-defined]
        assert got.error is None, got  # type: ignore[attr-defined]
        assert sorted(layer for _, layer, _, _ in arrived) == [0, 1, 2]
    finally:
        send.stop()
        if second is not None:
            second.stop()


def test_connector_links_carry_zstd_frames_bit_exact() -> None:
    """The connector's links are the transport's KVSender / KVReceiver: a producer configured
    with zstd ships compressed frames, and the consumer's tensors are the bf16 words sent."""
    import torch

    arrived: list[tuple[int, int, str, np.ndarray]] = []
    recv = RecvLink(ReceiverConfig(port=0), lambda *t: arrived.append((*t[:3], t[3].copy())))
    send = SendLink(SenderConfig(num_connections=2, chunk_bytes=64 * 1024, compression="zstd"))
    try:
        dest = ("127.0.0.1", recv.receiver.port)
        rng = np.random.default_rng(5)
        layers = [torch.from_numpy(rng.standard_normal((16, 8192)).astype(np.float32))
                  .to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
                  for _ in range(2)]
        recv.expect(12, 20.0)
        for i, a in enumerate(layers):
            send.submit(dest, Tensor(12, i, f"b{i}", a, bfloat16=True))
        send.submit(dest, Finish(12))
        [done] = _wait(recv, 1)
        assert done.error is None
        for tid, layer, _, a in arrived:
            assert tid == 12 and np.array_equal(a, layers[layer])
        assert len(arrived) == 2 and recv.receiver.stats.compressed_frames > 0
        assert recv.receiver.stats.received_bytes < sum(a.nbytes for a in layers)
    finally:
        send.stop()
        recv.stop()


def test_recv_link_reports_a_timeout_and_a_lost_peer_as_failures() -> None:
    recv = RecvLink(ReceiverConfig(port=0, frame_timeout_s=2.0), lambda *t: None)
    try:
        recv.expect(5, 0.5)  # nobody sends
        [r] = _wait(recv, 1)
        assert r.transfer_id == 5 and r.error is not None and "Timeout" in r.error
    finally:
        recv.stop()


def test_block_gather_scatter_roundtrip_keeps_bf16_bits() -> None:
    import torch

    from prfaas.integrations.vllm.blocks import block_dim, from_wire, gather, scatter, to_wire

    src = torch.randn(16, 2, 8, 32).to(torch.bfloat16)  # [blocks, heads, block, 2*head]
    dst = torch.zeros_like(src)
    assert block_dim(src, 16) == 0
    wire, bf16 = to_wire(gather(src, [3, 7, 1], 0))
    assert bf16 and wire.dtype == np.uint16
    scatter(dst, [0, 1, 2], 0, from_wire(wire, dst))
    assert torch.equal(dst[0], src[3]) and torch.equal(dst[1], src[7]) and torch.equal(
        dst[2], src[1])
    assert torch.count_nonzero(dst[3:]) == 0
    with pytest.raises(Exception, match="shape"):
        scatter(dst, [0, 1], 0, from_wire(wire, dst))  # 3 blocks into 2 slots
    # FlashAttention-style [2, blocks, ...]: the block axis is found by size
    assert block_dim(torch.zeros(2, 16, 8, 4), 16) == 1


@needs("vllm")
def test_model_builder_is_seeded(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from prfaas.engine.weights import read, trained_path
    from prfaas.integrations.vllm.model_builder import build_model, ensure_model, is_built
    from prfaas.integrations.vllm.served_model import HFTokenizer

    a = build_model("llama", tmp_path / "a", seed=3, weights="seed")
    b = build_model("llama", tmp_path / "b", seed=3, weights="seed")
    assert is_built(a) and is_built(a, "llama", 3, "seed") and not is_built(a, "llama")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    tok = HFTokenizer(a)
    ids = tok.encode("the prefill cluster ships kv cache")
    assert ids and max(ids) < tok.vocab_size and tok.decode(ids).startswith("the prefill")
    # the default: the shipped trained weights, exactly as unpacked; a directory built from
    # other weights is rebuilt, not reused
    t = ensure_model("llama", tmp_path / "a")
    assert is_built(t, "llama")
    built, shipped = load_file(str(t / "model.safetensors")), read(trained_path("vllm-llama"))
    assert set(built) == set(shipped)
    assert all(torch.equal(built[k].float(), shipped[k]) for k in built)
    seeded = load_file(str(b / "model.safetensors"))
    assert not torch.equal(seeded["model.embed_tokens.weight"],
                           built["model.embed_tokens.weight"])
    text = HFTokenizer(t).encode("Return the number of items in the list.")
    assert len(text) < 16  # its BPE learned the docstrings' words (bytes would be 39)
    assert replace  # (imported for the other tests' use)


def test_cli_bad_vllm_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "prfaas", *args], capture_output=True,
                              text=True, timeout=120)

    out = run("generate", "--engine", "vllm", "--prompt", "x", "--model", str(tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--model" in out.stderr or "--engine" in out.stderr
    out = run("vllm-model", "--arch", "gpt2", "--out", str(tmp_path / "m"))
    assert out.returncode == 2 and "gpt2" in out.stderr


def test_router_predicts_kv_bytes_in_the_instances_dtypes(tmp_path: Path) -> None:
    from prfaas.integrations.vllm.served_model import ServedModel
    from prfaas.models.kv import KVGeometry, geometry

    hybrid = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "hidden_size": 256, "vocab_size": 1024,
              "layer_types": ["linear_attention"] * 3 + ["full_attention"],
              "linear_key_head_dim": 64, "linear_value_head_dim": 64,
              "linear_num_key_heads": 2, "linear_num_value_heads": 4,
              "linear_conv_kernel_dim": 4}
    (tmp_path / "config.json").write_text(json.dumps(hybrid))

    def geo(*args: str) -> KVGeometry:
        return geometry(ServedModel("tiny", 4096, 128, str(tmp_path), args).to_spec())

    bf16, ssm32 = geo(), geo("--mamba-ssm-cache-dtype", "float32")
    fp32 = geo("--dtype=float32")
    assert fp32.kv_bytes_per_token == 2 * bf16.kv_bytes_per_token
    assert ssm32.kv_bytes_per_token == bf16.kv_bytes_per_token
    # the recurrent state doubles with the SSM cache dtype, the conv state stays in the KV's
    assert bf16.linear_state_bytes < ssm32.linear_state_bytes < 2 * bf16.linear_state_bytes
    assert fp32.linear_state_bytes == 2 * bf16.linear_state_bytes


@needs("vllm")
def test_seed_offset_draws_what_the_sampler_draws() -> None:
    """After `advance(g, k)`, g gives the noise row vLLM's random_sample would draw at step k+1
    (vLLM's own function, on a request's generator): so a resumed request samples as if it had
    never stopped. The control: without the advance, the row is step 1's."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import random_sample

    from prfaas.integrations.vllm.seed_offset import advance, output_offset

    vocab, k, seed = 1000, 5, 7
    probs = torch.softmax(torch.randn(1, vocab, generator=torch.Generator().manual_seed(1)), -1)
    g = torch.Generator().manual_seed(seed)
    uninterrupted = [int(random_sample(probs.clone(), {0: g})[0]) for _ in range(k + 3)]
    resumed_gen = torch.Generator().manual_seed(seed)
    advance(resumed_gen, k, vocab)
    resumed = [int(random_sample(probs.clone(), {0: resumed_gen})[0]) for _ in range(3)]
    assert resumed == uninterrupted[k:]
    fresh = torch.Generator().manual_seed(seed)
    assert [int(random_sample(probs.clone(), {0: fresh})[0]) for _ in range(3)] != resumed
    # the CPU sampler this host runs (per-token seeds into a fused Gumbel-max kernel)
    import vllm._custom_ops  # noqa: F401  (loads the CPU kernels, as the Worker does)
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    from prfaas.integrations.vllm.seed_offset import cpu_seeds

    assert cpu_seeds(False)  # an x86 CPU: what the live llama test runs on
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(2))
    sampler = TopKTopPSampler()

    def cpu_draw(gen: torch.Generator) -> int:
        return int(sampler.forward_cpu(logits.clone(), {0: gen}, None, None)[0][0])

    g = torch.Generator().manual_seed(seed)
    uninterrupted = [cpu_draw(g) for _ in range(k + 3)]
    resumed_gen = torch.Generator().manual_seed(seed)
    advance(resumed_gen, k, vocab, per_token_seed=True)
    assert [cpu_draw(resumed_gen) for _ in range(3)] == uninterrupted[k:]
    fresh = torch.Generator().manual_seed(seed)
    assert [cpu_draw(fresh) for _ in range(3)] != uninterrupted[k:]
    params = SimpleNamespace(extra_args={"kv_transfer_params": {"prfaas": {"output_offset": 3}}})
    assert output_offset(params) == 3 and output_offset(SimpleNamespace(extra_args=None)) == 0


@needs("vllm")
def test_the_prefill_request_runs_two_tokens_and_stays_valid_for_vllm() -> None:
    """The scheduler half lets a prefill run one decode step more (so the worker's byte count
    reaches request_finished); the request's SamplingParams must still pass vLLM's checks
    (the Worker re-validates them: min_tokens 2 with max_tokens 1 killed the engine once)."""
    from vllm.sampling_params import SamplingParams

    from prfaas.integrations.vllm.scheduler_half import SchedulerHalf

    sp = SamplingParams(max_tokens=1, temperature=0.0)
    ids = list(range(3, 103))
    req = SimpleNamespace(request_id="r", kv_transfer_params=SendParams(5, "h", 1).to_body(),
                          prompt_token_ids=list(ids), _all_token_ids=list(ids),
                          num_prompt_tokens=len(ids), max_tokens=1, sampling_params=sp)
    half = SchedulerHalf(SimpleNamespace(has_mamba_layers=True, kv_cache_groups=[]))
    half.on_new_request(req)  # type: ignore[arg-type]
    assert req.max_tokens == 2 and sp.max_tokens == 2 and sp.min_tokens == 2
    assert req.num_prompt_tokens == 99  # a hybrid stops one token short
    sp._verify_args()  # what the Worker runs on the request it receives
