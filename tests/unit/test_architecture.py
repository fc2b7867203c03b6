"""The layering the code promises (docs/architecture.md): every folder is pure or an adapter,
pure folders import no adapter, packages import only the layers below them, no module imports
itself through others (no cycle), and no module or function grows past what one reads in a
sitting. Imports inside functions count too."""

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fabriclab", "testbed", "traffic", "controllers", "telemetry")
# what each package may import from the others (the experiment layer sits on top)
ALLOWED = {"testbed": set(), "traffic": {"testbed"}, "controllers": {"testbed", "telemetry"},
           "telemetry": {"testbed", "traffic"},
           "fabriclab": {"testbed", "traffic", "telemetry"}}
PURE, ADAPTER = "pure", "adapter"
# every folder of the packages, by what it may do; a new folder must say which it is
FOLDERS = {
    "testbed": PURE,  # errors, poll, paths
    "testbed/model": PURE, "testbed/plan": PURE,
    "testbed/linux": ADAPTER, "testbed/fabric": ADAPTER, "testbed/runs": ADAPTER,
    "testbed/cluster": ADAPTER, "testbed/vm": ADAPTER, "testbed/switch": ADAPTER,
    "testbed/openflow": PURE,
    "traffic": PURE, "traffic/workloads": PURE, "traffic/measure": PURE, "traffic/predict": PURE,
    "traffic/transports": PURE, "traffic/agents": ADAPTER, "traffic/native": ADAPTER,
    "controllers": ADAPTER, "controllers/routing": PURE,
    "telemetry": ADAPTER, "telemetry/model": PURE,
    "fabriclab": ADAPTER, "fabriclab/model": PURE, "fabriclab/cli": ADAPTER,
}
# what touches the system: these libraries, and every module of an adapter folder
SYSTEM = {"mininet", "os_ken", "pyroute2", "subprocess", "socket", "ctypes", "http", "urllib",
          "docker", "ray", "prometheus_client.exposition", "prometheus_client.start_http_server"}
# but these parts of them, which only lay out and parse bytes: OpenFlow's message classes
NOT_SYSTEM = ("os_ken.ofproto",)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80  # longer only with "Long: <why>" at the top of its docstring


def modules() -> dict[str, Path]:
    """Every module of the packages: dotted name -> file."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


MODULES = modules()


def imports(path: Path) -> set[str]:
    """Every name a file imports, anywhere in it (absolute names; ``from a import b`` gives
    ``a`` and ``a.b``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def project_imports(path: Path) -> set[str]:
    """The project's modules a file imports (``from pkg import mod`` is ``pkg.mod``)."""
    return {name for name in imports(path) if name in MODULES}


def folder_of(path: Path) -> str:
    return str(path.parent.relative_to(ROOT))


def is_adapter(module: str) -> bool:
    return FOLDERS.get(folder_of(MODULES[module])) == ADAPTER


def test_every_folder_says_whether_it_is_pure():
    folders = {folder_of(p) for p in MODULES.values()}
    assert not folders - set(FOLDERS), f"folders not in FOLDERS: {sorted(folders - set(FOLDERS))}"
    assert not set(FOLDERS) - folders, f"FOLDERS names folders that are gone: " \
                                       f"{sorted(set(FOLDERS) - folders)}"


@pytest.mark.parametrize("folder", sorted(f for f, kind in FOLDERS.items() if kind == PURE))
def test_pure_folders_import_no_adapter(folder):
    wrong = {}
    for name, path in MODULES.items():
        if folder_of(path) != folder:
            continue
        used = imports(path)
        bad = sorted(n for n in used if (n in SYSTEM or n.split(".")[0] in SYSTEM)
                     and not n.startswith(NOT_SYSTEM) or (n in MODULES and is_adapter(n)))
        if bad:
            wrong[name] = bad
    assert not wrong, f"pure modules of {folder} import adapters: {wrong}"


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_the_layers_below(package):
    wrong = {}
    for name, path in MODULES.items():
        if name.split(".")[0] != package:
            continue
        used = {n.split(".")[0] for n in project_imports(path)}
        bad = used - ALLOWED[package] - {package}
        if bad:
            wrong[name] = sorted(bad)
    assert not wrong, f"{package} imports layers above or beside it: {wrong}"


def test_the_package_graph_is_acyclic():
    graph = nx.DiGraph([(p, q) for p, allowed in ALLOWED.items() for q in allowed])
    assert nx.is_directed_acyclic_graph(graph), list(nx.simple_cycles(graph))


def test_no_module_imports_itself_through_others():
    graph = nx.DiGraph()
    for name, path in MODULES.items():
        graph.add_node(name)
        for used in project_imports(path):
            # a package's __init__ runs before its modules: importing pkg.mod imports pkg
            if used != name and not name.startswith(used + "."):
                graph.add_edge(name, used)
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_the_checks_see_the_modules_they_check():
    """The graph above is built from the real imports: a known edge and a known adapter."""
    assert "testbed.model.topology" in project_imports(MODULES["testbed.model.spec"])
    assert is_adapter("testbed.linux.netlink") and not is_adapter("testbed.model.spec")
    assert len(MODULES) > 80


SIZED = [p for d in (*PACKAGES, "tests", "bench") for p in sorted((ROOT / d).rglob("*.py"))]


@pytest.mark.parametrize("path", SIZED, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_readable(path):
    text = path.read_text()
    count = text.count("\n")
    assert count <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)}: {count} lines (split it)"
    long = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            if lines > MAX_FUNCTION_LINES and not doc.startswith("Long:"):
                long.append(f"{node.name} ({lines} lines)")
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines " \
                     f"without a 'Long: <why>' at the top of their docstring: {long}"


# -- classes are whole in their module --------------------------------------------------------
def _classes(path: Path) -> tuple[dict[str, ast.ClassDef], dict[str, tuple[str, str]]]:
    """A module's classes by name, and what its names import: name -> (module, attribute)."""
    tree = ast.parse(path.read_text(), str(path))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
    return classes, imported


CLASSES = {name: _classes(path) for name, path in MODULES.items()}


def _defined(cls: ast.ClassDef) -> set[str]:
    """What a class body defines: methods, class attributes and fields, and every
    ``self.X`` any of its methods assigns."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(cls):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, (ast.For, ast.With)):
            targets = [node.target] if isinstance(node, ast.For) else [
                i.optional_vars for i in node.items if i.optional_vars is not None]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                        and sub.value.id == "self":
                    names.add(sub.attr)
    return names


def _resolve(module: str, base: ast.expr) -> tuple[str, ast.ClassDef] | None:
    """A base class written in ``module``, when it is one of the project's."""
    if not isinstance(base, ast.Name):
        return None
    classes, imported = CLASSES[module]
    if base.id in classes:
        return module, classes[base.id]
    origin = imported.get(base.id)
    if origin and origin[0] in CLASSES and origin[1] in CLASSES[origin[0]][0]:
        return origin[0], CLASSES[origin[0]][0][origin[1]]
    return None


def _lineage(module: str, cls: ast.ClassDef) -> set[str] | None:
    """What ``cls`` and its bases define; None when a base is not the project's (a library's
    class may define anything) or is a Protocol."""
    names = _defined(cls)
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id == "object":
            continue
        found = _resolve(module, base)
        if found is None:
            return None
        inherited = _lineage(*found)
        if inherited is None:
            return None
        names |= inherited
    return names


def self_reads_of_undefined(module: str) -> list[str]:
    """Every ``self.X`` a class of ``module`` reads that neither it nor a base of it defines:
    state that only another class (a mixin's sibling) would give it."""
    out = []
    for cls in CLASSES[module][0].values():
        defined = _lineage(module, cls)
        if defined is None:
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self" and isinstance(node.ctx, ast.Load) \
                    and node.attr not in defined and not node.attr.startswith("__"):
                out.append(f"{cls.name}.{node.attr} (line {node.lineno})")
    return sorted(set(out))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_class_reads_only_state_it_or_its_bases_define(module):
    """No mixins: a class that reads ``self.X`` defines X itself or inherits it; a part that
    needs another's state is given it (a parameter), never reads it off a shared object."""
    undefined = self_reads_of_undefined(module)
    assert not undefined, f"{module}: reads of state no class of its lineage defines: {undefined}"


def test_the_mixin_check_sees_a_mixin(tmp_path):
    """A class reading state its sibling defines is caught."""
    CLASSES["_probe"] = _classes(_write(tmp_path / "probe.py", (
        "class Steps:\n    def build(self):\n        return self.spec\n\n"
        "class Whole(Steps):\n    def __init__(self):\n        self.spec = 1\n")))
    try:
        assert self_reads_of_undefined("_probe") == ["Steps.spec (line 3)"]
    finally:
        del CLASSES["_probe"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- the module table of docs/architecture.md, generated --------------------------------------
DOC = ROOT / "docs" / "architecture.md"
TABLE_START = "<!-- module table: generated by `python -m tests.unit.test_architecture` -->"
TABLE_END = "<!-- end of the module table -->"


def _summary(path: Path) -> str:
    """A module's docstring, its first sentence (to the first full stop, colon or semicolon
    outside parentheses), its reStructuredText roles as Markdown code."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split())
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ".:;" and text[i + 1:i + 2] in (" ", ""):
            text = text[:i]
            break
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def module_table() -> str:
    """Every folder, whether it is pure, and each of its modules with its docstring's first
    sentence, as docs/architecture.md shows them."""
    lines = ["| folder | pure or adapter | modules |", "|---|---|---|"]
    for folder in sorted(FOLDERS, key=lambda f: (f.split("/")[0] != "testbed", f)):
        files = sorted(p for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")
        cells = "<br>".join(f"`{p.name}`: {_summary(p)}" for p in files)
        lines.append(f"| `{folder}/` | {FOLDERS[folder]} | {cells} |")
    return "\n".join(lines)


def _documented_table() -> str:
    text = DOC.read_text()
    return text[text.index(TABLE_START) + len(TABLE_START):text.index(TABLE_END)].strip()


def test_the_architecture_docs_module_table_is_the_codes():
    """The table cannot drift: it is generated from FOLDERS and the modules' docstrings."""
    assert _documented_table() == module_table(), \
        "docs/architecture.md's module table is stale: python -m tests.unit.test_architecture"


def test_every_module_says_what_it_is():
    """Every module has a docstring, whose first sentence the table shows."""
    missing = [str(p.relative_to(ROOT)) for folder in FOLDERS
               for p in (ROOT / folder).glob("*.py")
               if p.name != "__init__.py" and not _summary(p)]
    assert not missing, f"modules without a docstring: {missing}"


if __name__ == "__main__":  # rewrite the table in docs/architecture.md
    text = DOC.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    DOC.write_text(text[:start] + "\n" + module_table() + "\n" + text[end:])
    print(f"{DOC.relative_to(ROOT)}: module table rewritten")
