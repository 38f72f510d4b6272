"""The mutation list (tests/mutations.py) stays current: every mutation's text occurs exactly once in its file, the
mutated file is still Python, and it names a test that exists, so no refactor can leave a guard that mutates nothing
and no mutation is "caught" by a syntax error."""

import re

import pytest

import mutations


@pytest.mark.parametrize("name", sorted(mutations.MUTATIONS))
def test_every_mutations_text_occurs_exactly_once_in_its_file(name):
  path, text, mutated, _ = mutations.MUTATIONS[name]
  assert text != mutated
  assert (mutations.ROOT / path).read_text().count(text) == 1, f"{name}: update its text to the code it guards"


@pytest.mark.parametrize("name", sorted(mutations.MUTATIONS))
def test_every_mutated_file_still_compiles(name):
  path, text, mutated, _ = mutations.MUTATIONS[name]
  compile((mutations.ROOT / path).read_text().replace(text, mutated), path, "exec")


@pytest.mark.parametrize("name", sorted(mutations.MUTATIONS))
def test_every_mutation_names_a_test_that_exists(name):
  path, _, test = mutations.MUTATIONS[name][3].partition("::")
  function = re.match(r"\w+", test).group(0)
  assert re.search(rf"^def {function}\(", (mutations.ROOT / path).read_text(), re.M), f"{name}: no test {test}"
