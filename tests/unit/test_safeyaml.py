"""The safe YAML loader of the data files: plain data only, the same data as PyYAML's
pure-Python safe loader, and a refusal of any tag that would build an object."""

from __future__ import annotations

import pytest
import yaml

from ddpbench import safeyaml
from ddpbench.experiments.validation import data
from ddpbench.simulator.workload import PROFILE_DIR


def test_the_shipped_data_files_load_as_the_pure_python_safe_loader_reads_them():
    for path in (data.DEFAULT_FILE, PROFILE_DIR / "resnet50.yaml", PROFILE_DIR / "llama_7b.yaml"):
        text = path.read_text(encoding="utf-8")
        assert safeyaml.load(text) == yaml.load(text, Loader=yaml.SafeLoader), path.name


@pytest.mark.parametrize("text", [
    "!!python/object/apply:os.system ['true']",
    "x: !!python/name:os.system",
    "!!python/object:collections.OrderedDict {}",
])
def test_a_tag_that_builds_an_object_is_refused(text):
    with pytest.raises(yaml.constructor.ConstructorError):
        safeyaml.load(text)


def test_dump_writes_what_load_reads_back():
    value = {"points": [{"id": "a", "value": 1.5, "assumed": ["device"], "simulate": False}]}
    assert safeyaml.load(safeyaml.dump(value, sort_keys=False)) == value
