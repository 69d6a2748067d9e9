"""The package layout: stages import only the stages below them, the planner core imports no TensorFlow, and
no module or function grows past what one reader takes in at once."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "seqmem"

# Lowest first: a module may import its own stage and those before it. The stages up to the rewrite are
# free of TensorFlow; `layers` and `edge` are TensorFlow-side, `runtime` and the user-facing modules run it.
STAGES = (
    ("base", ("seqmem.errors", "seqmem.units", "seqmem.gc_pause", "seqmem.files")),
    ("ir", ("seqmem.ir",)),
    ("decisions", ("seqmem.decisions",)),
    ("analyze", ("seqmem.analyze", "seqmem.sim")),
    ("plan", ("seqmem.plan",)),
    ("rewrite", ("seqmem.rewrite",)),
    ("layers", ("seqmem.layers",)),
    ("edge", ("seqmem.edge",)),
    ("runtime", ("seqmem.runtime", "seqmem.device", "seqmem.keras", "seqmem.examples", "seqmem.bench",
                 "seqmem.plot", "seqmem.cli_jobs")),
    ("entry", ("seqmem", "seqmem.cli", "seqmem.__main__")),
)
TENSORFLOW_FREE = ("base", "ir", "decisions", "analyze", "plan", "rewrite")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _modules():
    """(module name, path) of every module of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


KNOWN = frozenset(name for name, _ in _modules())


def _stage(module):
    """Index in STAGES of `module`'s stage: its longest matching prefix."""
    matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(STAGES) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} is in no stage of tests/test_layout.py"
    return max(matches)[1]


def _imported(tree):
    """The seqmem modules a module's import statements name (`from a import b` names `a.b` when that is a
    module of the package, else `a`), but for imports made for type annotations only (`if TYPE_CHECKING:`)."""
    annotations_only = {id(inner) for node in ast.walk(tree)
                        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
                        for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("seqmem"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("seqmem"):
            for alias in node.names:
                yield f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in KNOWN else node.module


def test_every_stage_imports_only_itself_and_the_stages_below():
    upward = []
    for module, path in _modules():
        for imported in _imported(ast.parse(path.read_text())):
            if _stage(imported) > _stage(module):
                upward.append(f"{module} ({STAGES[_stage(module)][0]}) imports {imported} "
                              f"({STAGES[_stage(imported)][0]})")
    assert not upward, "\n".join(upward)


def test_importing_the_tensorflow_free_stages_does_not_import_tensorflow():
    core = [module for module, _ in _modules() if STAGES[_stage(module)][0] in TENSORFLOW_FREE]
    code = f"import importlib, sys\nfor m in {core!r}:\n    importlib.import_module(m)\nprint('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("module, path", list(_modules()), ids=[name for name, _ in _modules()])
def test_modules_and_functions_stay_short(module, path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{module}: {len(text.splitlines())} lines"
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{module}: " + ", ".join(long)


def test_the_readme_module_map_names_every_package_and_only_real_paths():
    readme = (PACKAGE.parent / "README.md").read_text()
    table = readme[readme.index("| stage"):]
    table = table[:table.index("\n\n")]
    named = set(re.findall(r"`(seqmem/[\w/.]+|models/)`", table))
    packages = {f"seqmem/{path.name}/" for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert packages <= named, f"packages missing from the README's module map: {sorted(packages - named)}"
    missing = [path for path in named if not (PACKAGE.parent / path).exists()]
    assert not missing, f"the README's module map names paths that do not exist: {missing}"
