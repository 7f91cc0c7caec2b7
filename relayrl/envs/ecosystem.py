"""The ecosystem's environments as relayrl environments, named by `env.fn` with no glue file.

- `skyrl_gym:ENV_ID` (or `skyrl_gym:package.module:ENV_ID`, the module imported first so it can register its
  environments): `skyrl_gym.make(ENV_ID, env_config=..., extras=...)` per trajectory. `reset(row)` builds it with
  the row as skyrl's `extras` (every column but `prompt`/`messages`/`id`/`env_class`, as SkyRL's generator passes
  a dataset row), `reward_spec.ground_truth` made from the row's `ground_truth` or `answer` column when the row has
  no `reward_spec`, and returns `env.init(messages)`'s observation. `step(action)` maps skyrl's
  `{observations, reward, done, metadata}` onto `Step`; `info.success` is a turn reward >= 1.0 (skyrl's built-ins
  give 1.0 for a correct answer). `env.kwargs`: `env_config` (a dict, handed over as an OmegaConf config, as SkyRL
  does) and `extras` (merged under the row's, e.g. `max_turns`). skyrl's `postprocessed_action` is kept in `info`
  only: relayrl trains on the tokens the engine sampled, never on rewritten text.
- `gymnasium:ENV_ID`: a gymnasium environment with an `ansi` render mode and a `Discrete` action space (the
  toy_text games: FrozenLake-v1, FrozenLake8x8-v1, CliffWalking-v1, Taxi-v4; or any registered `module:Env` of
  that kind), made with `render_mode="ansi"` and `env.kwargs` (e.g. `is_slippery: false`). The observation is the
  board as text (ANSI colours turned into brackets, see `board_text`), after a description on the first turn, and
  the actions the model may name; the model's text is read as an action name or number (`parse_action`), a turn
  that names none hears so and plays nothing. Rewards are gymnasium's per step (env.reward: sum adds them); the
  episode ends when gymnasium terminates or truncates it; `info.success` is an episode that terminated on a
  positive reward. `reset(row)` seeds with the row's `seed` column (else a hash of its prompt).

Each spec gives a class bound to its id (`ecosystem_class`), checked when it is loaded, so the environment
workers (relayrl/envs/pool.py) load it by spec and build it with `env.kwargs` as any class. Left out: skyrl-gym's
tool groups beyond what its environments run themselves, gymnasium's non-text spaces, TextArena (verifiers'
environments are relayrl/envs/verifiers_env.py's).
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from relayrl.envs.base import Step
from relayrl.errors import EnvError

PREFIXES = ("skyrl_gym:", "gymnasium:")
EXAMPLES = {"skyrl_gym": "gsm8k", "gymnasium": "FrozenLake-v1"}  # named when a spec gives no id
INSTALL = "pip install --no-deps -r requirements/cpu.lock (or the `ecosystem` extra: pip install 'relayrl[ecosystem]')"


def is_ecosystem_spec(spec: str) -> bool:
    return spec.startswith(PREFIXES)


def ecosystem_class(spec: str) -> type:
    """The environment class `spec` names, its id checked now (before any worker starts)."""
    kind, _, env_id = spec.partition(":")
    if not env_id:
        raise EnvError(f"env.fn={spec!r}: name an environment after '{kind}:' (e.g. {kind}:{EXAMPLES[kind]})")
    base = SkyRLGymEnv if kind == "skyrl_gym" else GymnasiumTextEnv
    base.check_id(spec, env_id)
    return type(f"{base.__name__}[{env_id}]", (base,), {"env_id": env_id, "spec": spec})


def _require(package: str, spec: str):
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError:
        raise EnvError(f"env.fn={spec!r} needs the {package} package, which is not installed: {INSTALL}") from None


def _row_messages(row: dict[str, Any], spec: str) -> list[dict[str, Any]]:
    value = row.get("messages") if row.get("messages") is not None else row.get("prompt")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, (list, tuple)) and value:
        return [dict(m) for m in value]
    raise EnvError(f"env.fn={spec!r}: {_row_name(row)} needs a 'prompt' or 'messages' column, got {sorted(row)}")


def _row_name(row: dict[str, Any]) -> str:
    return f"row id {row['id']!r}" if row.get("id") is not None else "the row"


class SkyRLGymEnv:
    """A skyrl-gym text environment, one per trajectory (made at `reset`, when the row's extras are known)."""

    env_id = ""
    spec = ""

    def __init__(self, env_config: dict[str, Any] | None = None, extras: dict[str, Any] | None = None):
        from omegaconf import OmegaConf

        self.env_config = OmegaConf.create(dict(env_config or {}))
        self.extras = dict(extras or {})
        self.env: Any = None

    @classmethod
    def check_id(cls, spec: str, env_id: str) -> None:
        skyrl_gym = _require("skyrl_gym", spec)
        module, _, name = env_id.rpartition(":")
        if module:
            _import_registering(module, spec)
        if name not in skyrl_gym.registry:
            raise EnvError(
                f"env.fn={spec!r}: skyrl-gym has no environment {name!r} (registered: {', '.join(sorted(skyrl_gym.registry))})"
            )

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        import skyrl_gym

        messages = _row_messages(row, self.spec)
        extras = {**self.extras, **{k: v for k, v in row.items() if k not in ("prompt", "messages", "id", "env_class")}}
        if not isinstance(extras.get("reward_spec"), dict):
            truth = next((row[k] for k in ("ground_truth", "answer") if row.get(k) is not None), None)
            if truth is None:
                raise EnvError(
                    f"env.fn={self.spec!r}: {_row_name(row)} needs a 'reward_spec' ({{ground_truth: ...}}), "
                    f"'ground_truth' or 'answer' column for skyrl's extras.reward_spec; it has {sorted(row)}"
                )
            extras["reward_spec"] = {"method": "rule", "ground_truth": truth}
        self.env = skyrl_gym.make(self.env_id.rpartition(":")[2], env_config=self.env_config, extras=extras)
        observation, _ = self.env.init(messages)
        return observation

    def step(self, action: str) -> Step:
        out = self.env.step(action)
        reward, done = float(out["reward"]), bool(out["done"])
        info = dict(out.get("metadata") or {})
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]
        info["success"] = reward >= 1.0
        if done:
            self.env.close()
        return Step(list(out["observations"]) or None, reward, done, info)


def _import_registering(module: str, spec: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - ImportError, and whatever the module raises while it runs
        raise EnvError(f"env.fn={spec!r}: cannot import '{module}': {type(err).__name__}: {err}") from None


# The toy_text games' action meanings (gymnasium's docs); other environments' actions are their numbers.
ACTION_NAMES = {
    "FrozenLake": ["left", "down", "right", "up"],
    "CliffWalking": ["up", "right", "down", "left"],
    "Taxi": ["south", "north", "east", "west", "pickup", "dropoff"],
}
DESCRIPTIONS = {
    "FrozenLake": "Frozen lake: walk from S to the goal G over frozen tiles F without falling into a hole H. "
    "You are the [bracketed] tile.",
    "CliffWalking": "Cliff walking: walk from the start to the goal T without stepping onto the cliff C. You are x.",
    "Taxi": "Taxi: drive the taxi [ ] to the passenger's letter {B}, pick them up, drive to the destination <Y> "
    "and drop them off. Walls | block east-west moves.",
}
# SGR colour codes -> the brackets a board shows them as: a background is the agent, blue and magenta Taxi's
# passenger and destination; other codes are dropped.
BRACKETS = {**{str(code): "[]" for code in range(40, 48)}, "34": "{}", "35": "<>"}
ANSI_SPAN = re.compile(r"\x1b\[([\d;]*)m(.*?)\x1b\[0m", re.DOTALL)
ANSI = re.compile(r"\x1b\[[\d;]*m")


def board_text(render: str) -> str:
    """An ANSI render as plain text: each coloured span in the brackets of its colour (BRACKETS), codes removed."""

    def bracket(match: re.Match) -> str:
        pair = next((BRACKETS[c] for c in match.group(1).split(";") if c in BRACKETS), "")
        return f"{pair[:1]}{match.group(2)}{pair[1:]}"

    return ANSI.sub("", ANSI_SPAN.sub(bracket, render)).strip("\n")


def parse_action(text: str, names: list[str]) -> int | None:
    """The first action the text names: a name (whole word, any case) or a number in range; None if none."""
    words = "|".join(re.escape(name) for name in names)
    for match in re.finditer(rf"\b(\d+|{words})\b" if words else r"\b(\d+)\b", text, re.IGNORECASE):
        token = match.group(1).lower()
        if token.isdigit():
            if int(token) < len(names):
                return int(token)
        elif token in names:
            return names.index(token)
    return None


class GymnasiumTextEnv:
    """A gymnasium environment played in text: its ANSI board in, an action name or number out."""

    env_id = ""
    spec = ""

    def __init__(self, **make_kwargs: Any):
        import gymnasium

        try:
            self.env = gymnasium.make(self.env_id, render_mode="ansi", **make_kwargs)
        except TypeError as err:  # an env.kwargs key the environment does not take
            raise EnvError(f"env.fn={self.spec!r}: cannot build it with env.kwargs={make_kwargs}: {err}") from None
        actions = self.env.action_space
        if not isinstance(actions, gymnasium.spaces.Discrete):
            raise EnvError(f"env.fn={self.spec!r}: the action space is {actions}, not Discrete (text names one action)")
        family = self.env_id.rpartition(":")[2].split("-")[0].removesuffix("8x8").removesuffix("Slippery")
        self.names = ACTION_NAMES.get(family) or [str(i) for i in range(int(actions.n))]
        self.description = DESCRIPTIONS.get(family, f"{self.env_id}:")
        menu = ", ".join(f"{i} {name}" if name != str(i) else name for i, name in enumerate(self.names))
        self.menu = f"Actions: {menu}. Answer with one action."

    @classmethod
    def check_id(cls, spec: str, env_id: str) -> None:
        gymnasium = _require("gymnasium", spec)
        from gymnasium.envs.registration import load_env_creator

        try:
            found = gymnasium.spec(env_id)
        except gymnasium.error.Error as err:  # NameNotFound, VersionNotFound, ... with gymnasium's suggestion
            raise EnvError(f"env.fn={spec!r}: {err}") from None
        creator = found.entry_point if callable(found.entry_point) else load_env_creator(str(found.entry_point))
        modes = getattr(creator, "metadata", {}).get("render_modes", [])
        if "ansi" not in modes:
            raise EnvError(
                f"env.fn={spec!r}: {env_id} has no 'ansi' render mode (its modes: {modes}), so no text to show the "
                "model; text ones: FrozenLake-v1, FrozenLake8x8-v1, CliffWalking-v1, Taxi-v4"
            )

    def reset(self, row: dict[str, Any]) -> str:
        seed = row.get("seed")
        if seed is None:
            seed = zlib.crc32(str(row.get("prompt", row.get("id", ""))).encode())
        elif not isinstance(seed, int):
            raise EnvError(f"env.fn={self.spec!r}: {_row_name(row)} has seed {seed!r}, not an integer")
        self.env.reset(seed=seed)
        return f"{self.description}\n{self.board()}\n{self.menu}"

    def board(self) -> str:
        frame = self.env.render()
        assert isinstance(frame, str), f"{self.env_id} rendered {type(frame).__name__} in ansi mode"
        return board_text(frame)

    def step(self, action: str) -> Step:
        chosen = parse_action(action, self.names)
        if chosen is None:
            return Step(f"That names no action.\n{self.menu}", 0.0, False, {"invalid_action": True})
        _, gym_reward, terminated, truncated, info = self.env.step(chosen)
        reward = float(gym_reward)
        done = bool(terminated or truncated)
        info = {k: v for k, v in info.items() if isinstance(v, (int, float, str, bool))}
        info["success"] = bool(terminated and reward > 0)
        board = self.board()
        if done:
            self.env.close()
        return Step(board if done else f"{board}\n{self.menu}", reward, done, info)
