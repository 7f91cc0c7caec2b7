"""Print a `Plan` as one rich table per section: quantity, formula with its inputs, value (a vision-language
model's vision part: vision_report.py)."""

from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.table import Table

from relayrl.planner import PROFILES, Plan
from relayrl.planner import vision_report as vision
from relayrl.planner.estimate import GIB, adapter_params, reference_bytes
from relayrl.planner.prompts import PromptLengths
from relayrl.planner.teacher import memory_row, placement_row, time_formula
from relayrl.planner.timing import gathered_bytes
from relayrl.rollout.choice import HF_BELOW_PARAMS


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB" if x >= 1e9 or x == 0 else f"{x / 1e6:,.2f} MB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _s(x: float) -> str:
    return f"{x * 1e3:,.2f} ms" if x < 1 else f"{x:,.2f} s"


def print_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    for title, rows in _sections(plan):
        table = Table(title=title, title_justify="left", show_header=False, expand=False)
        table.add_column("quantity", style="bold")
        table.add_column("formula")
        table.add_column("value", justify="right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if plan.busy:
        console.print(f"[bold]note:[/] {plan.busy}")
    console.print(f"[bold]recommendation:[/] {plan.advice.line}")
    if advice := engine_advice(plan):
        console.print(f"[bold]engine:[/] {advice}")
    if line := vision.vision_line(plan):
        console.print(f"[bold]vision:[/] {line}")


# Below this size on CPU, vLLM's per-step Python work outweighs the model (the crossover and its figures are
# in relayrl/rollout/choice.py, which `rollout.engine: auto` uses too)
HF_ENGINE_BELOW_PARAMS = HF_BELOW_PARAMS


def engine_advice(plan: Plan) -> str | None:
    """A faster rollout engine for this plan, when the benchmarks show one."""
    if plan.hardware.kind == "cpu" and plan.workload.engine == "vllm" and plan.shape.params < HF_ENGINE_BELOW_PARAMS:
        return (
            f"a {_count(plan.shape.params)}-param model on CPU: rollout.engine=hf is faster here (vLLM's per-step "
            "Python work outweighs the model below ~5M params)"
        )
    return None


Rows = list[tuple[str, str, str]]  # (name, formula with its inputs, value)


def _sections(plan: Plan) -> list[tuple[str, Rows]]:
    sections = [("inputs", _input_rows(plan)), ("memory per role", _memory_rows(plan))]
    if plan.shape.vision_params:
        sections.insert(1, ("vision (relayrl/planner/vision.py)", vision.vision_rows(plan)))
    if plan.workload.learner_ranks > 1 or not one_rank_fits(plan):
        sections.append(("learner ranks (FSDP2)", _rank_rows(plan)))
    if not one_rank_fits(plan):
        sections.append(("smallest W that fits, per plan.hardware", _smallest_rows(plan)))
    return sections + [
        ("placement", _placement_rows(plan)),
        ("rates", _rate_rows(plan)),
        ("step time", _time_rows(plan)),
    ]


def one_rank_fits(plan: Plan) -> bool:
    m = plan.memory
    return m.states + m.activations + m.logits <= plan.hardware.memory_gb * 1e9


def _rank_rows(plan: Plan) -> Rows:
    w, m, t, hw = plan.workload, plan.memory, plan.time, plan.hardware
    fits = "fits" if m.rank_trainer <= hw.memory_gb * 1e9 else "does not fit"
    return [
        ("W", "placement.learner_ranks, or plan.learner_ranks", f"{w.learner_ranks}"),
        ("states per rank", f"(actor + critic + reference) / W={w.learner_ranks}", _gb(m.states / m.ranks)),
        (
            "activations per rank",
            "activations + logits of its own micro-batch (not divided by W)",
            _gb(m.activations + m.logits),
        ),
        ("weight copies", "bf16 root + one layer, params and grads, FSDP2-gathered", _gb(m.copies)),
        (
            "update phase per rank",
            f"states / W + activations + logits + copies; {fits} M={hw.memory_gb:g} GB",
            _gb(m.rank_trainer),
        ),
        (
            "gather per sync",
            f"{vision.trained_params(plan)} x 4 B x (W - 1)/W = {_gb(gathered_bytes(plan.shape, w))} "
            f"per rank / {hw.link_gbs:g} GB/s",
            _s(t.gather),
        ),
    ]


def _smallest_rows(plan: Plan) -> Rows:
    w = plan.workload
    divides = f"W divides the {w.groups} groups" + (f" and mini_batch {w.mini_batch}" if w.mini_batch else "")
    rows = []
    for name, ranks, per_rank in plan.smallest_ranks:
        memory = PROFILES[name].memory_gb
        value = (
            f"W={ranks} ({_gb(per_rank)} <= {memory:g} GB)" if ranks else f"none (activations + logits {_gb(per_rank)})"
        )
        rows.append((name, f"least W: states / W + activations + logits <= M; {divides}", value))
    return rows


def _input_rows(plan: Plan) -> Rows:
    s, w, hw, pr = plan.shape, plan.workload, plan.hardware, plan.precision
    P, b = s.params, pr.infer_bytes
    train_terms = " + ".join(f"{n} {v}" for n, v in pr.train_terms)
    inputs = [
        (
            "model",
            "P params, layers, hidden, kv heads x head dim, vocab",
            f"{P:,} ({_count(P)}), {s.layers}, {s.hidden}, {s.kv_heads} x {s.head_dim}, {s.vocab:,}",
        ),
        (
            "hardware",
            f"{hw.name} ({hw.source}): memory, BW_mem, peak, BW_link, MFU, devices/node",
            f"{hw.memory_gb:g} GB, {hw.mem_bw_gbs:g} GB/s, {hw.peak_tflops:g} TFLOP/s, {hw.link_gbs:g} GB/s, "
            f"{hw.mfu:g}, {hw.devices_per_node}",
        ),
        ("rollout batch", "prompts_per_step x n", f"{w.rollout_batch}"),
        ("sequence", "max_prompt_tokens + max_tokens", f"{w.prompt_tokens} + {w.response_tokens} = {w.seq_len}"),
        _prompt_row(plan),
        (
            "response tokens",
            "plan.response_tokens (e.g. a previous run's response/length_max)"
            if w.longest_response_tokens is not None
            else "assumed: rollout.max_tokens (every response as long as allowed)",
            f"{w.response:g}",
        ),
        (
            "batch width",
            "longest prompt + longest response expected in a batch",
            f"{w.prompt:g} + {w.response:g} = {w.width:g}",
        ),
        (
            "packing",
            f"train.packing={w.packing}: whole groups in one row when one micro-batch holds the batch "
            "(auto: when that computes >= 10% fewer positions)",
            "on" if w.packed else "off",
        ),
        (
            "tokens per pass",
            "groups x (prompt + n x response): one packed row per group (train.packing)"
            if w.packed
            else "rollout batch x width (the learner pads rows to the longest)",
            f"{w.tokens:,}",
        ),
        ("optimizer steps", "rollout_batch / mini_batch x epochs", f"{w.optimizer_steps}"),
        ("b_train", train_terms, f"{pr.train_bytes} B/param"),
        ("b_infer", "engine and reference weights", f"{b} B/param"),
    ]
    return inputs


def _prompt_row(plan: Plan) -> tuple[str, str, str]:
    """What the planner read from data.train (relayrl/planner/prompts.py), or why it did not."""
    p, w = plan.prompts, plan.workload
    if isinstance(p, PromptLengths):
        return (
            "prompt tokens",
            f"{p.sampled} of {p.rows:,} rows of {p.source} through the tokenizer and template: mean, p95, "
            f"longest; expected longest of {p.batch} prompts (the {p.batch}/{p.batch + 1} quantile)",
            f"{p.mean:.1f}, {p.p95:g}, {p.longest}; {p.batch_longest:g}",
        )
    given = "plan.prompt_tokens" if w.longest_prompt_tokens is not None else "data.max_prompt_tokens"
    return ("prompt tokens", f"{given} (data.train not read: {p})", f"{w.prompt:g}")


def _memory_rows(plan: Plan) -> Rows:
    s, w, hw, pr, m = plan.shape, plan.workload, plan.hardware, plan.precision, plan.memory
    b = pr.infer_bytes
    kv_budget = (
        f"kv_cache_gib {w.kv_cache_gib:g} GiB"
        if hw.kind == "cpu"
        else f"{m.engine_devices} dev x {w.gpu_memory_utilization:g} x {hw.memory_gb:g} GB - weights"
    )
    trainable = f"P x {pr.train_bytes}"
    if w.lora_rank:  # relayrl/planner/estimate.py: a frozen base, an adapter of A parameters
        trainable = f"P x {b} + A={adapter_params(s, w.lora_rank, w.lora_targets):,} x {pr.train_bytes} (LoRA)"
    reference = f"P x {reference_bytes(w, pr)}" if w.reference else "none (kl.coef = 0)"
    memory = [
        ("actor", vision.actor_formula(plan, trainable), _gb(m.actor)),
        ("critic", trainable if w.critic else "no critic (advantage != gae)", _gb(m.critic)),
        ("reference", "none (LoRA: the base, adapter disabled)" if w.lora_rank else reference, _gb(m.reference)),
        (*memory_row(w, b, m), _gb(m.teacher_apart + m.teacher_kv or m.teacher)),
        ("engine weights", f"P x {b}", _gb(m.engine_weights)),
        (
            "KV bytes/token",
            f"2 x {s.layers} layers x {s.kv_heads} kv heads x {s.head_dim} dim x {b} B",
            f"{m.kv_bytes_per_token:,} B ({m.kv_bytes_per_token / 1024:.1f} KiB)",
        ),
        ("KV capacity", kv_budget, f"{m.kv_capacity / GIB:,.2f} GiB"),
        ("tokens that fit", "KV capacity / KV bytes per token", f"{m.kv_tokens:,}"),
        ("concurrent seqs", f"min(rollout batch {w.rollout_batch}, tokens / {w.seq_len})", f"{m.concurrent:,}"),
        *_learner_rows(plan),
    ]
    return memory


def _micro_batch_rule(w) -> str:
    """How the largest micro-batch is sized (relayrl/planner/estimate.py `Workload.micro_positions`)."""
    sequence = f"prompt {w.prompt_tokens} + response {w.response_tokens}"
    if w.micro_batch_tokens is not None:
        unit = f"whole groups (prompt + {w.group_size} x response)" if w.packing != "none" else "samples"
        return f"train.micro_batch_tokens {w.micro_batch_tokens:,}: {unit} of {sequence} while they fit, at least one"
    if w.packed:
        return f"train.micro_batch {w.micro_batch} rows as packed groups of {sequence} each"
    return f"train.micro_batch {w.micro_batch} rows x ({sequence})"


def _learner_rows(plan: Plan) -> Rows:
    """The update's activations and logits (relayrl/planner/learner_memory.py)."""
    s, w, m, pr = plan.shape, plan.workload, plan.memory, plan.precision
    peak, b = m.learner, pr.activation_bytes
    assert peak is not None  # estimate_memory always sets it
    kept = f"{s.layers} x h" if peak.checkpointing else f"{s.layers} x (4h + 4q + 4kv + 4I + heads)"
    backward = "one layer rebuilt + h (activation checkpointing)" if peak.checkpointing else "3h"
    if peak.chunk > 0:
        logits = f"5 x min(train.logits_chunk {peak.chunk}, response positions) x vocab {s.vocab:,} x 4 B"
    else:
        logits = f"(positions + 5 x response positions) x vocab {s.vocab:,} x 4 B (logits_chunk 0)"
    return [
        ("micro-batch", _micro_batch_rule(w), f"{peak.positions:,} positions ({peak.response_positions:,} response)"),
        (
            "activations",
            f"positions x (kept {kept} + 2h; backward {backward}) x {b} B + 32 B (batch copy)",
            _gb(m.activations),
        ),
        ("logits", logits, _gb(m.logits)),
    ]


def _placement_rows(plan: Plan) -> Rows:
    w, hw, m, pl = plan.workload, plan.hardware, plan.memory, plan.placement
    if pl.ranks > 1:
        return _rank_placement_rows(plan)
    resident = "0 (offloaded)" if plan.offload else "actor + critic + reference + teacher"
    if hw.kind == "cpu":
        colocated_rule, rollout_rule = f"ceil(peak / M={hw.memory_gb:g} GB)", "ceil(engine / M)"
    else:
        room = f"M={hw.memory_gb:g} GB" if plan.sleep else f"(1 - {w.gpu_memory_utilization:g}) x M, engine awake"
        colocated_rule = (
            f"max(ceil(train / {room}), ceil(resident / ((1 - "
            f"{w.gpu_memory_utilization:g}) x M)), engine devices {m.engine_devices})"
        )
        rollout_rule = "engine devices"
    colocated_rule += " + teacher" if pl.teacher_devices else ""
    host = " + teacher's actor" if m.teacher_apart and not pl.teacher_devices else ""  # on a CPU: the host's memory
    placement = [
        ("generate phase", f"engine weights + KV + {resident}{host}", _gb(pl.generate_phase)),
        ("train phase", f"actor + critic + reference + teacher + activations + logits{host}", _gb(pl.train_phase)),
        ("push phase", "rollout.sleep: engine weights + the states, before the offload", _gb(pl.push_phase)),
        ("colocated peak", "max(generate, train, push)", _gb(pl.colocated_peak)),
        ("colocated devices", colocated_rule, f"{pl.colocated_devices}"),
        ("disaggregated", "engine + trainer", _gb(pl.disaggregated)),
        (
            "disaggregated devices",
            f"trainer ceil(train / M) + rollout {rollout_rule}" + (" + teacher" if pl.teacher_devices else ""),
            pl.device_sum,
        ),
        *placement_row(m, pl.teacher_devices),
    ]
    return placement


def _rank_placement_rows(plan: Plan) -> Rows:
    """relayrl/planner/estimate.py `place_ranks`: W ranks, one device each."""
    w, hw, pl = plan.workload, plan.hardware, plan.placement
    beside = "M - engine" if hw.kind == "cpu" else f"(1 - {w.gpu_memory_utilization:g}) x M"
    resident = "0 (offloaded)" if plan.offload else f"states / W={pl.ranks}"
    return [
        (
            "generate phase",
            f"per device: engine / {pl.rollout_devices} device(s) + {resident} (<= {beside})",
            _gb(pl.generate_phase),
        ),
        (
            "train phase",
            f"per rank: states / W + activations + logits (<= {'M' if plan.sleep or hw.kind == 'cpu' else beside})",
            _gb(pl.train_phase),
        ),
        ("push phase", f"rollout.sleep: engine weights / {pl.rollout_devices} + states / W (<= M)", _gb(pl.push_phase)),
        ("colocated devices", f"max(W, engine devices {pl.rollout_devices})", f"{pl.colocated_devices}"),
        ("disaggregated", "engine + W x train phase", _gb(pl.disaggregated)),
        ("disaggregated devices", "W ranks + rollout engine devices", pl.device_sum),
    ]


def _flops(x: float) -> str:
    return f"{x / 1e9:,.1f} GFLOP/s" if x < 1e12 else f"{x / 1e12:,.1f} TFLOP/s"


def _rate_rows(plan: Plan) -> Rows:
    r, s = plan.rates, plan.shape
    rows = [
        ("source", r.source, ""),
        (
            "matmul weights",
            f"P - T - C {s.text_params:,} - embedding lookup (untied) = linear layers + LM head"
            if s.vision_params
            else f"P {s.params:,} - embedding lookup (untied) = linear layers + LM head",
            f"{s.matmul_params:,}",
        ),
        ("update rate", "fwd + bwd at micro-batch tokens", _flops(r.update)),
        ("forward rate", "log-prob passes", _flops(r.forward)),
        ("prefill rate", "the engine's prompt pass", _flops(r.prefill)),
        ("decode rate", f"forward at {plan.time.concurrent} concurrent sequences", _flops(r.decode)),
    ]
    if r.engine is not None:
        e = r.engine
        rows.append(
            (
                "engine fixed costs",
                f"{e.engine}, null model: per call + per step + per token + per sequence; reload per sync + per GB",
                f"{_s(e.per_call)} + {_s(e.per_step)} + {_s(e.per_token)} + {_s(e.per_sequence)}; {_s(e.reload)} "
                f"+ {_s(e.reload_per_byte * 1e9)}/GB",
            )
        )
    if r.learner is not None:
        rows.append(
            (
                "learner fixed costs",
                "relayrl's learner, null model: per update + per micro-batch",
                f"{_s(r.learner.per_update)} + {_s(r.learner.per_micro_batch)}",
            )
        )
    return rows


def _time_rows(plan: Plan) -> Rows:
    s, w, hw, t = plan.shape, plan.workload, plan.hardware, plan.time
    b = plan.precision.infer_bytes
    fwd = f"(2 x {s.matmul_params:,} + 4 x {s.layers} x {s.q_width} x ctx)"  # FLOPs per token of a forward
    dev = f" x {t.train_devices} dev" if t.train_devices > 1 else ""
    ctx, enc = w.prompt + w.response / 2, vision.encoder_term(plan)
    engine = (
        f"{_s(plan.rates.engine.per_call)} + {t.decode_steps:g} steps, "
        f"{w.rollout_batch * w.response_mean / t.replicas:,.0f} "
        f"tokens, {math.ceil(w.rollout_batch / t.replicas)} seqs x their costs"
        if plan.rates.engine
        else "not measured (plan.measure=true)"
    )
    time = [
        (
            "prefill",
            f"{fwd} ctx={w.prompt_mean / 2:.3g} x {w.rollout_batch} x {w.prompt_mean:.3g} mean prompt tokens / forward rate{enc}",
            _s(t.prefill),
        ),
        (
            "decode step",
            f"max(({_count(s.text_params)} x {b} B + {t.concurrent} seqs x ctx={ctx:g} x KV B/token) / "
            f"{hw.mem_bw_gbs:g} GB/s, {t.concurrent} x {fwd} / decode rate)",
            f"{_s(t.decode_step)} ({t.decode_bound})",
        ),
        (
            "decode",
            f"{t.decode_waves} wave(s) x {w.response:g} longest response = {t.decode_steps:g} steps x the step at "
            f"the mean batch ({w.response_mean:g} mean response: ended ones leave it)",
            _s(t.decode),
        ),
        ("engine fixed costs", engine, _s(t.engine_overhead)),
        ("generate", "prefill + decode + engine fixed costs", _s(t.generate)),
        (
            "old log-probs",
            f"{fwd} ctx={w.width / 2:g} x {w.tokens:,} tokens / forward rate{dev}{enc}"
            if t.old_logprobs
            else "none (one optimizer step)",
            _s(t.old_logprobs),
        ),
        ("ref log-probs", "as old log-probs" if w.reference else "none (kl.coef = 0)", _s(t.ref_logprobs)),
        ("teacher log-probs", time_formula(w, s.params), _s(t.teacher_logprobs)),
        ("critic", f"(1 + 3 x {w.epochs}) x forward" if w.critic else "no critic", _s(t.critic)),
        *_update_rows(plan, fwd, dev),
        (
            "sync",
            f"{'A (adapter)' if w.lora_sync == 'adapter' else vision.trained_params(plan)} x {b} x r=1 / {hw.link_gbs:g} GB/s"
            + (
                f" + engine reload {_s(plan.rates.engine.reload)} + {_s(plan.rates.engine.reload_per_byte * 1e9)}/GB"
                if plan.rates.engine
                else ""
            ),
            _s(t.sync),
        ),
        ("step", "sum (phases serial)", _s(t.total)),
    ]
    if s.vision_params:  # before the step's sum
        time.insert(-1, ("vision encoder", vision.encoder_formula(plan), _s(t.vision)))
    if w.learner_ranks > 1:  # before the step's sum
        time.insert(
            -1, ("gather", f"all-gathers of the W={w.learner_ranks} ranks' shards (learner ranks)", _s(t.gather))
        )
    return time


def _update_rows(plan: Plan, fwd: str, dev: str) -> Rows:
    """The update phase: FLOPs, the optimizer's bytes, the learner's measured fixed costs."""
    w, t, hw, learner = plan.workload, plan.time, plan.hardware, plan.rates.learner
    fixed = (
        f"{w.optimizer_steps} updates x {_s(learner.per_update)} + {w.micro_batches * w.epochs} micro-batches x "
        f"{_s(learner.per_micro_batch)}"
        if learner
        else "not measured (plan.measure=true)"
    )
    return [
        (
            "update FLOPs",
            f"3 (fwd + bwd) x {fwd} ctx={w.width / 2:g} x {w.tokens:,} tokens x {w.epochs} epochs / update rate{dev}{vision.encoder_term(plan)}",
            _s(t.update),
        ),
        (
            "optimizer",
            f"{w.optimizer_steps} steps x 2 x {plan.precision.train_bytes} B x {vision.trained_params(plan)} / "
            f"{hw.mem_bw_gbs:g} GB/s{dev}",
            _s(t.optimizer),
        ),
        ("learner fixed costs", fixed, _s(t.update_fixed)),
        ("update", "update FLOPs + optimizer + learner fixed costs", _s(t.update_phase)),
    ]
