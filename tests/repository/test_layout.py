"""The house's layout stays as designed: small files, no import cycles, an event loop that only loops."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "models", "launch", "configs")


def _modules() -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every library module (a package by its own name)."""
  files = (p for package in PACKAGES for p in (ROOT / package).glob("**/*.py"))
  return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in files}


def _imports(path: pathlib.Path, known: set[str]) -> set[str]:
  """The project's modules that `path` imports."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
  return found & known


def test_no_import_cycles_among_the_projects_modules():
  modules = _modules()
  graph = {m: _imports(p, set(modules)) - {m} for m, p in modules.items()}
  done: set[str] = set()

  def visit(module: str, path: list[str]) -> None:
    for dep in sorted(graph[module]):
      assert dep not in path, f"import cycle: {' -> '.join(path[path.index(dep):] + [dep])}"
      if dep not in done:
        visit(dep, path + [dep])
    done.add(module)

  for module in sorted(graph):
    visit(module, [module])


def test_no_library_file_exceeds_600_lines_a_sanity_limit_not_a_target():
  # A file is as long as its concept needs (STYLE.md, item 13); past 600 lines, look again at what it owns.
  sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _modules().values()}
  assert not {f: n for f, n in sizes.items() if n > 600}


def _package(module: str) -> str:
  """The package a module belongs to: its folder's dotted name."""
  path = _modules()[module]
  return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _package_imports() -> dict[tuple[str, str], list[str]]:
  """(importing package, imported package) -> the imports between them, over runtime's packages at one depth: its
  top packages (runtime.X, subpackages included), and each package's subpackages among themselves."""
  modules = _modules()
  pairs: dict[tuple[str, str], list[str]] = {}
  for module in (m for m in modules if m.startswith("runtime.")):
    for dep in _imports(modules[module], set(modules)):
      a, b = _package(module).split("."), _package(dep).split(".")
      depth = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
      if depth is not None and depth >= 1 and len(a) > depth and len(b) > depth:
        pairs.setdefault((".".join(a[:depth + 1]), ".".join(b[:depth + 1])), []).append(f"{module} -> {dep}")
  return pairs


def test_no_two_packages_import_each_other():
  """Packages depend one way (STYLE.md, item 12): runtime's packages, and the subpackages of each one."""
  pairs = _package_imports()
  both = {f"{a} <-> {b}": sorted(pairs[a, b] + pairs[b, a]) for a, b in pairs if (b, a) in pairs and a < b}
  assert not both


def test_no_module_reads_or_writes_another_objects_private_attributes():
  """`x._name` only for x = self (or cls, or super()); runtime/bench meters the controller's internals by wrapping
  them, which is what a benchmark of them is for."""
  found = []
  for module, path in _modules().items():
    if module.startswith("runtime.bench"):
      continue
    tree = ast.parse(path.read_text())
    allowed = {"self", "cls"} | _external(tree)
    for node in ast.walk(tree):
      if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
        continue
      owner = node.value
      if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
        continue
      if isinstance(owner, ast.Name) and owner.id in allowed:
        continue
      found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
  assert not found


def _external(tree: ast.Module) -> set[str]:
  """Names bound to modules outside the project (`os`, jax's own), whose private names are theirs to allow."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] not in PACKAGES}
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] not in PACKAGES:
      names |= {a.asname or a.name for a in node.names}
  return names


OWNERS = ["controller", "budget", "theta_post", "rounds", "merge_schedule", "membership", "durability",
          "slices/lifecycle", "slices/one_slice", "slices/several_slices"]


@pytest.mark.parametrize("path", [f"runtime/diloco/{owner}.py" for owner in OWNERS])
def test_the_controller_and_the_owners_it_builds_assign_no_attribute_of_another_object(path):
  tree = ast.parse((ROOT / path).read_text())
  foreign = []
  for node in ast.walk(tree):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, (ast.AugAssign, ast.AnnAssign)) else []
    for target in (t for tuple_ in targets for t in (tuple_.elts if isinstance(tuple_, ast.Tuple) else [tuple_])):
      owner = target.value if isinstance(target, ast.Attribute) else None
      if owner is not None and not (isinstance(owner, ast.Name) and owner.id == "self"):
        foreign.append(f"line {node.lineno}: {ast.unparse(target)}")
  assert not foreign


def test_a_learners_status_changes_only_inside_the_learner_package():
  """Its lifecycle is one table of legal transitions (runtime/diloco/learner/lifecycle.py); everyone else asks the
  learner to do something, and the learner moves its status."""
  found = []
  for module, path in _modules().items():
    if module.startswith("runtime.diloco.learner"):
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "set_status":
        found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
      if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        found += [f"{module}:{node.lineno}: {ast.unparse(t)}" for t in targets
                  if isinstance(t, ast.Attribute) and t.attr == "status"]
  assert not found


def _classes() -> dict[str, list[ast.ClassDef]]:
  """Class name -> its definitions, over every library module."""
  found: dict[str, list[ast.ClassDef]] = {}
  for path in _modules().values():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ClassDef):
        found.setdefault(node.name, []).append(node)
  return found


def test_no_project_class_inherits_from_two_or_more_project_classes():
  """Mixins that share `self` spread one object over several files: state is composed, not inherited."""
  classes = _classes()
  base_names = lambda node: [ast.unparse(b).rpartition(".")[2] for b in node.bases]
  mixed = {name: base_names(node) for name, nodes in classes.items() for node in nodes
           if sum(b in classes for b in base_names(node)) >= 2}
  assert not mixed


@pytest.mark.parametrize("name", ["Controller", "Syncer", "Learner"])
def test_the_controller_learner_and_syncer_inherit_from_nothing(name):
  node, = _classes()[name]
  assert not node.bases and not node.keywords


def test_no_handler_is_found_by_a_string():
  """Events go to their handlers through explicit {EventKind: handler} tables, never getattr on a built name."""
  found = []
  for module, path in _modules().items():
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
          and len(node.args) >= 2 and isinstance(node.args[1], ast.JoinedStr)
          and ast.unparse(node.args[1]).startswith(("f'_on_", 'f"_on_'))):
        found.append(f"{module}:{node.lineno}")
  assert not found


@pytest.mark.parametrize("package,allowed", [
    ("runtime/sim", {"runtime.errors", "runtime.sim.config", "runtime.sim.model", "runtime.sim.timeline",
                      "runtime.sim.trace"}),  # NumPy only, no JAX
    # pure bookkeeping over the faults parsed at the config boundary
    ("runtime/faults/plan.py", {"runtime.config", "runtime.config.faults"}),
    ("runtime/config/faults.py", {"runtime.errors", "runtime.config", "runtime.config.schedule", "runtime.sim",
                                  "runtime.sim.trace"}),
    ("runtime/cluster/slice_pool.py", set()),
])
def test_pure_parts_import_no_jax_and_nothing_of_the_runtime_beyond_what_they_need(package, allowed):
  paths = [ROOT / package] if package.endswith(".py") else sorted((ROOT / package).glob("*.py"))
  modules = set(_modules())
  for path in paths:
    source = path.read_text()
    assert "import jax" not in source and "from jax" not in source, path
    assert _imports(path, modules) <= allowed, path


def test_the_runtime_reaches_a_model_only_through_the_model_interface():
  """runtime/ (and launch/) import models.lm, models.interface, models.config and models.sharding, never a model's own
  module, so a user's model trains with nothing in them changed."""
  modules = _modules()
  interface = {"models", "models.lm", "models.interface", "models.config", "models.sharding"}
  for name, path in modules.items():
    if name.startswith(("runtime.", "launch.")):
      reached = {m for m in _imports(path, set(modules)) if m.startswith("models")}
      assert reached <= interface, f"{name} imports {sorted(reached - interface)}"


@pytest.mark.parametrize("module", ["runtime.cli", "runtime.experiments.sweep", "runtime.config.run", "runtime.config.docs"])
def test_the_command_line_boundary_validates_without_importing_jax(module):
  """Bad input is reported before JAX starts: nothing the boundary imports, however indirectly, imports JAX."""
  modules = _modules()
  seen, todo = set(), [module]
  while todo:
    current = todo.pop()
    if current not in seen:
      seen.add(current)
      todo += sorted(_imports(modules[current], set(modules)) - seen)
  for name in sorted(seen):
    tree = ast.parse(modules[name].read_text())
    top = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not top & {"jax", "jaxlib", "flax", "optax", "orbax"}, f"{module} imports {name}, which imports JAX"


def test_runtime_keeps_at_most_six_modules_at_its_top_and_each_package_says_what_it_holds():
  top = sorted(p.name for p in (ROOT / "runtime").glob("*.py"))
  assert len(top) <= 6, top
  for init in sorted((ROOT / "runtime").glob("*/__init__.py")):
    assert ast.get_docstring(ast.parse(init.read_text())), f"{init.parent.name}/__init__.py has no docstring"
