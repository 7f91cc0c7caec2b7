"""verifiers environments (its v1 API, `verifiers.v1`) trained by relayrl, named by `env.fn: verifiers:TASKSET`.

A verifiers environment is an installed taskset package, named by id (`arith-retry` imports `arith_retry`) and
exporting through `__all__` its `Taskset` (the dataset: typed `Task`s whose `@vf.reward`/`@vf.metric` methods
are the rubric) and optionally an `Env` subclass (the multi-turn hook: `run(task, agents)` drives the agent's
`Interaction` turn by turn), else verifiers' `SingleAgentEnv`.

- `env.fn: verifiers:TASKSET` runs each trajectory as a built-in agent (relayrl/agents/): verifiers' own
  `Env.run_episode(task, ctx)` on the trajectory's endpoint, so the env's hooks, limits, `@stop`s and scoring all
  run as in a verifiers eval; the reward is the trace's (the sum of its weighted rewards), success a reward > 0.
  `env.kwargs` is the environment's config (verifiers' `[env]` table, validated by verifiers: `{feedback: "+",
  taskset: {task: {gamma: 0.5}}}`); its `taskset.id` is TASKSET. An episode that records an error (a rubric
  that raises, a hook that fails) ends its trajectory as an agent that raised does (`env.on_error`), never a 0.
- `data.train: verifiers:TASKSET?key=value&...` (and `data.eval`) is the taskset's tasks as rows
  (relayrl/data/verifiers_tasks.py); each carries its task's wire data (`verifiers_task`), from which the
  trajectory rebuilds the `Task` (`row_task`). A row of another file (`{prompt, answer}`) works as well: its
  columns are validated as the task's data.

Every agent seat is played by relayrl's harness (`relayrl-chat`, relayrl/envs/verifiers_harness.py): a tool-less
chat loop run in this process, one call per segment, through verifiers' interception server. verifiers' own harness programs (bash,
null, codex, ...) are not run: they are uv scripts (`uv sync` needs the network) that stream their calls, which
the endpoint refuses. Left out: tools (MCP toolsets), multi-seat envs (one seat is the policy), verifiers'
classic API (0.4.0 has none: `verifiers.v1` only).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from relayrl.data.verifiers_tasks import INSTALL, PREFIX, one_line
from relayrl.errors import EnvError

MODEL = "policy"  # the model name the calls carry (the endpoint serves the run's policy whatever the name)


def _vf(what: str):
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise EnvError(f"{what} needs the verifiers package, which is not installed: {INSTALL}") from None
    import relayrl.envs.verifiers_harness  # noqa: F401 - registers the `relayrl-chat` harness with verifiers

    return vf


def _taskset_id(spec: str) -> str:
    name = spec.removeprefix(PREFIX)
    if not name:
        raise EnvError(
            f"env.fn={spec!r}: name an installed verifiers taskset after '{PREFIX}' (e.g. verifiers:arith-retry)"
        )
    return name


# ---------------------------------------------------------------------------- the environment


@functools.cache
def load(spec: str, config_json: str = "{}"):
    """The config of the verifiers environment that `env.fn=spec` with `env.kwargs` (as JSON) names, every agent
    seat pinned to relayrl's harness, checked by building the environment once. Each episode builds its own
    (`build`): an `Env` holds its serving resources while an episode runs, so concurrent episodes share none."""
    vf = _vf(f"env.fn={spec!r}")
    taskset_id = _taskset_id(spec)
    kwargs = json.loads(config_json)
    if "taskset" in kwargs and not isinstance(kwargs["taskset"], dict):
        raise EnvError(
            f"env.fn={spec!r}: env.kwargs.taskset is the taskset's config, a mapping; got {kwargs['taskset']!r}"
        )
    if (kwargs.get("taskset") or {}).get("id", taskset_id) != taskset_id:
        raise EnvError(
            f"env.fn={spec!r}: env.kwargs.taskset.id={kwargs['taskset']['id']!r} differs from {taskset_id!r}"
        )
    data = {**kwargs, "taskset": {**(kwargs.get("taskset") or {}), "id": taskset_id}}
    try:
        config = vf.resolve_env_config(data)
    except Exception as err:  # noqa: BLE001 - ModuleNotFoundError (no such taskset), pydantic's ValidationError, ...
        raise EnvError(f"env.fn={spec!r}: {one_line(err)}") from None
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.runtimes import SubprocessConfig

    from relayrl.envs.verifiers_harness import HARNESS_ID, ChatHarnessConfig

    seats = agent_config_fields(config)
    if len(seats) != 1:
        raise EnvError(
            f"env.fn={spec!r}: the environment's config declares {len(seats)} agent seats ({', '.join(seats)}); "
            "relayrl trains one seat, the policy"
        )
    (seat,) = seats
    # the harness runs in this process; the subprocess runtime is verifiers' local one (no container, no tunnel)
    local = {"harness": ChatHarnessConfig.model_validate({"id": HARNESS_ID}), "runtime": SubprocessConfig()}
    pinned = {seat: seats[seat].model_copy(update=local)}
    config = config.model_copy(update={**pinned, "interception": _interception_config()})
    build(spec, config)
    return config


def build(spec: str, env_config: Any):
    """The verifiers environment that `env_config` (verifiers' own config, as `load` resolves it) describes."""
    import verifiers.v1 as vf

    try:
        return vf.load_environment(env_config)
    except Exception as err:  # noqa: BLE001 - whatever the taskset's or env's constructor raises
        raise EnvError(f"env.fn={spec!r}: verifiers cannot build the environment: {one_line(err)}") from None


def _interception_config():
    from verifiers.v1.interception import InterceptionServerConfig

    return InterceptionServerConfig()  # one loopback server per episode (the default pool is for remote runtimes)


def check(spec: str, kwargs: dict[str, Any]) -> None:
    """Whether `env.fn=spec` with `env.kwargs` loads, before anything is built."""
    load(spec, json.dumps(kwargs, sort_keys=True))


async def episode(client, row: dict[str, Any], spec: str, config: dict[str, Any]):
    """One trajectory (an agent function, relayrl/agents/pool.py): the environment's episode of the row's task on
    the trajectory's endpoint (`client.base_url`); its reward, or an EnvError naming what failed in it."""
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig

    env = build(spec, load(spec, json.dumps(config, sort_keys=True)))
    task = row_task(env, row, spec)
    # api_key_var names an unset variable: the key is "EMPTY" (the endpoint takes any), and verifiers' Prime
    # defaults (its own inference URL, a ~/.prime key) stay out of it.
    endpoint = EvalClientConfig(base_url=str(client.base_url).rstrip("/"), api_key_var="RELAYRL_VERIFIERS_NO_KEY")
    async with env.serving():
        result = await env.run_episode(task, ModelContext(model=MODEL, client=endpoint))
    errors = [*result.errors, *(e for trace in result.traces for e in trace.errors)]
    if errors:
        first = errors[0]
        raise EnvError(f"env.fn={spec!r}: the episode failed: {first.type}: {first.message}")
    if len(result.traces) != 1:
        raise EnvError(f"env.fn={spec!r}: the episode ran its agent {len(result.traces)} times; relayrl trains one run")
    (trace,) = result.traces
    if not trace.rewards:
        raise EnvError(f"env.fn={spec!r}: the episode records no reward (its task has no @vf.reward and no judge)")
    return {"reward": trace.reward, "success": trace.reward > 0}


def row_task(env, row: dict[str, Any], spec: str):
    """The `Task` a row names: its `verifiers_task` wire data, else its columns read as the task's data."""
    task_cls = type(env.taskset).task_type()
    data_cls = task_cls.data_type()
    if isinstance(row.get("verifiers_task"), dict):
        fields = row["verifiers_task"]
    else:
        fields = {name: row[name] for name in data_cls.model_fields if name in row and row[name] is not None}
        if "prompt" not in fields and row.get("messages") is not None:
            fields["prompt"] = row["messages"]
    try:
        data = data_cls.model_validate(fields)
    except Exception as err:  # noqa: BLE001 - pydantic's ValidationError, named with the row
        name = f"row id {row['id']!r}" if row.get("id") is not None else "a row"
        raise EnvError(f"env.fn={spec!r}: {name} does not validate as {data_cls.__name__}: {one_line(err)}") from None
    return task_cls(data, env.taskset.config.task)
