"""Print a `Plan` as one rich table per section: quantity, formula with its inputs, value."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from relayrl.planner import Plan
from relayrl.planner.estimate import GIB


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
    console.print(f"[bold]recommendation:[/] {plan.placement.recommendation}")


Rows = list[tuple[str, str, str]]  # (name, formula with its inputs, value)


def _sections(plan: Plan) -> list[tuple[str, Rows]]:
    return [("inputs", _input_rows(plan)), ("memory per role", _memory_rows(plan)),
            ("placement", _placement_rows(plan)), ("step time", _time_rows(plan))]


def _input_rows(plan: Plan) -> Rows:
    s, w, hw, pr = plan.shape, plan.workload, plan.hardware, plan.precision
    P, b = s.params, pr.infer_bytes
    train_terms = " + ".join(f"{n} {v}" for n, v in pr.train_terms)
    inputs = [
        ("model", "P params, layers, hidden, kv heads x head dim, vocab",
         f"{P:,} ({_count(P)}), {s.layers}, {s.hidden}, {s.kv_heads} x {s.head_dim}, {s.vocab:,}"),
        ("hardware", f"{hw.name} ({hw.source}): memory, BW_mem, peak, BW_link, MFU, devices/node",
         f"{hw.memory_gb:g} GB, {hw.mem_bw_gbs:g} GB/s, {hw.peak_tflops:g} TFLOP/s, {hw.link_gbs:g} GB/s, "
         f"{hw.mfu:g}, {hw.devices_per_node}"),
        ("rollout batch", "prompts_per_step x n", f"{w.rollout_batch}"),
        ("sequence", "max_prompt_tokens + max_tokens", f"{w.prompt_tokens} + {w.response_tokens} = {w.seq_len}"),
        ("tokens per pass", "rollout batch x (prompt + expected response)", f"{w.tokens:,}"),
        ("optimizer steps", "rollout_batch / mini_batch x epochs", f"{w.optimizer_steps}"),
        ("b_train", train_terms, f"{pr.train_bytes} B/param"),
        ("b_infer", "engine and reference weights", f"{b} B/param"),
    ]
    return inputs


def _memory_rows(plan: Plan) -> Rows:
    s, w, hw, pr, m = plan.shape, plan.workload, plan.hardware, plan.precision, plan.memory
    b = pr.infer_bytes
    kv_budget = (f"kv_cache_gib {w.kv_cache_gib:g} GiB" if hw.kind == "cpu" else
                 f"{m.engine_devices} dev x {w.gpu_memory_utilization:g} x {hw.memory_gb:g} GB - weights")
    c = pr.activation_c
    memory = [
        ("actor", f"P x {pr.train_bytes}", _gb(m.actor)),
        ("critic", f"P x {pr.train_bytes}" if w.critic else "no critic (advantage != gae)", _gb(m.critic)),
        ("reference", f"P x {b}" if w.reference else "none (kl.coef = 0)", _gb(m.reference)),
        ("engine weights", f"P x {b}", _gb(m.engine_weights)),
        ("KV bytes/token", f"2 x {s.layers} layers x {s.kv_heads} kv heads x {s.head_dim} dim x {b} B",
         f"{m.kv_bytes_per_token:,} B ({m.kv_bytes_per_token / 1024:.1f} KiB)"),
        ("KV capacity", kv_budget, f"{m.kv_capacity / GIB:,.2f} GiB"),
        ("tokens that fit", "KV capacity / KV bytes per token", f"{m.kv_tokens:,}"),
        ("concurrent seqs", f"min(rollout batch {w.rollout_batch}, tokens / {w.seq_len})", f"{m.concurrent:,}"),
        ("activations", f"micro_batch {w.micro_batch} x seq {w.seq_len} x hidden x layers x c={c} B",
         _gb(m.activations)),
        ("logits", "micro_batch x seq x vocab x 4 B (fp32)", _gb(m.logits)),
    ]
    return memory


def _placement_rows(plan: Plan) -> Rows:
    w, hw, m, pl = plan.workload, plan.hardware, plan.memory, plan.placement
    resident = "0 (offloaded)" if plan.offload else "actor + critic + reference"
    if hw.kind == "cpu":
        colocated_rule, rollout_rule = f"ceil(peak / M={hw.memory_gb:g} GB)", "ceil(engine / M)"
    else:
        colocated_rule = (f"max(ceil(train / M={hw.memory_gb:g} GB), ceil(resident / ((1 - "
                          f"{w.gpu_memory_utilization:g}) x M)), engine devices {m.engine_devices})")
        rollout_rule = "engine devices"
    placement = [
        ("generate phase", f"engine weights + KV + {resident}", _gb(pl.generate_phase)),
        ("train phase", "actor + critic + reference + activations + logits", _gb(pl.train_phase)),
        ("colocated peak", "max(generate, train)", _gb(pl.colocated_peak)),
        ("colocated devices", colocated_rule, f"{pl.colocated_devices}"),
        ("disaggregated", "engine + trainer", _gb(pl.disaggregated)),
        ("disaggregated devices", f"trainer ceil(train / M) + rollout {rollout_rule}",
         f"{pl.trainer_devices} + {pl.rollout_devices} = {pl.trainer_devices + pl.rollout_devices}"),
    ]
    return placement


def _time_rows(plan: Plan) -> Rows:
    w, hw, m, t = plan.workload, plan.hardware, plan.memory, plan.time
    b = plan.precision.infer_bytes
    D1 = w.tokens
    peak, ach = f"{hw.peak_tflops:g}T", f"{hw.peak_tflops:g}T x {hw.mfu:g}"
    ach += f" x {t.train_devices} dev"
    engines = f"{t.replicas} x {m.engine_devices} dev"
    time = [
        ("prefill", f"2 x P x {w.rollout_batch * w.prompt_tokens:,} prompt tokens / ({peak} x {engines})",
         _s(t.prefill)),
        ("decode step", f"max(P x {b} / {hw.mem_bw_gbs:g} GB/s, 2 x P x {t.concurrent} seqs / {peak})",
         f"{_s(t.decode_step)} ({t.decode_bound}-bound)"),
        ("decode", f"{t.decode_waves} wave(s) x {w.response_tokens} tokens x step ({t.replicas} replica(s))",
         _s(t.decode)),
        ("old log-probs", f"2 x P x {D1:,} / ({ach})" if t.old_logprobs else "none (one optimizer step)",
         _s(t.old_logprobs)),
        ("ref log-probs", f"2 x P x {D1:,} / ({ach})" if w.reference else "none (kl.coef = 0)", _s(t.ref_logprobs)),
        ("critic", f"(2 + 6 x {w.epochs}) x P x {D1:,} / ({ach})" if w.critic else "no critic", _s(t.critic)),
        ("update", f"6 x P x {D1:,} tokens x {w.epochs} epochs / ({ach})", _s(t.update)),
        ("sync", f"P x {b} x r=1 / {hw.link_gbs:g} GB/s", _s(t.sync)),
        ("step", "sum (lower bound; phases serial)", _s(t.total)),
    ]
    return time
