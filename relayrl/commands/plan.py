"""`relayrl plan CONFIG [overrides] --hardware H [--learner-ranks W ...]`: memory per role, placement and step time
of a config on a hardware profile, before a run (relayrl/planner/)."""

from __future__ import annotations

# the model-shape flags: each overrides a field of model.path's config.json (flag, what it is, an example)
SHAPE_FLAGS = (
    ("params", "parameters in all", "7e9"),
    ("layers", "decoder layers", "32"),
    ("hidden", "hidden size", "4096"),
    ("kv-heads", "key/value heads (grouped-query attention)", "8"),
    ("head-dim", "size of one attention head", "128"),
    ("vocab", "vocabulary size", "152064"),
)


def register(commands) -> None:
    plan = commands.add_parser("plan", help="memory per role, placement and step time of a config on a device")
    plan.add_argument("config", help="the run's YAML config")
    plan.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=16")
    plan.add_argument("--hardware", default="H100-80GB", help="H100-80GB, H200, A100-80GB, A10G, L4 or cpu")
    plan.add_argument(
        "--measure",
        action="store_true",
        help="measure this CPU (--hardware cpu): bandwidth, peak "
        "FLOP/s, the model's matmuls at the plan's shapes, the engine's fixed costs (~30 s)",
    )
    for flag, what, example in SHAPE_FLAGS:
        plan.add_argument(
            f"--{flag}", type=float, help=f"the model's {what}, instead of config.json's (e.g. {example})"
        )
    plan.add_argument("--no-master", action="store_true", help="no fp32 master copy: 12 instead of 16 B/param (GPU)")
    plan.add_argument(
        "--infer-dtype",
        choices=["bf16", "fp8", "fp32"],
        help="engine/reference weights (default: bf16 on GPU, fp32 on CPU)",
    )
    plan.add_argument("--offload", action="store_true", help="trainer states leave the device while generating")
    plan.add_argument("--learner-ranks", type=int, metavar="W", help="learner ranks (default placement.learner_ranks)")
    plan.add_argument(
        "--prompt-tokens",
        type=float,
        help="expected longest prompt of a batch (default "
        "data.max_prompt_tokens): the learner pads every row to the batch's longest sequence",
    )
    plan.add_argument(
        "--response-tokens",
        type=float,
        help="expected longest response of a batch (default "
        "rollout.max_tokens); e.g. a previous run's response/length_max",
    )
    plan.add_argument(
        "--mean-response-tokens",
        type=float,
        help="expected mean response (default the longest): compute-bound decode and the engine's per-token "
        "costs scale with it as the batch thins; e.g. a previous run's response/length_mean",
    )
    place = plan.add_argument_group("placement dry run (relayrl/placement/dry_run.py)")
    place.add_argument(
        "--place",
        action="store_true",
        help="place the roles on Ray as the run would (placement.address, this machine, or --nodes) and print "
        "where each lands: node, bundle, GPU ids, CPUs; starts no engine and loads no weights",
    )
    place.add_argument("--nodes", type=int, help="with --place: simulate a cluster of this many nodes")
    place.add_argument("--gpus-per-node", type=int, default=0, help="with --nodes: logical GPUs on each node")
    place.add_argument("--cpus-per-node", type=int, default=8, help="with --nodes: CPUs on each node (default 8)")
    place.add_argument("--json", action="store_true", help="with --place: the rows as a JSON list of objects")
    plan.set_defaults(fn=run)


def run(args) -> None:
    """The memory/time plan, or with --place the placement dry run."""
    if not args.place:
        if args.nodes is not None or args.json:
            from relayrl.errors import ConfigError

            raise ConfigError("relayrl plan: --nodes, --gpus-per-node, --cpus-per-node and --json go with --place")
        return run_plan(args)
    from relayrl.build import resolve
    from relayrl.config import load_config
    from relayrl.placement.dry_run import SimulatedCluster, place, print_placement

    config = resolve(load_config(args.config, args.overrides))  # tensor_parallel sizes the engine bundles
    simulated = None if args.nodes is None else SimulatedCluster(args.nodes, args.gpus_per_node, args.cpus_per_node)
    placement = place(config, simulated)
    if args.json:
        print(placement.to_json())
    else:
        print_placement(placement)


def run_plan(args) -> None:
    from relayrl.build import resolve
    from relayrl.config import load_config
    from relayrl.errors import ConfigError
    from relayrl.planner import get_profile, load_shape, make_plan
    from relayrl.planner.report import print_plan

    if args.learner_ranks is not None and args.learner_ranks < 1:
        raise ConfigError(f"--learner-ranks {args.learner_ranks}: W is a number of learner ranks, 1 or more")
    config = resolve(load_config(args.config, args.overrides))  # the engine, sleep and offload the run would get
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
