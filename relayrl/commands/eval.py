"""`relayrl eval MODEL DATA [key=value ...]`: a model's held-out score as training measures it, one JSON line.

MODEL is `model.path` and DATA `data.eval` of a config loaded as `relayrl train` loads one (the same dotted
overrides: reward.*, env.*, rollout.*, eval.*, data.*; strict keys, did-you-mean) and resolved. The engine, the
reward service and the rollout source are built as training builds them (`relayrl.build.build_evaluation`), and the
source measures the prompts as its own evaluation does (`held_out`): a sample the reward skipped, or a trajectory
the environment dropped, counts as 0. What differs from training's defaults, and why:
- greedy, one response per prompt, unless `eval.temperature` (sampled) or `rollout.n` is given;
- a failing sample is scored 0 and counted rather than stopping the command (`reward.on_error`, and `env.on_error`
  with an environment, default to `zero` here);
- `rollout.max_tokens` left out fits the model (`default_max_tokens`), single-turn.

Single-turn it prints reward_mean, n and the samples the reward failed on (errors, timeouts, skipped); with env.fn
or env.agent (multi-turn), reward_mean, success, first_turn_success, turns_mean, n, errors, timeouts and truncated.
The flags it took before (`--model`, `--reward`, `--max-tokens`, ...) still work, each as the key it sets
(`OLD_FLAGS`), with one deprecation line naming the key=value form.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import Config
    from relayrl.config.data import DataConfig, EvalConfig
    from relayrl.config.env import EnvConfig
    from relayrl.config.model import ModelConfig
    from relayrl.config.rollout import RolloutConfig
    from relayrl.types import Prompt, Sampling

# a flag `relayrl eval` took before it spoke config -> the key it sets; `str` values are quoted (a path stays a
# string), `json` ones parsed as the JSON object they were, the rest read as the key's type reads them
OLD_FLAGS: dict[str, tuple[str, str]] = {
    "--model": ("model.path", "str"),
    "--data": ("data.eval", "str"),
    "--reward": ("reward.fn", "str"),
    "--reward-kwargs": ("reward.kwargs", "json"),
    "--reward-style": ("reward.style", "raw"),
    "--on-error": ("reward.on_error", "raw"),
    "--reward-workers": ("reward.workers", "raw"),
    "--reward-timeout-s": ("reward.timeout_s", "raw"),
    "--max-error-frac": ("reward.max_error_frac", "raw"),
    "--env": ("env.fn", "str"),
    "--env-kwargs": ("env.kwargs", "json"),
    "--max-turns": ("env.max_turns", "raw"),
    "--max-total-tokens": ("env.max_total_tokens", "raw"),
    "--n": ("rollout.n", "raw"),
    "--temperature": ("eval.temperature", "raw"),  # 0 (greedy) sets nothing: greedy is the default
    "--max-tokens": ("rollout.max_tokens", "raw"),
    "--min-tokens": ("rollout.min_tokens", "raw"),
    "--prompt-key": ("data.prompt_key", "str"),
    "--max-prompts": ("eval.max_prompts", "raw"),
    "--engine": ("rollout.engine", "raw"),
}
DEFAULT_MAX_TOKENS = 64  # rollout.max_tokens when the model's generation config sets no max_new_tokens


def register(commands) -> None:
    from relayrl.commands.old_flags import add_old_flags

    ev = commands.add_parser(
        "eval",
        help="a model's held-out score as training measures it; prints one JSON line: reward_mean, n, and the "
        "samples the reward failed on (errors, timeouts, skipped)",
        usage="%(prog)s [-h] MODEL DATA [key=value ...]",
    )
    ev.add_argument("model", nargs="?", help="a model directory (or an adapter `relayrl export` wrote): model.path")
    ev.add_argument("data", nargs="?", help="held-out prompts, .jsonl, .parquet or a datasets directory: data.eval")
    ev.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. reward.fn=exact_match rollout.max_tokens=32 env.fn=retry"
    )
    add_old_flags(ev, {flag: key for flag, (key, _) in OLD_FLAGS.items()}, {})
    ev.set_defaults(fn=run)


def run(args) -> None:
    print(json.dumps(evaluate(config_of(args))))


def config_of(args) -> Config:
    """The config the command line gives: the defaults, the old flags as their keys, MODEL and DATA, then the
    overrides. The old flags' one deprecation line is printed once their values are read."""
    from relayrl.commands.old_flags import is_override, warn_deprecated
    from relayrl.errors import ConfigError

    old, replaced = old_overrides(args)
    words = [word for word in (args.model, args.data) if word is not None] + list(args.overrides)
    paths = [word for word in words if not is_override(word)]
    if len(paths) > 2:
        raise ConfigError(f"relayrl eval: {paths[2]!r} is neither MODEL, DATA nor a key=value override")
    positional = [f"{key}={json.dumps(path)}" for key, path in zip(("model.path", "data.eval"), paths)]
    warn_deprecated("relayrl eval", replaced)
    return load_eval_config([*old, *positional, *filter(is_override, words)], stacklevel=3)


def load_eval_config(overrides: list[str], stacklevel: int = 2) -> Config:
    """The config of an evaluation from its key=value overrides (model.path and data.eval among them), with this
    command's defaults: a failing sample scored 0 and counted (reward.on_error, env.on_error) unless set."""
    from relayrl.config import load_config
    from relayrl.errors import ConfigError

    config = load_config(None, overrides, stacklevel=stacklevel)
    if not config.model.path or not config.data.eval:
        raise ConfigError("relayrl eval: give MODEL and DATA (model.path and data.eval): relayrl eval MODEL DATA")
    if "on_error" not in config.reward.model_fields_set:
        config.reward.on_error = "zero"
    if config.env.multi_turn and "on_error" not in config.env.model_fields_set:
        config.env.on_error = "zero"
    return config


def old_overrides(args) -> tuple[list[str], list[str]]:
    """(the overrides the old flags given stand for, what to write instead of each); a flag whose value cannot be
    read is a ConfigError naming the flag."""
    from relayrl.commands.old_flags import dest
    from relayrl.commands.reward_flags import parse_kwargs

    overrides, replaced = [], []
    for flag, (key, kind) in OLD_FLAGS.items():
        text = getattr(args, dest(flag), None)
        if text is None:
            continue
        if flag == "--temperature" and _is_zero(text):
            replaced.append("no --temperature 0 (greedy is the default; eval.temperature=T samples)")
            continue
        if kind == "json":
            value = json.dumps(parse_kwargs(text, f"relayrl eval: {flag}"))
        else:
            value = json.dumps(text) if kind == "str" else text
        overrides.append(f"{key}={value}")
        replaced.append(f"{key}={shlex.quote(text)} for {flag}")
    return overrides, replaced


def _is_zero(text: str) -> bool:
    try:
        return float(text) == 0
    except ValueError:
        return False


def evaluate(config: Config) -> dict[str, float]:
    """`relayrl eval`'s figures for `config` (model.path scored on data.eval), as one JSON-ready dict."""
    from relayrl.build import build_evaluation

    prompts = held_out_prompts(config.model, config.data, config.eval)
    fit_lengths(config.rollout, config.env, config.data, config.model.path, prompts)
    source, close = build_evaluation(config, prompts)
    sampling = eval_sampling(config.rollout, config.eval, seed=config.train.seed)
    try:
        mean, m = source.held_out(prompts, sampling)
    finally:
        close()
    n = len(prompts) * sampling.n
    if not config.env.multi_turn:
        counts = {key: int(m.get(f"reward/{key}", 0)) for key in ("errors", "timeouts", "skipped")}
        return {"reward_mean": mean, "n": n, **counts}
    return {
        "reward_mean": mean,
        "success": m["env/success"],
        "first_turn_success": m["env/first_turn_success"],
        "turns_mean": m["env/turns_mean"],
        "n": n,
        "errors": int(m["env/errors"]),
        "timeouts": int(m["env/timeouts"]),
        "truncated": m["env/truncated_frac"],
    }


def eval_sampling(r: RolloutConfig, eval_: EvalConfig, seed: int) -> Sampling:
    """Greedy with one response per prompt, unless eval.temperature (sampled, as training's eval/sampled) or
    rollout.n is given; the policy's length rules (rollout.max_tokens, min_tokens, stop) as in training."""
    from relayrl.types import Sampling

    sampled = "temperature" in eval_.model_fields_set
    return Sampling(
        n=r.n if "n" in r.model_fields_set else 1,
        temperature=eval_.temperature if sampled else 0.0,
        max_tokens=r.max_tokens,
        min_tokens=r.min_tokens,
        stop=tuple(r.stop),
        seed=seed,
    )


def held_out_prompts(model: ModelConfig, data: DataConfig, eval_: EvalConfig) -> list[Prompt]:
    """data.eval's prompts (eval.max_prompts of them), read as training reads them; a peft adapter directory
    (`relayrl export`) becomes its merged model first (model.path is set to it)."""
    from relayrl.data.source import load_prompts
    from relayrl.models.loading import check_model_dir, load_tokenizer, merged_model_dir

    model.path = merged_model_dir(model.path)
    check_model_dir(model.path)
    assert data.eval is not None  # config_of checked it
    tokenizer = load_tokenizer(model.path)
    table, _ = load_prompts(
        data.eval, tokenizer, data.max_prompt_tokens, data.on_long_prompt, data.chat_template, data.prompt_key
    )
    return list(table[: eval_.max_prompts or None])  # a large file's lazy table, read whole


def fit_lengths(r: RolloutConfig, env: EnvConfig, data: DataConfig, model: str, prompts: list[Prompt]) -> None:
    """`rollout.max_tokens` left out: `default_max_tokens`; given (single-turn): checked against the model's
    context, the longest prompt named by its file and row. Multi-turn, `env.max_total_tokens` left out is capped
    to what the model's context leaves after the longest prompt (`context_budget` checks one given)."""
    from relayrl.errors import ConfigError
    from relayrl.models.loading import context_length

    row = max(range(len(prompts)), key=lambda i: len(prompts[i].token_ids))
    longest, context = len(prompts[row].token_ids), context_length(model)
    if "max_tokens" not in r.model_fields_set:
        r.max_tokens = default_max_tokens(model, longest)
    if env.multi_turn:
        if context is not None and "max_total_tokens" not in env.model_fields_set:
            env.max_total_tokens = max(1, min(env.max_total_tokens, context - longest))
        return
    if context is not None and longest + r.max_tokens > context:
        raise ConfigError(_over_context(r, data, row, longest, context))
    if r.min_tokens > r.max_tokens:
        raise ConfigError(
            f"relayrl eval: rollout.min_tokens={r.min_tokens} exceeds rollout.max_tokens={r.max_tokens} (for this "
            "model and data when left out); lower rollout.min_tokens"
        )


def _over_context(r: RolloutConfig, data: DataConfig, row: int, longest: int, context: int) -> str:
    """Why the longest prompt (`row`, `longest` tokens) and rollout.max_tokens cannot fit the model's context."""
    path = str(data.eval)
    where = f"{path}:{_row_location(path, row, data.prompt_key)}"
    if longest >= context:
        return (
            f"relayrl eval: the longest prompt ({where}, {longest} tokens) fills the model's context of {context} "
            "tokens, leaving no room for a response; shorten it or set eval.max_prompts"
        )
    return (
        f"relayrl eval: rollout.max_tokens={r.max_tokens} + the longest prompt ({where}, {longest} "
        f"tokens) exceed the model's context of {context} tokens: set rollout.max_tokens={context - longest} or "
        "less (or leave it out to fit the model)"
    )


def default_max_tokens(model: str, longest: int) -> int:
    """The response budget when rollout.max_tokens is left out: the generation config's `max_new_tokens` if set,
    else 64, capped so that the longest prompt (`longest` tokens) plus the response fits the model's context."""
    from relayrl.models.loading import context_length

    context = context_length(model)
    fitted = _generation_max_new_tokens(model) or DEFAULT_MAX_TOKENS
    return fitted if context is None else max(1, min(fitted, context - longest))


def _generation_max_new_tokens(model: str) -> int | None:
    """`max_new_tokens` from the model directory's generation_config.json, if the file sets it."""
    from pathlib import Path

    path = Path(model) / "generation_config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("max_new_tokens")
    return value if isinstance(value, int) and value > 0 else None


def _row_location(data: str, row: int, prompt_key: str) -> str:
    """The `line` (or `row N`) of the `row`-th prompt of a data file, as relayrl's data messages name it."""
    from relayrl.data.source import read_rows

    where = read_rows(data, prompt_key)[row][0]
    return where.rpartition(":")[2]
