"""`relayrl eval --model DIR --data FILE (--reward SPEC | --env SPEC)`: a model's held-out score, one JSON line.

With `--reward`, the mean reward of its responses (relayrl/evaluation/single_turn.py); with `--env`, its multi-turn
trajectories scored by the environment (relayrl/evaluation/multi_turn.py). The reward flags are the ones
`relayrl reward` takes (relayrl/commands/reward_flags.py).
"""

from __future__ import annotations

import json

from relayrl.commands.reward_flags import add_reward_flags, parse_kwargs, reward_config


def register(commands) -> None:
    ev = commands.add_parser(
        "eval",
        help="mean reward of a model on a prompt file; prints one JSON line: "
        "reward_mean, n, and the samples the reward failed on (errors, timeouts, skipped)",
    )
    ev.add_argument("--model", required=True, help="a model directory (or an adapter `relayrl export` wrote)")
    ev.add_argument("--data", required=True, help="a prompt file: .jsonl, .parquet or a datasets directory")
    add_reward_flags(ev, required=False)
    ev.add_argument("--env", help="multi-turn: an environment (retry, calculator, module:Class); no --reward needed")
    ev.add_argument("--env-kwargs", default="{}", metavar="JSON", help="with --env: keyword arguments of the class")
    ev.add_argument("--max-turns", type=int, default=4, help="with --env: model turns per trajectory")
    ev.add_argument("--max-total-tokens", type=int, default=512, help="with --env: tokens after the first prompt")
    ev.add_argument("--n", type=int, default=1, help="samples per prompt")
    ev.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy")
    ev.add_argument(
        "--max-tokens",
        type=int,
        help="response tokens per sample (default: the model's generation "
        "config max_new_tokens, else 64, capped so the longest prompt plus the response fits its context)",
    )
    ev.add_argument("--min-tokens", type=int, default=0, help="end-of-sequence ignored before this many tokens")
    ev.add_argument("--prompt-key", default="prompt", help="the column holding the prompt (data.prompt_key)")
    ev.add_argument("--max-prompts", type=int, default=0, help="score only the first N prompts (0 = all)")
    ev.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="the rollout engine that generates")
    ev.set_defaults(fn=run)


def run(args) -> None:
    if args.env:  # multi-turn: the environment scores the trajectories
        return _run_env(args)
    from relayrl.errors import ConfigError
    from relayrl.evaluation.single_turn import evaluate_model

    if not args.reward:
        raise ConfigError("relayrl eval: give --reward (a reward function) or --env (an environment)")
    result = evaluate_model(
        args.model,
        args.data,
        reward_config(args, "relayrl eval"),
        n=args.n,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        engine=args.engine,
        max_prompts=args.max_prompts,
        prompt_key=args.prompt_key,
    )
    print(json.dumps(result))


def _run_env(args) -> None:
    from relayrl.evaluation.multi_turn import evaluate_env_model

    result = evaluate_env_model(
        args.model,
        args.data,
        args.env,
        parse_kwargs(args.env_kwargs, "relayrl eval: --env-kwargs"),
        max_turns=args.max_turns,
        max_total_tokens=args.max_total_tokens,
        max_tokens=args.max_tokens or 64,
        n=args.n,
        temperature=args.temperature,
        engine=args.engine,
        max_prompts=args.max_prompts,
        seed=0,
        prompt_key=args.prompt_key,
    )
    print(json.dumps(result))
