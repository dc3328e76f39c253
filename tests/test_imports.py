"""Imports go one way: no file imports a file that imports it back, directly or through others, with
each folder (speedups/, bookkeeping/, scaleout/, environment/, tests/, ...) counted as one node. The
graph is read with ast, so imports inside functions count too.

Run: python -m pytest -q tests/test_imports.py
"""

import ast
from pathlib import Path

from conftest import ROOT

READING_PATH = ("config", "train", "flow_grpo", "rollout", "modules", "memory", "tools", "engine")


def node_of(path: Path) -> str:
    """A top-level file is its own node (train.py -> "train"); a file in a folder is the folder."""
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def import_graph() -> dict:
    """{node: {imported node: "file:line" of the first such import}} over every .py file of the project."""
    files = [p for p in ROOT.rglob("*.py") if not any(part.startswith(".") or part == "runs" for part in p.relative_to(ROOT).parts)]
    nodes = {node_of(p) for p in files}
    graph = {n: {} for n in nodes}
    for path in files:
        src = node_of(path)
        for stmt in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(stmt, ast.Import):
                names = [a.name for a in stmt.names]
            elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                names = [stmt.module]
            else:
                continue  # a relative import stays inside its folder
            for name in names:
                dst = name.split(".")[0]
                if dst in nodes and dst != src:
                    graph[src].setdefault(dst, f"{path.relative_to(ROOT)}:{stmt.lineno}")
    return graph


def find_cycle(graph: dict) -> list | None:
    """One cycle as a list of nodes [a, b, ..., a], or None."""
    state = {}  # node -> 1 while on the DFS stack, 2 when done

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_file_or_folder_imports_what_imports_it_back():
    graph = import_graph()
    cycle = find_cycle(graph)
    if cycle:
        edges = [f"{a} -> {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
        raise AssertionError("import cycle: " + " -> ".join(cycle) + "\n  " + "\n  ".join(edges))


def test_the_cycle_finder_names_a_cycle_and_accepts_a_layering():
    assert find_cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": "", "c": ""}, "b": {"c": ""}, "c": {}}) is None


def test_the_reading_path_imports_the_speed_ups_in_one_place_only():
    """The plain path is all a reader of the eight files sees: only train.py (where the engine and the
    update's forward are chosen) imports speedups/."""
    graph = import_graph()
    assert [n for n in READING_PATH if "speedups" in graph[n]] == ["train"]
