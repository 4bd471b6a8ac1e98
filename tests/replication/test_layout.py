"""The package layout's rules (DESIGN §9, docs/architecture.md), read from the source: which
package may import which, no import circles, no import hidden in a function to dodge one.

Imports under ``if TYPE_CHECKING:`` are for annotations only and never run, so they count for
none of these rules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("replication", "merge", "liverobin", "kazoo_leader", "rhino_state", "transport", "deploy", "ops")
# the protocol packages and the transport below them import nothing of the job's packages
INNER = ("merge", "liverobin", "kazoo_leader", "rhino_state", "transport")
# the driver's control plane; the worker side (replication.runtime) imports nothing of it
CONTROL = "replication.control"
RUNTIME = "replication.runtime"
ENTRY_POINT = "replication.__main__"


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _target(module: str, node: ast.ImportFrom | ast.Import, alias: ast.alias) -> str | None:
    """The project module an import names (the longest known prefix), or None if not ours."""
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            if MODULES[module].name != "__init__.py":
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            parent = ".".join(base + ([node.module] if node.module else []))
        else:
            parent = node.module or ""
        name = f"{parent}.{alias.name}"
    else:
        name = alias.name
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str) -> tuple[set[str], set[str]]:
    """What ``module`` imports when it loads, and what it imports later (inside a function)."""
    tree = ast.parse(MODULES[module].read_text())
    at_load: set[str] = set()
    deferred: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for rest in child.orelse:
                    visit(rest, in_function)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                for alias in child.names:
                    target = _target(module, child, alias)
                    if target is not None and target != module:
                        (deferred if in_function else at_load).add(target)
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(tree, False)
    return at_load, deferred


GRAPH = {module: _imports(module) for module in MODULES}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _reachable(start: str) -> set[str]:
    """Every module ``start`` loads, directly or through others (at load time)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in GRAPH[todo.pop()][0]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_protocol_packages_and_transport_import_nothing_of_the_job_packages():
    wrong = sorted(f"{m} -> {t}" for m, (now, later) in GRAPH.items() if m.split(".")[0] in INNER
                   for t in now | later if t.split(".")[0] not in INNER)
    assert not wrong, wrong


def test_the_worker_side_imports_nothing_of_the_driver_side():
    wrong = sorted(f"{m} -> {t}" for m, (now, later) in GRAPH.items() if _within(m, RUNTIME)
                   for t in now | later if _within(t, CONTROL))
    assert not wrong, wrong


def test_the_library_imports_nothing_of_the_tools_and_deploy_no_private_name_of_it():
    """``ops`` (CLI, demo, chaos, load, soak) sits above ``replication`` and ``deploy``; only the
    package's entry point (``python -m replication``) starts the CLI, and nothing imports it."""
    wrong = sorted(f"{m} -> {t}" for m, (now, later) in GRAPH.items() if m.split(".")[0] in ("replication", "deploy")
                   and m != ENTRY_POINT for t in now | later if t.split(".")[0] == "ops")
    assert not wrong, wrong
    private = []
    for module, path in MODULES.items():
        if not module.startswith("deploy"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("replication"):
                private += [f"{module}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not private, private


def test_nothing_imports_the_entry_point():
    importers = sorted(m for m, (now, later) in GRAPH.items() if ENTRY_POINT in now | later)
    assert not importers, importers


def test_no_module_imports_itself_through_others():
    circles = sorted(m for m in MODULES if m in _reachable(m))
    assert not circles, circles


def test_no_import_is_deferred_into_a_function_to_dodge_a_circle():
    """A module importing ``t`` inside a function, where ``t`` loads that module: a circle."""
    dodged = sorted(f"{m} -> {t}" for m, (_, later) in GRAPH.items() for t in later if m in _reachable(t) | {t})
    assert not dodged, dodged


def test_the_rules_see_the_imports_they_judge():
    """The checks above find what they look for (so an empty answer means something)."""
    assert "replication.control.master" in GRAPH["replication.control.handle"][0]
    assert RUNTIME + ".worker" in GRAPH["replication.control.launch"][0]
    assert "transport.rpc" in _reachable("replication.control.master")
