"""The package's shape, checked from its imports (issue 22): layers never import upwards, and no
module imports itself round a circle.

Layers, bottom to top (each package's ``__init__`` docstring says the same in words):

==========  =====================================================================
0           ``fsmingle.errors`` (the error family every layer raises)
1           ``fsmingle.fs`` (layout, records, mounts, refusal, store; fscheck on top)
2           ``fsmingle.net`` (channel, netaddr, hostinfo, mesh)
3           ``fsmingle.protocol`` (the engine) and ``fsmingle.preflight`` (beside it)
4           the faces: ``options``, ``config``, ``api``, ``cli``, ``torchrun``, the package root
==========  =====================================================================

Every import counts, including those inside functions (a deferred import is still a
dependency).  The standard library's :mod:`ast` reads them; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "fsmingle"

LAYERS = {
    "fsmingle.errors": 0,
    "fsmingle.fs": 1,
    "fsmingle.net": 2,
    "fsmingle.protocol": 3,
    "fsmingle.preflight": 3,
    "fsmingle.options": 4,
    "fsmingle.config": 4,
    "fsmingle.api": 4,
    "fsmingle.cli": 4,
    "fsmingle.torchrun": 4,
    "fsmingle": 4,  # the package root (re-exports the public API) and __main__
}
# Inside a layer's package, an order too: the store never imports the doctor that probes it.
WITHIN = {"fsmingle.fs.fscheck": ("fsmingle.fs.store",)}  # (what it sits above)
MAX_LINES = 500


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(mod: str, path: Path, known: set[str]) -> set[str]:
    """The fsmingle modules ``mod`` imports (a name imported from a package counts as its module
    if it is one, else as the package)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("fsmingle"):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("fsmingle") and a.name in known)
    out.discard(mod)
    return out


def _layer(mod: str) -> tuple[str, int]:
    best = max((k for k in LAYERS if mod == k or mod.startswith(k + ".")), key=len)
    return best, LAYERS[best]


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_no_layer_imports_a_higher_one():
    bad = []
    for mod, deps in _graph().items():
        where, level = _layer(mod)
        for d in deps:
            dwhere, dlevel = _layer(d)
            if dlevel > level:
                bad.append(f"{mod} (layer {level}, {where}) imports {d} (layer {dlevel}, {dwhere})")
            for upper, lower in WITHIN.items():
                if (d == upper or d.startswith(upper + ".")) and any(
                    mod == x or mod.startswith(x + ".") for x in lower
                ):
                    bad.append(f"{mod} imports {d}, which sits above it")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def test_no_import_circle():
    g = _graph()
    # Tarjan's strongly connected components: any component of more than one module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize("mod", sorted(_modules()))
def test_no_module_over_500_lines(mod):
    n = len(_modules()[mod].read_text().splitlines())
    assert n <= MAX_LINES, f"{mod} has {n} lines (at most {MAX_LINES}): split it by concern"


# The test harness's packages: the same limit (issue 32: tests/cluster.py had grown to 1,951 lines).
HARNESS_PACKAGES = [Path(__file__).resolve().parent / "cluster"]


@pytest.mark.parametrize(
    "path", [str(p.relative_to(PKG.parent)) for d in HARNESS_PACKAGES for p in sorted(d.rglob("*.py"))]
)
def test_no_harness_module_over_500_lines(path):
    n = len((PKG.parent / path).read_text().splitlines())
    assert n <= MAX_LINES, f"{path} has {n} lines (at most {MAX_LINES}): split it by concern"


def _test_modules_imported(src: str) -> set[str]:
    """The ``test_*`` modules that ``src`` imports (``import test_x``, ``from test_x import y``, ``from tests.test_x ...``)."""
    names = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return {n for n in names if n.rsplit(".", 1)[-1].startswith("test_")}


@pytest.mark.parametrize("path", sorted(p.name for p in Path(__file__).resolve().parent.glob("*.py")))
def test_no_test_module_imports_a_test_module(path):
    # What tests share lives in harness modules (docs/architecture.md, "the tests' harness"): a test
    # module imported by another runs its module-level code twice and collects its fixtures in two places.
    imported = _test_modules_imported((Path(__file__).resolve().parent / path).read_text())
    assert not imported, f"tests/{path} imports {sorted(imported)}: move what it shares to a harness module"


def test_the_test_import_checker_sees_one():
    assert _test_modules_imported("import os\nfrom test_realfs import _run\nimport tests.test_x as t\n") == {
        "test_realfs",
        "tests.test_x",
    }
    assert _test_modules_imported("from testing_harness import x\nimport model_enum\n") == set()


def test_the_checker_sees_an_upward_import(tmp_path):
    # The checker itself can fail: a store importing the rendezvous engine is caught.
    src = "from ..protocol.participant import Participant\n"
    (tmp_path / "x.py").write_text(src)
    deps = _imports("fsmingle.fs.x", tmp_path / "x.py", {"fsmingle.protocol.participant"})
    assert deps == {"fsmingle.protocol.participant"}
    assert _layer("fsmingle.protocol.participant")[1] > _layer("fsmingle.fs.x")[1]


def test_every_fsmingle_import_names_a_module_that_exists():
    # A deferred import of a moved module fails only when its function runs: catch it here.
    mods = _modules()
    missing = []
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("fsmingle")):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module
                if target not in mods:
                    missing.append(f"{path.relative_to(PKG.parent)}:{node.lineno} imports {target}")
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def _bound_names(init: Path) -> dict[str, int]:
    """Names a package's ``__init__`` binds at its top level (imports, defs, classes, assignments),
    with the line that binds each."""
    out: dict[str, int] = {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out[(a.asname or a.name).split(".")[0]] = node.lineno
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node.lineno
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update((t.id, node.lineno) for t in targets if isinstance(t, ast.Name))
    return out


def _shadowed(pkg_dir: Path) -> list[str]:
    """Every name a package's ``__init__`` binds to something other than its own submodule of that name."""
    found = []
    for init in sorted(pkg_dir.rglob("__init__.py")):
        children = {p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"}
        children |= {p.name for p in init.parent.iterdir() if (p / "__init__.py").exists()}
        for name, line in _bound_names(init).items():
            if name in children:
                node = next(n for n in ast.parse(init.read_text()).body if getattr(n, "lineno", None) == line)
                # ``from . import x`` binds the submodule itself: that is no shadow.
                if isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module:
                    continue
                found.append(f"{init.relative_to(pkg_dir.parent)}:{line} binds {name!r}, the name of its submodule")
    return found


def test_no_public_name_shadows_a_submodule():
    """One name, one thing (issue 32): ``fsmingle.rendezvous`` was the public function and the
    engine's package at once, so ``import fsmingle.rendezvous.rank0.door as door`` failed ("cannot
    import name 'rank0' from 'rendezvous'": ``import a.b as c`` takes ``getattr(a, 'b')``, the
    function).  The engine is ``fsmingle.protocol`` now, and ``fsmingle.worlds`` (the function)
    lives in ``fsmingle.inprocess``.  No package may bind a name of one of its own submodules."""
    assert not _shadowed(PKG), "\n".join(_shadowed(PKG))


def test_the_shadow_checker_sees_a_shadow(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "worlds.py").write_text("def worlds(): pass\n")
    (pkg / "__init__.py").write_text("from .worlds import worlds\nfrom . import engine\ndef engine(): pass\n")
    found = _shadowed(pkg)
    assert len(found) == 2 and "'worlds'" in found[0] and "'engine'" in found[1], found


def test_a_deep_engine_module_imports_by_its_dotted_name():
    # The issue's own example, as a user would type it.
    import importlib
    import types

    ns: dict = {}
    exec("import fsmingle.protocol.rank0.door as door", ns)
    assert isinstance(ns["door"], types.ModuleType)
    assert ns["door"] is importlib.import_module("fsmingle.protocol.rank0.door")
