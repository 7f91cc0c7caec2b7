"""The layout's import rules (docs/architecture.md, "Import rules"), checked over the source's import statements.

Counted: every import that runs, at module level or inside a function (a lazy import is still a dependency).
Not counted: imports under `if TYPE_CHECKING:`, which only annotations read.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "relayrl"
# The top level holds the package face (api, cli), the step (controller) and its builder, the types and the errors.
TOP_LEVEL = {"__init__", "api", "cli", "controller", "build", "types", "errors"}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _unit(module: str) -> str:
    """The package a module belongs to (`relayrl.rollout.vllm_engine` -> `rollout`), or the top-level module."""
    return module.split(".")[1] if module.count(".") else module


def import_edges() -> dict[tuple[str, str], str]:
    """{(unit, imported unit): the first file with such an import} over relayrl/."""
    edges: dict[tuple[str, str], str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        source = _unit(module)
        tree = ast.parse(path.read_text())
        skipped = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] if node.module != "relayrl" else [f"relayrl.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("relayrl.") and (target := _unit(name)) != source:
                    edges.setdefault((source, target), str(path.relative_to(PACKAGE.parent)))
    return edges


def cycles(edges: dict[tuple[str, str], str]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_between_packages():
    edges = import_edges()
    found = cycles(edges)
    detail = [f"{a} -> {b} ({edges[(a, b)]})" for cycle in found for a in cycle for b in cycle if (a, b) in edges]
    assert found == [], "import cycles between packages:\n  " + "\n  ".join(detail)


def test_the_top_level_holds_only_the_face_the_step_the_types_and_the_errors():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules <= TOP_LEVEL, f"top-level modules outside the rule: {sorted(modules - TOP_LEVEL)}"


def test_placement_and_sync_name_no_engine_module():
    """Placement and the sync drive engines through the protocols; only rollout/ imports vLLM's engine modules."""
    engine_modules = ("relayrl.rollout.vllm_engine", "relayrl.rollout.vllm_tp", "relayrl.rollout.hf_engine")
    offenders = []
    for package in ("placement", "sync"):
        for path in (PACKAGE / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module in engine_modules:
                    offenders.append(f"{path.relative_to(PACKAGE.parent)}: {node.module}")
    assert offenders == []


def test_the_config_is_a_leaf():
    """`config` imports nothing of relayrl but `errors` and `types`: it sits beside them at the bottom of the layers,
    and every package may read it. Its `auto` choices are made above it, by the builder (`relayrl.build.resolve`)."""
    edges = import_edges()
    above = {target: path for (source, target), path in edges.items() if source == "config"}
    assert set(above) <= {"errors", "types"}, f"config imports {above}"


def test_validating_a_config_imports_no_runtime_code():
    """The config package is data: a tree validates (and dumps) without loading an engine, torch or another
    relayrl package; its `auto` choices are made afterwards, by `relayrl.build.resolve`."""
    probe = (
        "import sys, relayrl.config as c\n"
        "config = c.Config.model_validate({'rollout': {'tensor_parallel': 2}, 'model': {'lora': {'rank': 4}}})\n"
        "c.dump_config(config)\n"
        "loaded = sorted({m.split('.')[1] for m in sys.modules if m.startswith('relayrl.')})\n"
        "print(loaded, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['api', 'config', 'errors'] False"


def test_benchmarks_do_not_import_tests():
    benchmarks = PACKAGE.parent / "benchmarks"
    offenders = [
        str(path.relative_to(PACKAGE.parent))
        for path in benchmarks.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(
            (name or "").split(".")[0] == "tests"
            for name in ([node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
        )
    ]
    assert offenders == []
