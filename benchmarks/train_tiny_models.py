"""Train the tiny models prfaas ships on the standard library's docstrings, a few minutes each.

Models: `native-tiny` (EngineConfig.tiny: KDA:MLA 3:1, byte-level), `native-mimo_like` (SWA:GQA
5:1), `vllm-llama` and `vllm-qwen3_next` (the vLLM test models' configs,
integrations/vllm/model_builder.py, with a byte-level BPE tokenizer of 1,000 tokens trained here
on the same text). Corpus: prfaas.bench.stdlib_text (deterministic; its held-out files give
the evaluation text). Each run starts from the model's seeded random init (seed 0), takes
`--steps` AdamW steps on `--batch` random windows of `--seq` tokens (numpy Generator, seed 0),
evaluates the held-out loss every `--eval-every` steps on fixed held-out windows, then packs
the weights (int8 rows, engine/weights.py) into src/prfaas/data/weights/ and evaluates the
packed model again: the shipped model is the packed one. No EOS is ever a target, so greedy
decoding of the trained models does not stop early (tests compare fixed-length outputs).

    /work/bin/heavy env PYTHONPATH=src python benchmarks/train_tiny_models.py \\
        --model native-tiny --steps 120
    python benchmarks/train_tiny_models.py --plot    # the PNG from the JSON only

Writes (merging per model) benchmarks/results/trained_models.json and
docs/img/trained_models_loss.png.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from prfaas.bench.stdlib_text import digest, split
from prfaas.engine import weights as packed
from prfaas.engine.model import HybridLM
from prfaas.engine.ops import rms_norm
from prfaas.models.engine_config import EngineConfig
from prfaas.models.tokenizer import ByteTokenizer

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "trained_models.json"
PNG = REPO / "docs" / "img" / "trained_models_loss.png"
WEIGHTS = packed.DATA
TOKENIZER = WEIGHTS / "vllm-tokenizer.json"
EVAL_WINDOWS = 16
MODELS = ("native-tiny", "native-mimo_like", "vllm-llama", "vllm-qwen3_next")


# -- data ---------------------------------------------------------------------------------------

def native_ids(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def vllm_tokenizer(train_text: str) -> Any:
    """The BPE tokenizer of the trained vLLM models (trained once, then read from its file)."""
    from tokenizers import Tokenizer

    from prfaas.integrations.vllm.model_builder import train_tokenizer

    if not TOKENIZER.is_file():
        train_tokenizer(train_text.split("\n\n")).save(str(TOKENIZER))
    return Tokenizer.from_file(str(TOKENIZER))


def vllm_ids(tok: Any, text: str) -> np.ndarray:
    # per docstring, so the BPE sees the same pieces as in training; joined by their separator
    sep = tok.encode("\n\n").ids
    out: list[int] = []
    for doc in text.split("\n\n"):
        if doc:
            out += tok.encode(doc).ids + sep
    return np.asarray(out, dtype=np.int64)


def windows(ids: np.ndarray, count: int, seq: int, rng: np.random.Generator,
            bos: int | None) -> torch.Tensor:
    """[count, seq + 1] random windows (BOS first for the byte-level models, as prompts are)."""
    n = seq if bos is None else seq - 1
    starts = rng.integers(0, len(ids) - n - 1, size=count)
    rows = np.stack([ids[s:s + n + 1] for s in starts])
    if bos is not None:
        rows = np.concatenate([np.full((count, 1), bos), rows], axis=1)
    return torch.from_numpy(rows)


# -- models -------------------------------------------------------------------------------------

class Native:
    def __init__(self, preset: str) -> None:
        self.config: EngineConfig = getattr(EngineConfig, preset)(weights="seed", seed=0)
        self.model = HybridLM(self.config)
        self.name = self.config.name

    def params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        out = []
        for row in rows:  # the engine's layers take one sequence [T, D]
            x = self.model.embed[row]
            for block in self.model.blocks:
                x = block.forward_full(x)
            out.append(F.linear(rms_norm(x, self.model.final_norm), self.model.lm_head))
        return torch.stack(out)

    def tensors(self) -> dict[str, np.ndarray]:
        return {n: p.detach().numpy().copy() for n, p in self.model.named_parameters()}

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(torch.from_numpy(arrays[n]))


class HF:
    def __init__(self, arch: str) -> None:
        from transformers import AutoModelForCausalLM

        from prfaas.integrations.vllm.model_builder import hf_config

        torch.manual_seed(0)  # the builder's seeded random init (build_model, weights: seed)
        self.model = AutoModelForCausalLM.from_config(hf_config(arch))
        self.model.float()
        self.name = f"vllm-{arch}"

    def params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(input_ids=rows, use_cache=False).logits
        return out

    def tensors(self) -> dict[str, np.ndarray]:
        return {n: t.detach().float().numpy().copy() for n, t in self.model.state_dict().items()}

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        state = {n: torch.from_numpy(a) for n, a in arrays.items()}
        self.model.load_state_dict(state, strict=True)


def make(model: str) -> Native | HF:
    kind, name = model.split("-", 1)
    return Native(name) if kind == "native" else HF(name)


# -- training -----------------------------------------------------------------------------------

def loss_of(m: Native | HF, rows: torch.Tensor) -> torch.Tensor:
    logits = m.logits(rows[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), rows[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(m: Native | HF, rows: torch.Tensor) -> dict[str, float]:
    """Held-out loss (nats/token), and how peaked the next-token distributions are."""
    logits = torch.cat([m.logits(rows[i:i + 4, :-1]) for i in range(0, len(rows), 4)]).float()
    logp = torch.log_softmax(logits, dim=-1)
    target = rows[:, 1:]
    nll = -logp.gather(-1, target[..., None])[..., 0]
    p = logp.exp()
    return {"loss": float(nll.mean()), "entropy_nats": float(-(p * logp).sum(-1).mean()),
            "top1_prob": float(p.max(-1).values.mean()),
            "top1_accuracy": float((logp.argmax(-1) == target).float().mean())}


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(steps - warmup, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(model: str, steps: int, batch: int, seq: int, lr: float, eval_every: int,
          threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    train_text, held_text = split()
    m = make(model)
    if isinstance(m, Native):
        bos: int | None = ByteTokenizer.bos_id
        train_ids, held_ids = native_ids(train_text), native_ids(held_text)
        vocab = "bytes (258)"
    else:
        bos = None
        tok = vllm_tokenizer(train_text)
        train_ids, held_ids = vllm_ids(tok, train_text), vllm_ids(tok, held_text)
        vocab = f"BPE {tok.get_vocab_size()} ({TOKENIZER.name})"
    rng = np.random.default_rng(0)
    held = windows(held_ids, EVAL_WINDOWS, seq, np.random.default_rng(1), bos)
    params = m.params()
    for p in params.values():
        p.requires_grad_(True)
    decay = [p for n, p in params.items() if p.dim() >= 2]
    flat = [p for n, p in params.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": flat, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    init = evaluate(m, held)
    curve: list[dict[str, float]] = [{"step": 0, "tokens": 0, "heldout_loss": init["loss"]}]
    print(f"{model}: {sum(p.numel() for p in params.values()):,} params, init held-out "
          f"{init['loss']:.3f}", flush=True)
    t0 = time.perf_counter()
    running: list[float] = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, max(steps // 20, 5))
        loss = loss_of(m, windows(train_ids, batch, seq, rng, bos))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        running.append(float(loss.detach()))
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            point = {"step": step + 1, "tokens": (step + 1) * batch * seq,
                     "train_loss": float(np.mean(running)),
                     "heldout_loss": evaluate(m, held)["loss"],
                     "elapsed_s": round(time.perf_counter() - t0, 1)}
            running = []
            curve.append(point)
            print(f"{model} step {step + 1}/{steps}: train {point['train_loss']:.3f} held-out "
                  f"{point['heldout_loss']:.3f} ({point['elapsed_s']:.0f} s)", flush=True)
    wall_s = time.perf_counter() - t0
    for p in params.values():
        p.requires_grad_(False)
    trained = evaluate(m, held)
    arrays = m.tensors()
    record = {"model": m.name, "corpus": "stdlib docstrings (prfaas.bench.stdlib_text)",
              "corpus_sha256_16": digest(train_text), "python": platform.python_version(),
              "steps": steps, "batch": batch, "seq_tokens": seq, "peak_lr": lr, "seed": 0}
    path = WEIGHTS / f"{m.name}.safetensors"
    packed.write(path, arrays, record)
    m.load({n: t.numpy() for n, t in packed.read(path).items()})
    shipped = evaluate(m, held)
    print(f"{model}: held-out {init['loss']:.3f} -> {trained['loss']:.3f} (packed "
          f"{shipped['loss']:.3f}); {path.stat().st_size / 2**20:.1f} MiB", flush=True)
    return {**record, "vocab": vocab, "threads": threads, "wall_s": round(wall_s, 1),
            "tokens_seen": steps * batch * seq, "train_tokens": len(train_ids),
            "heldout_tokens": len(held_ids), "eval_windows": EVAL_WINDOWS,
            "weights_file": str(path.relative_to(REPO)), "weights_bytes": path.stat().st_size,
            "init": init, "trained_fp32": trained, "shipped": shipped, "curve": curve,
            "host": platform.node()}


# -- output -------------------------------------------------------------------------------------

def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results["models"].items():
        c = r["curve"]
        ax.plot([p["tokens"] / 1e6 for p in c], [p["heldout_loss"] for p in c], marker=".",
                label=f"{name} (held-out)")
        ax.plot([p["tokens"] / 1e6 for p in c[1:]], [p["train_loss"] for p in c[1:]],
                linestyle=":", color=ax.lines[-1].get_color())
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("nats per token: bytes (native), BPE (vLLM)\n"
                  "(solid: held-out, dotted: training)")
    ax.set_title("Tiny models on the Python standard library's docstrings")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PNG, dpi=110)
    print(f"wrote {PNG}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=MODELS)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot", action="store_true", help="only redraw the PNG from the JSON")
    args = ap.parse_args()
    results: dict[str, Any] = json.loads(OUT.read_text()) if OUT.is_file() else {
        "what": "the shipped tiny models, trained from their seeded random init on the Python "
                "standard library's docstrings; loss in nats per token of each model's "
                "tokenizer (bytes for native, BPE for vLLM)", "models": {}}
    if args.model:
        run: Callable[..., dict[str, Any]] = train
        results["models"][args.model] = run(args.model, args.steps, args.batch, args.seq,
                                            args.lr, args.eval_every, args.threads)
        results["models"][args.model]["command"] = (
            f"PYTHONPATH=src python benchmarks/train_tiny_models.py --model {args.model} "
            f"--steps {args.steps} --batch {args.batch} --seq {args.seq} --lr {args.lr} "
            f"--eval-every {args.eval_every} --threads {args.threads}")
        OUT.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {OUT}")
    plot(results)


if __name__ == "__main__":
    main()
