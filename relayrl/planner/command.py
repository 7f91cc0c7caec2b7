"""`relayrl plan CONFIG [overrides] --hardware H [--learner-ranks W ...]`: what relayrl/cli.py's plan subcommand runs
(its flags are declared there; this module is imported only when `plan` runs)."""

from __future__ import annotations


def run_plan(args) -> None:
    from relayrl.config import load_config
    from relayrl.errors import ConfigError
    from relayrl.planner import get_profile, load_shape, make_plan
    from relayrl.planner.report import print_plan

    if args.learner_ranks is not None and args.learner_ranks < 1:
        raise ConfigError(f"--learner-ranks {args.learner_ranks}: W is a number of learner ranks, 1 or more")
    config = load_config(args.config, args.overrides)
    check_lengths(args, config)
    shape = load_shape(
        config.model.path,
        params=args.params,
        layers=args.layers,
        hidden=args.hidden,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        vocab=args.vocab,
    )
    hardware = get_profile(args.hardware, measure=args.measure)
    print_plan(
        make_plan(
            config,
            shape,
            hardware,
            fp32_master=not args.no_master,
            infer_dtype=args.infer_dtype,
            offload=args.offload,
            longest_prompt_tokens=args.prompt_tokens,
            longest_response_tokens=args.response_tokens,
            mean_response_tokens=args.mean_response_tokens,
            measure=args.measure,
            learner_ranks=args.learner_ranks,
        )
    )


def check_lengths(args, config) -> None:
    """The expected lengths are token counts: positive, and the mean response not over the longest."""
    from relayrl.errors import ConfigError

    for flag in ("prompt_tokens", "response_tokens", "mean_response_tokens"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} {value:g}: a number of tokens, more than 0")
    longest = args.response_tokens or config.rollout.max_tokens
    if args.mean_response_tokens is not None and args.mean_response_tokens > longest:
        given = "--response-tokens" if args.response_tokens else "rollout.max_tokens"
        raise ConfigError(
            f"--mean-response-tokens {args.mean_response_tokens:g} is over the longest response ({given} {longest:g})"
        )
