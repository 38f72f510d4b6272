"""The README and docs/ stay true to the tree: every path they name exists and every link resolves."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("**/*.md"))
ROOTS = ("runtime", "models", "launch", "configs", "tests")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*)" % "|".join(ROOTS))
DOTTED = re.compile(r"(?<![\w.])runtime(?:\.\w+)+")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.py") if p.name != "__init__.py")


def _prose(path: pathlib.Path) -> str:
  """The file's text outside fenced code blocks (where brackets are not links)."""
  return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)


def _map() -> str:
  """The README's map of the packages: the section under '### Map', up to the next heading."""
  text = README.read_text()
  start = text.index("\n### Map\n")
  end = text.find("\n#", start + 1)
  return text[start:end if end >= 0 else len(text)]


def _dotted_exists(name: str) -> bool:
  """`runtime.a.b` is a module or package, or `runtime.a.b.f` a name defined at the top of module `runtime.a.b`."""
  parts = name.split(".")
  for cut in range(len(parts), 0, -1):
    base = ROOT.joinpath(*parts[:cut])
    module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    if module.is_file():
      rest = parts[cut:]
      if not rest:
        return True
      tree = ast.parse(module.read_text())
      defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
      defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
      return len(rest) == 1 and rest[0] in defined
  return False


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", _prose(path), flags=re.M)}


def test_the_readme_has_at_most_250_lines():
  assert len(README.read_text().splitlines()) <= 250


def test_every_path_and_module_in_the_readmes_map_exists():
  text = _map()
  paths = PATH.findall(text)
  assert paths, "the map names no paths"
  assert [p for p in paths if not (ROOT / p.rstrip(".")).exists()] == []
  assert [m for m in DOTTED.findall(text) if not _dotted_exists(m)] == []


def test_every_package_under_runtime_is_named_in_the_readmes_map():
  named = {p.rstrip("/") for p in PATH.findall(_map())}
  packages = sorted(p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "runtime").glob("*/**/__init__.py"))
  assert packages and [p for p in packages if p not in named] == []


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_to_a_file_and_heading(path):
  broken = []
  for target in LINK.findall(_prose(path)):
    if re.match(r"[a-z]+:", target):
      continue  # an absolute URL
    file, _, anchor = target.partition("#")
    resolved = (path.parent / file).resolve() if file else path
    if not resolved.exists() or (anchor and anchor not in _anchors(resolved)):
      broken.append(target)
  assert broken == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_and_module_named_in_docs_exists(path):
  text = path.read_text()
  assert [p for p in PATH.findall(text) if not (ROOT / p.rstrip(".")).exists()] == []
  assert [m for m in DOTTED.findall(text) if not _dotted_exists(m)] == []


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_nothing_points_outside_the_repository(path):
  text = path.read_text()
  assert "../shared" not in text
  assert re.findall(r"(?i)\bissues?\s+#?\d+", text) == []


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_configs_docstring_names_an_existing_results_page(path):
  docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
  pages = re.findall(r"docs/results/[\w-]+\.md", docstring)
  assert pages, f"{path.name}'s docstring names no docs/results page"
  assert [p for p in pages if not (ROOT / p).is_file()] == []
