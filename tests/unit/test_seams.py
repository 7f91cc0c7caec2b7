"""The seams the training step crosses are typed (docs/architecture.md, "Roles and protocols"): the step holds roles
by their protocols and never probes them for an attribute; what the learner's update hands back is a small typed
value that pickles (it crosses a Ray actor boundary every step); the two rollout sources offer the protocol's
methods; and the step's modules import at run time only what runs, annotations' types under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
import inspect
import pickle
from pathlib import Path

from relayrl.learner.result import UpdateResult
from relayrl.sources.base import RolloutSource
from relayrl.sources.multi_turn import MultiTurnSource
from relayrl.sources.single_turn import SingleTurnSource

PACKAGE = Path(__file__).resolve().parents[2] / "relayrl"

# Packages whose getattr/hasattr calls read optional attributes of objects relayrl does not define, never a role:
EXEMPT_PACKAGES = {
    "models": "Hugging Face models and configs, whose optional attributes differ by architecture",
    "data": "tokenizers and processors (transformers)",
    "rollout": "vLLM's and transformers' objects (the model, tool and reasoning parsers); lazy module exports",
    "envs": "user environment classes and their gymnasium/verifiers objects",
    "agents": "user agent functions and TRL environment classes",
    "rewards": "user reward functions, and the errors Ray wraps",
    "config": "pydantic models and their field metadata",
    "commands": "argparse namespaces",
}
# Probes elsewhere, each on an object that is not a role: (module, attribute) -> why it is read optionally.
ALLOWED = {
    ("cli.py", "overrides"): "an argparse namespace: only some subcommands take key=value overrides",
    ("errors.py", "_relayrl"): "any exception: relayrl marks the ones it has already explained",
    ("learner/layout.py", "_attn_implementation"): "a transformers model config, set once a model is loaded",
    ("learner/layout.py", "architectures"): "a transformers model config (absent on some)",
    (
        "planner/simulate.py",
        "tie_weights",
    ): "a torch model built on meta: a transformers model ties its head, others not",
    ("learner/layout.py", "decoder_forward"): "a torch model: FSDP2's root carries the sharded decoder's forward",
    ("learner/sharded.py", "base_model_prefix"): "a torch module: a transformers model has one, a critic's body not",
    ("sources/multi_turn.py", "scores"): "a user's agent function: TRL's environment classes mark whether they score",
    ("placement/handles.py", "cause"): "Ray's RayTaskError: the exception raised inside the actor, when it has one",
    ("placement/learner_ranks.py", "traceback_str"): "Ray's error cause: the remote traceback, when it has one",
    ("placement/engine_worker.py", "receives_in_workers"): (
        "an engine inside its actor: only a vLLM engine (WorkersReceive) has it; to become an EngineGroup member"
    ),
}


def probes(tree: ast.Module) -> list[tuple[int, str]]:
    """`hasattr(x, "name")` and `getattr(x, "name", default)` calls: (line, name). A two-argument getattr is a
    plain attribute read (a method called by name), and dunder names are Python's own optional metadata."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
            continue
        name = node.args[1]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        if name.value.startswith("__") and name.value.endswith("__"):
            continue
        if (node.func.id == "hasattr" and len(node.args) == 2) or (node.func.id == "getattr" and len(node.args) == 3):
            found.append((node.lineno, name.value))
    return found


def test_no_role_is_probed_for_an_attribute():
    """The rule of docs/architecture.md: roles are held by their protocols, so no module asks an object relayrl
    defines whether it has a member; what is left reads optional attributes of third-party objects (listed)."""
    unexpected, used = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.split("/")[0] in EXEMPT_PACKAGES:
            continue
        for line, name in probes(ast.parse(path.read_text())):
            if (relative, name) in ALLOWED:
                used.add((relative, name))
            else:
                unexpected.append(f"relayrl/{relative}:{line}: a probe for {name!r}")
    assert not unexpected, "use the role's protocol, or list a third-party object's read in ALLOWED:\n" + "\n".join(
        unexpected
    )
    assert used == set(ALLOWED), f"no longer needed, remove from ALLOWED: {sorted(set(ALLOWED) - used)}"


def test_the_probe_finder_finds_both_forms():
    tree = ast.parse('hasattr(a, "x")\ngetattr(b, "y", None)\ngetattr(c, "z")\ngetattr(d, "__name__", "")')
    assert probes(tree) == [(1, "x"), (2, "y")]


def test_an_update_result_pickles_small():
    """What a Ray learner actor returns every step: plain values, a few kilobytes for a logged step's rows."""
    rows = [[-0.5] * 64 for _ in range(6)]  # 6 logged rows of a 64-token batch
    result = UpdateResult({"loss/policy": 0.25, "lr": 1e-6}, {3: (2.0, 0.5, 4)}, rows)
    data = pickle.dumps(result)
    assert pickle.loads(data) == result and len(data) < 8_000
    assert UpdateResult({}).mismatch == {} and UpdateResult({}).sample_logprobs is None


def _members(protocol: type) -> dict[str, inspect.Signature | None]:
    """The protocol's methods with their signatures (None for attributes and properties)."""
    names = {name for name in vars(protocol) if not name.startswith("_")} | set(protocol.__annotations__)
    members = {}
    for name in names:
        value = inspect.getattr_static(protocol, name, None)
        members[name] = inspect.signature(value) if inspect.isfunction(value) else None
    return members


def test_both_rollout_sources_offer_the_protocols_methods():
    """pyright checks the same through relayrl/build.py; this names a missing or renamed member directly."""
    members = _members(RolloutSource)
    assert {"version", "prompts", "generate", "submit", "finish", "score", "evaluate", "close", "engines"} <= set(
        members
    )
    for source in (SingleTurnSource, MultiTurnSource):
        for name, signature in members.items():
            if signature is None:
                continue
            own = inspect.getattr_static(source, name, None)
            assert inspect.isfunction(own), f"{source.__name__} has no method {name}"
            assert list(inspect.signature(own).parameters) == list(signature.parameters), (source.__name__, name)
        assert isinstance(inspect.getattr_static(source, "version"), property)


# The step's modules: every relayrl import that runs is used by running code.
STEP_MODULES = ("controller.py", "schedules", "sources", "learner", "metrics/step_metrics.py", "metrics/samples.py")


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def annotation_only_imports(tree: ast.Module) -> list[str]:
    """The relayrl modules imported at run time (module level, outside `if TYPE_CHECKING:`) whose names are read
    only in annotations."""
    skipped = _type_checking_lines(tree)
    annotations: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            arguments += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
            parts = [a.annotation for a in arguments if a.annotation is not None]
            parts += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            parts = [node.annotation]
        else:
            continue
        annotations.update(id(sub) for part in parts for sub in ast.walk(part))
    running = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and id(node) not in annotations}
    found = []
    for node in tree.body:
        if (
            not isinstance(node, ast.ImportFrom)
            or not (node.module or "").startswith("relayrl")
            or node.lineno in skipped
        ):
            continue
        if not any((alias.asname or alias.name) in running for alias in node.names):
            found.append(f"{node.module} (line {node.lineno})")
    return found


def test_the_steps_modules_import_annotation_types_only_when_type_checking():
    found = []
    for entry in STEP_MODULES:
        paths = sorted((PACKAGE / entry).rglob("*.py")) if (PACKAGE / entry).is_dir() else [PACKAGE / entry]
        for path in paths:
            found += [
                f"relayrl/{path.relative_to(PACKAGE)}: {m}"
                for m in annotation_only_imports(ast.parse(path.read_text()))
            ]
    assert not found, "move under `if TYPE_CHECKING:`:\n" + "\n".join(found)


def test_the_annotation_finder_tells_annotations_from_running_code():
    tree = ast.parse(
        "from relayrl.a import A\nfrom relayrl.b import B\nfrom relayrl.c import C\n"
        "if TYPE_CHECKING:\n    from relayrl.d import D\n"
        "def f(x: A, y: D) -> A:\n    return B(x)\nz: C = 1\n"
    )
    assert annotation_only_imports(tree) == ["relayrl.a (line 1)", "relayrl.c (line 3)"]
