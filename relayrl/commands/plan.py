"""`relayrl plan [CONFIG] [key=value ...]`: memory per role, placement and step time of a config on a hardware
profile, before a run (relayrl/planner/).

The run's keys (`rollout.n=16`, `placement.learner_ranks=4`) override CONFIG as `relayrl train`'s do; the plan's
own keys, `plan.*` (relayrl/planner/options.py: `plan.hardware=H200`, `plan.learner_ranks=4`, `plan.place=true`),
say what to plan on, with the same strict keys. The flags it took before (`--hardware`, `--learner-ranks`,
`--place`, ...) still work, each as its `plan.*` key (`OLD_FLAGS`), with one deprecation line naming the key=value.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import Config
    from relayrl.planner.options import PlanOptions

# a flag `relayrl plan` took before it spoke config -> its plan.* key
OLD_FLAGS = {
    "--hardware": "plan.hardware",
    "--measure": "plan.measure",
    "--params": "plan.params",
    "--layers": "plan.layers",
    "--hidden": "plan.hidden",
    "--kv-heads": "plan.kv_heads",
    "--head-dim": "plan.head_dim",
    "--vocab": "plan.vocab",
    "--no-master": "plan.fp32_master",
    "--infer-dtype": "plan.infer_dtype",
    "--offload": "plan.offload",
    "--learner-ranks": "plan.learner_ranks",
    "--prompt-tokens": "plan.prompt_tokens",
    "--response-tokens": "plan.response_tokens",
    "--mean-response-tokens": "plan.mean_response_tokens",
    "--place": "plan.place",
    "--nodes": "plan.nodes",
    "--gpus-per-node": "plan.gpus_per_node",
    "--cpus-per-node": "plan.cpus_per_node",
    "--json": "plan.as_json",
}
SWITCHES = {"--measure": "true", "--no-master": "false", "--offload": "true", "--place": "true", "--json": "true"}


def register(commands) -> None:
    from relayrl.commands.old_flags import add_old_flags

    plan = commands.add_parser(
        "plan",
        help="memory per role, placement and step time of a config on a device",
        usage="%(prog)s [-h] [CONFIG] [key=value ...]",
    )
    plan.add_argument("config", nargs="?", help="the run's YAML config (none: the defaults)")
    plan.add_argument(
        "overrides", nargs="*", help="dotted overrides: the run's (rollout.n=16) and the plan's (plan.hardware=H200)"
    )
    plan.add_argument("--simulate", action="store_true", help="the same as plan.simulate=true")
    add_old_flags(plan, OLD_FLAGS, SWITCHES)
    plan.set_defaults(fn=run)


def run(args) -> None:
    """The memory/time plan, or with plan.place the placement dry run."""
    config, options = load(args)
    if not options.place:
        if options.nodes is not None or options.as_json:
            from relayrl.errors import ConfigError

            raise ConfigError("relayrl plan: plan.nodes, plan.gpus_per_node, plan.cpus_per_node and plan.as_json go "
                              "with plan.place=true")  # fmt: skip
        return run_plan(config, options)
    from relayrl.placement.dry_run import SimulatedCluster, place, print_placement

    nodes = options.nodes
    simulated = None if nodes is None else SimulatedCluster(nodes, options.gpus_per_node, options.cpus_per_node)
    placement = place(config, simulated)
    if options.as_json:
        print(placement.to_json())
    else:
        print_placement(placement)


def load(args) -> tuple[Config, PlanOptions]:
    """The resolved run config (CONFIG plus the run's overrides: the engine, sleep and offload the run would get)
    and the plan's own keys (the old flags, then the plan.* overrides)."""
    from relayrl.build import resolve
    from relayrl.commands.old_flags import is_override
    from relayrl.config import load_config
    from relayrl.config.load import load_command_section
    from relayrl.planner.options import PlanOptions

    words = list(args.overrides)
    path = args.config
    if path is not None and is_override(path):  # `relayrl plan key=value ...`: no CONFIG, the defaults
        path, words = None, [path, *words]
    mine = [word for word in words if word.startswith("plan.")] + (["plan.simulate=true"] if args.simulate else [])
    options = load_command_section(PlanOptions, "plan", [*old_overrides(args), *mine])
    run_overrides = [word for word in words if not word.startswith("plan.")]
    return resolve(load_config(path, run_overrides, stacklevel=3)), options


def old_overrides(args) -> list[str]:
    """The plan.* overrides the old flags given stand for, with one deprecation line naming them."""
    from relayrl.commands.old_flags import dest, warn_deprecated

    overrides, replaced = [], []
    for flag, key in OLD_FLAGS.items():
        value = getattr(args, dest(flag))
        if value is not None:
            overrides.append(f"{key}={value}")
            replaced.append(f"{shlex.quote(overrides[-1])} for {flag}")
    warn_deprecated("relayrl plan", replaced)
    return overrides


def run_plan(config: Config, options: PlanOptions) -> None:
    from relayrl.planner import get_profile, load_shape, make_plan
    from relayrl.planner.report import print_plan

    check_lengths(options, config.rollout.max_tokens)
    o = options
    if o.simulate:
        check_simulate(o)
    shape = load_shape(
        config.model.path,
        params=o.params,
        layers=o.layers,
        hidden=o.hidden,
        kv_heads=o.kv_heads,
        head_dim=o.head_dim,
        vocab=o.vocab,
    )
    plan = make_plan(
        config,
        shape,
        get_profile(o.hardware, measure=o.measure),
        fp32_master=o.fp32_master,
        infer_dtype=o.infer_dtype,
        offload=o.offload,
        longest_prompt_tokens=o.prompt_tokens,
        longest_response_tokens=o.response_tokens,
        mean_response_tokens=o.mean_response_tokens,
        measure=o.measure,
        learner_ranks=o.learner_ranks,
    )
    print_plan(plan)
    if o.simulate:  # the learner's bytes per phase on one GPU, simulated (relayrl/planner/simulate.py)
        from relayrl.placement.sections import colocation, learner_settings
        from relayrl.planner.simulate import simulate
        from relayrl.planner.simulate_report import print_simulation

        colocated, offload = colocation(config, as_asked=True).colocated, plan.offload
        simulated = simulate(learner_settings(config), plan.workload, offload)
        print_simulation(plan, simulated, offload, colocated, engine_first=config.placement.mode == "local")


def check_simulate(options: PlanOptions) -> None:
    """The simulation runs a GPU learner built from model.path's config.json: a GPU profile, no shape keys."""
    from relayrl.errors import ConfigError
    from relayrl.planner import PROFILES
    from relayrl.planner.options import SHAPE_KEYS

    if PROFILES.get(options.hardware, PROFILES["cpu"]).kind != "gpu":
        raise ConfigError(f"plan.simulate=true simulates a GPU learner; plan.hardware={options.hardware} is not a GPU")
    given = [f"plan.{key}" for key, _, _ in SHAPE_KEYS if getattr(options, key) is not None]
    if given:
        raise ConfigError(
            f"plan.simulate=true builds the model from model.path's config.json; {', '.join(given)} cannot reshape it"
        )


def check_lengths(options: PlanOptions, max_tokens: int) -> None:
    """The expected lengths are token counts: positive, and the mean response not over the longest."""
    from relayrl.errors import ConfigError

    for key in ("prompt_tokens", "response_tokens", "mean_response_tokens"):
        value = getattr(options, key)
        if value is not None and value <= 0:
            raise ConfigError(f"plan.{key}={value:g}: a number of tokens, more than 0")
    longest = options.response_tokens or max_tokens
    mean = options.mean_response_tokens
    if mean is not None and mean > longest:
        given = "plan.response_tokens" if options.response_tokens else "rollout.max_tokens"
        raise ConfigError(f"plan.mean_response_tokens={mean:g} is over the longest response ({given}={longest:g})")
