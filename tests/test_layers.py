"""The package's layers hold (import-linter, configured in pyproject.toml), and a contract that
holds is not one that holds for anything: an upward import in a copy of the package breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_layers_hold():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    shutil.copytree(REPO / "gru_experiments", tmp_path / "gru_experiments",
                    ignore=shutil.ignore_patterns("__pycache__", "*.xz"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    mlp = tmp_path / "gru_experiments" / "models" / "mlp.py"
    mlp.write_text(mlp.read_text() + "\nfrom gru_experiments.runs.training import train  # upward: models -> runs\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "gru_experiments.models.mlp -> gru_experiments.runs.training" in result.stdout


def test_no_module_is_over_about_400_lines():
    sizes = {str(path.relative_to(REPO)): len(path.read_text().splitlines())
             for path in (REPO / "gru_experiments").rglob("*.py")}
    assert not {path: n for path, n in sizes.items() if n > 420}, sizes


RUFF = Path(sys.executable).with_name("ruff")
MAX_FUNCTION_LINES = 60


def test_ruff_finds_nothing():
    """Lint and import order, configured in pyproject.toml ([tool.ruff]), over the whole repository."""
    result = subprocess.run([str(RUFF), "check", "--no-cache", str(REPO)], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]


def long_functions(root: Path) -> list[str]:
    """`path:line name (N lines)` for every function over MAX_FUNCTION_LINES lines below `root`."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_the_package_runs_over_sixty_lines(tmp_path):
    assert long_functions(REPO / "gru_experiments") == []
    # and the check sees one that does
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "pkg" / "long.py").write_text(f"def too_long():\n{body}\n")
    assert long_functions(tmp_path / "pkg") == [f"pkg/long.py:1 too_long ({MAX_FUNCTION_LINES + 1} lines)"]
