"""`env.agent`'s spec to the function a trajectory runs: `module:function`, `path/file.py:function`, an agent
registered in a dict (`module:AGENTS.name`, relayrl.api.train's), or `trl:module:Factory` (a TRL environment_factory
run by relayrl's tool loop, relayrl/agents/trl_env.py)."""

from __future__ import annotations

from relayrl.errors import EnvError


def load_agent(spec: str):
    """`module:function` or `path/file.py:function` (imported as env.fn's classes are); `trl:module:Factory`, a
    TRL environment_factory run by relayrl's tool loop (relayrl/agents/trl_env.py)."""
    from relayrl.agents.trl_env import PREFIX, is_trl_spec, trl_agent
    from relayrl.envs.base import _import

    if is_trl_spec(spec):
        target, _, name = spec.removeprefix(PREFIX).rpartition(":")
        if not target:
            raise EnvError(f"env.agent={spec!r} is not of the form trl:module:Class or trl:path/file.py:Class")
        factory = getattr(_import(target, spec, "env.agent"), name, None)
        if factory is None:
            raise EnvError(f"env.agent={spec!r}: '{target}' has no '{name}'")
        return trl_agent(spec, factory)
    if ":" not in spec:
        raise EnvError(f"env.agent={spec!r} is not of the form module:function or path/file.py:function")
    target, _, name = spec.rpartition(":")
    function = _import(target, spec, "env.agent")
    for part in name.split("."):  # `module:AGENTS.name`: an agent registered in a dict (relayrl.api.train's)
        function = function.get(part) if isinstance(function, dict) else getattr(function, part, None)
    if not callable(function):
        raise EnvError(f"env.agent={spec!r}: '{target}' has no function '{name}'")
    return function
