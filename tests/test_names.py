"""Every module, file and dotted name that the docs and the code's comments mention exists.

Read: docs/*.md, README.md, benchmarks/*.md (all their text), and the docstrings and comments of
gru_experiments/**/*.py, benchmarks/*.py, train.py, sample.py and sweep.py. Checked there:
- paths that start at a folder of the repo or of the package (`gru_experiments/study/scores.py`,
  `study/scores.py`, `models/`, `docs/evaluation.md`, `conf/model/mlp.yaml`): a file or folder of
  that name must exist (a package path may leave out `gru_experiments/` and its layer);
- bare file names (`sample.py`, `RESULTS.md`, `default.yaml`): some file of the repo has that name;
- a markdown link or image (`[the results](docs/results.md)`): it resolves from the page's folder;
- dotted names that start at a module of the package (`scores.Split`,
  `gru_experiments.models.protocol.LanguageModel`, `study/cost.duration`): each
  part is a submodule, or a name the module's source defines (def, class, assignment, import,
  `__all__`), or a class's method or field. `x.y` where y is a key of conf/ (`data.seq_len`,
  `evaluation.window`) is a config key, not a module, and is left alone;
- the names of modules that no longer exist (`config_schema`, `reporting.py`, ...).
Every failure is listed at once, as file:line.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "gru_experiments"
SKIP_DIRS = {".git", ".venv", "__pycache__", ".ruff_cache", ".pytest_cache", "gru_experiments.egg-info"}
RUNTIME_DIRS = {"outputs", "multirun", "wandb", "data"}  # what runs write at the top of the repo (paths.*)

# Modules that moved or were merged away: a mention of one in code's form is stale wherever it is.
GONE_MODULES = {"config_schema", "language_model", "lightning_module", "reporting"}
# Files a run, a sweep or a sampling run writes (docs/outputs.md): named, never in the repo.
RUN_OUTPUTS = {"report.md", "config.yaml", "overrides.yaml", "hydra.yaml", "multirun.yaml", "dynamic_study.md"}
# Files a reader is told to write: docs/configuration.md's example of a new model.
EXAMPLES = {"conf/model/astra_delta.yaml"}
EXTENSIONS = {"py", "md", "yaml", "yml", "toml", "txt", "xz", "json", "csv", "ckpt", "png", "ipynb",
              "log", "pt", "model", "vocab", "sh", "cfg", "ini", "svg", "pdf", "html", "lock", "jsonl"}
CHECKED_BARE = {"py", "md", "yaml", "yml", "toml", "ipynb"}  # bare names of these must exist


def repo_files() -> list[Path]:
    """Every file and folder of the repo, but caches, the environment and what runs write."""
    out = []
    stack = [REPO]
    while stack:
        folder = stack.pop()
        for path in folder.iterdir():
            if path.is_dir():
                if path.name not in SKIP_DIRS and not (folder == REPO and path.name in RUNTIME_DIRS):
                    out.append(path)
                    stack.append(path)
            else:
                out.append(path)
    return out


FILES = repo_files()
RELATIVE = {path.relative_to(REPO).as_posix() for path in FILES}
NAMES = {path.name for path in FILES}
ROOTS = {path.name for path in FILES if path.parent == REPO or path.is_dir() and PACKAGE in path.parents}


def path_exists(text: str) -> bool:
    """`text` is a repo path, or the tail of one that starts at a folder boundary."""
    text = text.rstrip("/")
    return text in RELATIVE or any(rel.endswith("/" + text) for rel in RELATIVE)


# ---------------------------------------------------------------------------------------------
# Modules and what they define


def module_files() -> dict[str, list[Path]]:
    """Every module's or package's last name -> its files (a package: its __init__.py)."""
    out: dict[str, list[Path]] = {}
    for path in FILES:
        if path.is_dir() and (path / "__init__.py").exists():
            out.setdefault(path.name, []).append(path / "__init__.py")
        elif path.suffix == ".py" and path.name != "__init__.py" and (
                PACKAGE in path.parents or path.parent == REPO):
            out.setdefault(path.stem, []).append(path)
    return out


MODULES = module_files()


@cache
def defined_names(source: Path) -> dict[str, ast.AST | None]:
    """The names a module's source defines at its top (through if/try blocks): name -> its node.

    A name a module imports is not its own (`evaluation.Split` names the wrong home of `Split`), but
    a package's __init__.py exports what it imports, and `__all__` lists what a module exports."""
    tree = ast.parse(source.read_text(), filename=str(source))
    names: dict[str, ast.AST | None] = {}

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = None
                if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                    for element in getattr(node.value, "elts", []):
                        if isinstance(element, ast.Constant):
                            names.setdefault(element.value, None)
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and source.name == "__init__.py":
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = None
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))

    visit(tree.body)
    return names


def class_members(node: ast.ClassDef) -> set[str]:
    """A class's methods, nested classes and fields."""
    members = set()
    for child in node.body:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.add(child.name)
        elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name):
            members.add(child.target.id)
        elif isinstance(child, ast.Assign):
            members |= {t.id for t in child.targets if isinstance(t, ast.Name)}
    return members


def resolves(source: Path, parts: list[str]) -> bool:
    """`parts` names something inside the module (or package) whose source is `source`."""
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    if source.name == "__init__.py":
        folder = source.parent
        if (folder / head / "__init__.py").exists():
            return resolves(folder / head / "__init__.py", rest)
        if (folder / f"{head}.py").exists():
            return resolves(folder / f"{head}.py", rest)
    names = defined_names(source)
    if head not in names:  # an instance named after its module: `progress.phase` for Progress.phase
        return any(isinstance(node, ast.ClassDef) and head in class_members(node) for node in names.values())
    node = names[head]
    if not rest or not isinstance(node, ast.ClassDef):
        return True  # an attribute of a function or a value: not checked further
    return rest[0] in class_members(node)


def dotted_exists(parts: list[str]) -> bool:
    """`parts[0]` is a module or package of that last name, and the rest names something in it."""
    return any(resolves(source, parts[1:]) for source in MODULES.get(parts[0], []))


@cache
def keys() -> frozenset[str]:
    """The keys of conf/ (`data.seq_len`) and the string keys of the package's dicts (summary.json's
    `context_curve.settings`): `x.key` is a key's path, not a module's name."""
    keys: set[str] = set()

    def walk(value):
        if isinstance(value, dict):
            for key, child in value.items():
                keys.add(str(key).split("@")[0])
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    for path in (REPO / "conf").rglob("*.yaml"):
        walk(yaml.safe_load(path.read_text()))
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys |= {key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)}
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                keys.add(str(node.slice.value))
    return frozenset(keys)


@cache
def classes() -> dict[str, list[ast.ClassDef]]:
    """Every class the package defines, by name."""
    out: dict[str, list[ast.ClassDef]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(node)
    return out


# ---------------------------------------------------------------------------------------------
# What the texts mention

# a path: two parts or more, or one part with a slash after it; a trailing `.attr` on a module
PATH = re.compile(r"(?<![\w./$~@:-])((?:[\w.-]+/)+(?:[\w.-]*[\w])?/?)")
BARE_FILE = re.compile(r"(?<![\w./$~@-])([\w-]+\.(?:" + "|".join(sorted(EXTENSIONS)) + r"))(?![\w/-])")
DOTTED = re.compile(r"(?<![\w./$~@-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w(/-]*=)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
GONE = re.compile(r"\b(" + "|".join(sorted(GONE_MODULES)) + r")\b(?:\.py)?")


def check_text(text: str, folder: Path = REPO) -> list[str]:
    """The stale names one line of text mentions, each with why; a link resolves from `folder`."""
    problems = []
    spans_done: list[tuple[int, int]] = []

    def seen(match) -> bool:
        return any(a <= match.start(1) < b for a, b in spans_done)

    for match in LINK.finditer(text):
        spans_done.append(match.span(1))
        target, _, anchor = match.group(1).partition("#")
        if not target or target.startswith(("http", "mailto:")):
            continue
        if not (folder / target).exists():
            problems.append(f"link {target}: no such file from {folder.relative_to(REPO).as_posix() or '.'}/")
        elif anchor and target.endswith(".md") and anchor not in anchors(folder / target):
            problems.append(f"link {target}#{anchor}: no such heading")
    for match in PATH.finditer(text):
        if seen(match):
            continue
        spans_done.append(match.span(1))
        path = match.group(1)
        if any(c in path for c in "<>*{}") or path.startswith(("http", "www.", "/", "./", "../")):
            continue
        first = path.split("/")[0]
        if first not in ROOTS:
            continue
        head, _, last = path.rstrip("/").rpartition("/")
        stem, dot, attr = last.partition(".")
        if path_exists(path):  # a file whose name has dots of its own (corpora/pystdlib.LICENSE.txt)
            continue
        if dot and attr.split(".")[0] not in EXTENSIONS and not attr[:1].isdigit():
            module = f"{head}/{stem}.py"  # runs/scoring.planned_forward_tokens
            if not path_exists(module) and not path_exists(f"{head}/{stem}"):
                problems.append(f"{path}: no module {head}/{stem}")
            elif path_exists(module):
                sources = [REPO / rel for rel in RELATIVE if rel == module or rel.endswith("/" + module)]
                if not any(resolves(source, attr.split(".")) for source in sources):
                    problems.append(f"{path}: {module} defines no {attr}")
            continue
        if not path_exists(path) and path not in EXAMPLES:
            problems.append(f"{path}: no such file or folder")
    for match in BARE_FILE.finditer(text):
        if seen(match):
            continue
        spans_done.append(match.span(1))
        name = match.group(1)
        if name.rpartition(".")[2] in CHECKED_BARE and name not in RUN_OUTPUTS and name not in NAMES:
            problems.append(f"{name}: no file of that name")
    for match in DOTTED.finditer(text):
        if seen(match):
            continue
        spans_done.append(match.span(1))
        parts = match.group(1).split(".")
        if parts[-1] in EXTENSIONS:
            continue
        if parts[0] in classes():  # Split.of, RunDir.last_written: a member of the package's class
            if not any(parts[1] in class_members(node) for node in classes()[parts[0]]):
                problems.append(f"{match.group(1)}: class {parts[0]} has no {parts[1]}")
        elif (parts[0] in MODULES or parts[0] in GONE_MODULES) and not dotted_exists(parts) and (
                dotted_exists(parts[:2]) or parts[1] not in keys()):  # data.seq_len: a config key
            what = "module, name or config key" if (REPO / "conf" / parts[0]).is_dir() else "module or name"
            problems.append(f"{match.group(1)}: no such {what}")
    for match in GONE.finditer(text):
        if seen(match) or match.group(1) == "reporting" and not re.match(r"reporting\.\w", text[match.start():]):
            continue
        problems.append(f"{match.group(0)}: a module that no longer exists")
    return problems


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to -."""
    headings = re.findall(r"^#+\s+(.*)$", page.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def markdown_lines(path: Path):
    """(line number, text) of every line of a page."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        yield number, line


def python_lines(path: Path):
    """(line number, text) of every comment and docstring of a Python file."""
    source = path.read_text()
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(
                node.value.value, str):
            for number in range(node.lineno, node.end_lineno + 1):
                yield number, lines[number - 1]


def texts() -> list[Path]:
    found = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", *sorted((REPO / "benchmarks").glob("*.md")),
             *sorted(PACKAGE.rglob("*.py")), *sorted((REPO / "benchmarks").glob("*.py"))]
    return found + [REPO / name for name in ("train.py", "sample.py", "sweep.py")]


def stale_names() -> list[str]:
    failures = []
    for path in texts():
        lines = markdown_lines(path) if path.suffix == ".md" else python_lines(path)
        for number, line in lines:
            where = f"{path.relative_to(REPO)}:{number}"
            failures += [f"{where}: {problem}" for problem in check_text(line, path.parent)]
    return failures


def test_every_name_the_docs_and_comments_mention_exists():
    failures = stale_names()
    assert not failures, f"{len(failures)} stale names:\n" + "\n".join(failures)


def test_the_check_sees_a_stale_name_and_leaves_prose_and_config_keys_alone():
    assert check_text("see `gru_experiments/study/scores.py` and `study/plan.py`") == []
    assert check_text("`scores.Split`, `gru_experiments.models.protocol.LanguageModel`, `data/`") == []
    assert check_text("`data.seq_len=256`, `evaluation.window`, e.g. outputs/runs/x, i.e. this") == []
    assert check_text("the reporting of `train.py`, `Split.of`, `runs/scoring.py`") == []
    assert check_text("[the ladder](docs/results.md#the-ladder), [home](README.md)") == []
    stale = ["`gru_experiments/corpora`", "`data.py`", "`fast_recurrence.py`", "`evaluation.Split`",
             "`evaluation.score_contexts`", "`reporting.JobResult`", "config_schema", "`study/nothing.py`",
             "runs/scoring.no_such_function", "`gru_experiments.models.protocol.NoSuchClass`",
             "`Split.no_such_member`", "`gru_experiments/cells.py`", "[a link](docs/no_such_page.md)",
             "[a heading](docs/results.md#no-such-heading)"]
    for text in stale:
        assert check_text(text), text


if __name__ == "__main__":
    print("\n".join(stale_names()))
