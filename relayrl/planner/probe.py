"""`relayrl plan plan.measure=true`, at the model's own sizes: matmul rates at the shapes a pass feeds them, and the
rollout engine's fixed costs. Measured on this machine, nothing assumed.

- Matmul rates. A big square matmul runs near peak; a 128-wide model's matmuls do not. So the model's own
  linear layers (q, k, v, o, gate, up, down and the LM head, Llama-family names) are timed, forward, at the
  rows the engine feeds them: a micro-batch's tokens for prefill, the concurrent sequences for one decode
  step. Rate = FLOPs of those matmuls / their measured time. (The learner's passes are timed through the
  model's own layers: relayrl/planner/pass_probe.py.)
- Engine overheads. The config's rollout engine, through relayrl's own engine class, generates with a null
  model (the run's layer count at hidden 64: its compute is negligible, its per-layer fixed costs, kernel calls
  and weight handles per layer, are the run's) on a grid of batch sizes and lengths. A least-squares
  fit of `time = per_call + per_step x decode steps + per_token x generated tokens + per_sequence x sequences`
  over the grid separates what an engine iteration, a sampled token and a request cost apart from the model.
  Then `load_weights` of the null model's own weights and of the same layers at hidden 512, best of 3 each:
  a weight sync's fixed cost (vLLM's reload path, which rebuilds each linear layer's weight handle, the
  prefix-cache reset; on HF a copy per tensor) and its cost per byte. A one-layer null model read 3.4 ms
  where the runs' reloads took 7-36 ms, growing with their layers: hence the run's layer count.
- The learner's fixed costs per update and per micro-batch: relayrl/planner/learner_probe.py, on a one-layer
  null model (its layers' work, Python calls included, is in the passes timed by relayrl/planner/pass_probe.py).
Left out: the engine's attention kernels and elementwise ops at the run's width (prefill and decode are
counted at the matmul rates); the training loop's Python overhead between phases.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, replace

from relayrl.models.shape import ModelShape
from relayrl.planner.hardware import best_time, warm_up
from relayrl.planner.learner_probe import LearnerOverhead

# (batch of prompts x n=8, max_tokens): a grid whose rows are linearly independent in (1, steps, tokens, seqs)
ENGINE_GRID = ((1, 2), (1, 24), (32, 2), (32, 24), (8, 12))
ENGINE_N = 8


@dataclass(frozen=True)
class MatmulRates:
    """Achieved FLOP/s of the model's linear layers, forward, at the engine's rows (measured); the learner's
    passes are timed through the model's own layers (relayrl/planner/pass_probe.py)."""

    prefill: float  # at a micro-batch's tokens
    decode: float  # at the concurrent sequences of one decode step
    prefill_rows: int
    decode_rows: int


@dataclass(frozen=True)
class EngineOverhead:
    """Seconds the engine spends apart from the model's FLOPs and bytes (measured with a null model)."""

    per_call: float
    per_step: float  # one engine iteration: scheduling, input preparation, kernel launches
    per_token: float  # one sampled token of one sequence: sampling, its log-prob, detokenising
    per_sequence: float  # one sequence: request set-up and the returned Rollout
    engine: str
    reload: float = 0.0  # one `load_weights`' fixed cost (the engine's reload per layer, caches reset)
    reload_per_byte: float = 0.0  # and its cost per byte of weights (copied in, repacked for the kernels)


def linear_shapes(shape: ModelShape) -> list[tuple[int, int, int]]:
    """(in, out, how many per forward) of every matmul with weights: per layer q, k, v, o, gate, up, down;
    once, the LM head."""
    if shape.heads is None or shape.intermediate is None:
        from relayrl.errors import ConfigError

        raise ConfigError(
            "plan.measure=true times the model's own matmuls: it needs model.path's config.json "
            "(heads and intermediate size), not only the shape flags"
        )
    h, q, kv, i, layers = shape.hidden, shape.q_width, shape.kv_heads * shape.head_dim, shape.intermediate, shape.layers
    return [
        (h, q, layers),
        (h, kv, 2 * layers),
        (q, h, layers),
        (h, i, 2 * layers),
        (i, h, layers),
        (h, shape.vocab, 1),
    ]


def measure_matmul_rates(shape: ModelShape, prefill_rows: int, decode_rows: int, repeats: int = 5) -> MatmulRates:
    warm_up()
    prefill, decode = (_rate(shape, rows, repeats) for rows in (prefill_rows, decode_rows))
    return MatmulRates(prefill, decode, prefill_rows, decode_rows)


def _rate(shape: ModelShape, rows: int, repeats: int) -> float:
    """FLOP/s of every linear layer's forward at `rows` rows."""
    import torch

    flops = seconds = 0.0
    for fan_in, fan_out, count in linear_shapes(shape):
        x, weight = torch.randn(rows, fan_in), torch.randn(fan_out, fan_in)
        seconds += count * best_time(lambda x=x, weight=weight: torch.nn.functional.linear(x, weight), repeats)
        flops += count * 2 * rows * fan_in * fan_out
    return flops / seconds


def measure_engine_overhead(kind: str, layers: int = 1, seed: int = 0) -> tuple[EngineOverhead, LearnerOverhead]:
    """Fit the engine's fixed costs, and the learner's (relayrl/planner/learner_probe.py, first), on a null
    model of `layers` layers in a child process: an in-process vLLM engine keeps threads spinning after it is
    dropped, which slows every later measurement in the process (a 1024^3 matmul 177 -> 71 GFLOP/s)."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "relayrl.planner.probe", kind, str(layers), str(seed)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} engine probe failed:\n{done.stderr[-2000:]}")
    costs = json.loads(done.stdout.strip().splitlines()[-1])
    return EngineOverhead(**costs["engine"]), LearnerOverhead(**costs["learner"])


def probe_engine_here(kind: str, layers: int = 1, seed: int = 0) -> tuple[EngineOverhead, LearnerOverhead]:
    """Fit the engine's fixed costs on ENGINE_GRID with a null model of `layers` layers built in a temporary
    directory, and its reload's (`split_reload`); the learner's fixed costs first, on a one-layer null model
    (before the engine's threads start)."""
    from relayrl.models.tiny import build_tiny
    from relayrl.planner.learner_probe import probe_update_here

    with tempfile.TemporaryDirectory() as one_layer:
        # the learner's per-layer work is in its passes (relayrl/planner/pass_probe.py): one layer here
        build_tiny([NULL_ALPHABET], one_layer, seed=seed, **null_shape(1))
        learner = probe_update_here(one_layer)
    with tempfile.TemporaryDirectory() as model_dir:
        model, tokenizer = build_tiny([NULL_ALPHABET], model_dir, seed=seed, **null_shape(layers))
        engine = _null_engine(kind, model_dir, seed)
        overhead = _fit_grid(engine, tokenizer("0123456789")["input_ids"], kind, seed)
        narrow = reload_point(engine, model)
        del engine
    reload, per_byte = split_reload(narrow, wide_reload_point(kind, layers, seed))
    return replace(overhead, reload=reload, reload_per_byte=per_byte), learner


NULL_ALPHABET = "".join(chr(c) for c in range(33, 127))  # 94 characters: the end token is rarely sampled
WIDE_NULL = dict(hidden=512, heads=8, intermediate=1536)  # 13.6 MB a layer: the bytes of a reload


def null_shape(layers: int, wide: bool = False) -> dict:
    return dict(layers=layers, **(WIDE_NULL if wide else dict(hidden=64, heads=2, intermediate=64)))


def _null_engine(kind: str, model_dir: str, seed: int):
    from relayrl.rollout.build import build_engine

    return build_engine(kind, model_dir, max_model_len=64, seed=seed, kv_cache_gib=1.0)


def _fit_grid(engine, prompt_ids: list[int], kind: str, seed: int) -> EngineOverhead:
    """Best of 3 generate calls at each ENGINE_GRID point, fitted (`fit_engine_overhead`)."""
    from relayrl.types import Prompt, Sampling

    rows, seconds = [], []
    for batch, max_tokens in (ENGINE_GRID[0], *ENGINE_GRID):  # the first call warms up and is dropped
        prompts = [Prompt(id=str(i), text="", token_ids=list(prompt_ids)) for i in range(batch)]
        sampling = Sampling(n=ENGINE_N, temperature=1.0, max_tokens=max_tokens, seed=seed)
        best, rollouts = float("inf"), []
        for _ in range(3):
            start = time.perf_counter()
            rollouts = engine.generate(prompts, sampling, version=0)
            best = min(best, time.perf_counter() - start)
        lengths = [len(r.response_ids) for r in rollouts]
        rows.append([1.0, max(lengths), sum(lengths), len(rollouts)])
        seconds.append(best)
    return fit_engine_overhead(rows[1:], seconds[1:], kind)


def reload_point(engine, model, repeats: int = 3) -> tuple[float, int]:
    """(best seconds, bytes) of `engine.load_weights` with `model`'s weights (the model the engine serves)."""
    seconds = best_time(lambda: engine.load_weights(model.named_parameters(), version=1), repeats)
    return seconds, sum(p.numel() * p.element_size() for p in model.parameters())


def wide_reload_point(kind: str, layers: int, seed: int) -> tuple[float, int]:
    """`reload_point` of a null model of `layers` layers at WIDE_NULL's width, in an engine of its own."""
    from relayrl.models.tiny import build_tiny

    with tempfile.TemporaryDirectory() as model_dir:
        model, _ = build_tiny([NULL_ALPHABET], model_dir, seed=seed, **null_shape(layers, wide=True))
        engine = _null_engine(kind, model_dir, seed)
        point = reload_point(engine, model)
        del engine
    return point


def split_reload(narrow: tuple[float, int], wide: tuple[float, int]) -> tuple[float, float]:
    """(fixed seconds, seconds per byte) of a reload from two (seconds, bytes) points with the same layers.
    vLLM's reload on this CPU moved 7.9 GB/s (8 layers: 0.9 MB 15.7 ms, 27 MB 19.7 ms, 109 MB 29.5 ms), a
    ninth of the memory bandwidth the sync's byte term assumes: it copies each tensor in, then repacks it for
    the CPU kernels."""
    (narrow_s, narrow_b), (wide_s, wide_b) = narrow, wide
    per_byte = max(0.0, (wide_s - narrow_s) / max(1, wide_b - narrow_b))
    return max(0.0, narrow_s - per_byte * narrow_b), per_byte


def fit_engine_overhead(counts: list[list[float]], seconds: list[float], kind: str) -> EngineOverhead:
    """Least squares of seconds on rows of (1, decode steps, generated tokens, sequences); a cost the noise
    pushes below zero is 0."""
    import numpy as np

    coefficients, *_ = np.linalg.lstsq(np.array(counts, dtype=float), np.array(seconds, dtype=float), rcond=None)
    per_call, per_step, per_token, per_sequence = (max(0.0, float(c)) for c in coefficients)
    return EngineOverhead(per_call, per_step, per_token, per_sequence, kind)


if __name__ == "__main__":  # the child process of measure_engine_overhead; vLLM on CPU needs this guard (spawn)
    import json
    import sys
    from dataclasses import asdict

    engine, learner = probe_engine_here(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps({"engine": asdict(engine), "learner": asdict(learner)}))
