"""The README's code as a user runs it: every import names a real module, every `seqmem` command line
parses, and every Python block runs as written, each in a fresh process."""

import ast
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from seqmem.cli import _parser

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


def _imports(block):
    """(module, names imported from it: empty for `import module`) of each import statement in `block`."""
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Import):
            yield from ((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module, tuple(alias.name for alias in node.names)


def test_the_readme_has_the_blocks_these_tests_run():
    assert len(_blocks("python")) >= 3 and _blocks("sh")
    assert any("seqmem.optimize" in block for block in _blocks("python"))


def test_every_import_in_the_readme_names_a_real_module_and_its_names():
    imported = [pair for block in _blocks("python") for pair in _imports(block)]
    assert ("seqmem.keras", ()) in imported and ("seqmem", ("device",)) in imported
    for module_name, names in imported:
        module = importlib.import_module(module_name)
        for name in names:  # `from seqmem import device` must give the module, not a look-alike attribute
            value = getattr(module, name)
            if name in ("device", "keras"):
                assert value is sys.modules[f"{module_name}.{name}"], name


def _command_lines():
    for block in _blocks("sh"):
        for line in block.splitlines():
            command = line.split("#", 1)[0].strip()
            if command.startswith("seqmem "):
                yield command


def test_every_seqmem_command_line_in_the_readme_parses():
    lines = list(_command_lines())
    assert {shlex.split(line)[1] for line in lines} == {"profile", "plan", "accuracy", "demo"}
    for line in lines:
        _parser().parse_args(shlex.split(line)[1:])  # exits with a usage error on an unknown flag or model


@pytest.mark.device
@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_each_python_block_of_the_readme_runs_as_written(index, tmp_path):
    block = _blocks("python")[index]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    if "seqmem.optimize(" in block:  # the quick start: a plan that fits, then three losses
        assert "(fits)" in result.stdout
        losses = [float(line) for line in result.stdout.splitlines() if re.fullmatch(r"[0-9.]+", line.strip())]
        assert len(losses) == 3, result.stdout
