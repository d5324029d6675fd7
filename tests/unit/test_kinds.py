"""Every experiment kind satisfies the ExperimentKind protocol; plain modules get defaults."""

from __future__ import annotations

import types

import pytest
from pydantic import BaseModel, ConfigDict

from ddpbench.experiments import kinds, naming, runner, schema


@pytest.mark.parametrize("name", sorted(kinds.EXPERIMENT_KINDS))
def test_every_registered_kind_is_an_experiment_kind(name):
    kind = kinds.load_kind(name)
    assert isinstance(kind, kinds.ExperimentKind)
    assert issubclass(kind.Spec, BaseModel)


def test_required_members_are_the_protocols_without_defaults():
    optional = {"prepare", "check", "key_params", "batch_key", "size"}
    members = {m for m in dir(kinds.ExperimentKind) if not m.startswith("_")}
    assert set(kinds.REQUIRED) | optional == members


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    n: int


def _module_kind() -> types.SimpleNamespace:
    """Return a kind as a plain module would define it: the required members only."""
    return types.SimpleNamespace(
        Spec=_Spec,
        expand=lambda spec: [{"mode": "emulate", "i": i} for i in range(spec.n)],
        point_name=lambda p: naming.make_name("tiny", {"i": p["i"]}),
        run_point=lambda p: {"sq": p["i"] ** 2},
        render=lambda df, outdir, spec: [])


def test_a_module_without_optional_members_gets_the_defaults(monkeypatch):
    monkeypatch.setitem(kinds.EXPERIMENT_KINDS, "tiny", _module_kind())
    kind = kinds.load_kind("tiny")
    assert isinstance(kind, kinds.Kind)
    params = {"mode": "emulate", "i": 1}
    assert kind.key_params(params) == params and kind.batch_key(params) is None
    exp = schema.parse_experiment("name: t\nkind: tiny\nn: 3\n")
    assert exp.spec == _Spec(n=3)
    assert [p.name for p in runner.expand_points(exp)] == [f"tiny[i={i}]" for i in range(3)]


def test_register_kind_refuses_a_taken_name():
    with pytest.raises(ValueError, match="already registered"):
        kinds.register_kind("throughput", "somewhere.else")


def test_batches_group_points_by_key_in_their_first_order(monkeypatch):
    mod = _module_kind()
    mod.batch_key = lambda p: None if p["i"] == 0 else p["i"] % 2
    monkeypatch.setitem(kinds.EXPERIMENT_KINDS, "tiny", mod)
    exp = schema.parse_experiment("name: t\nkind: tiny\nn: 5\n")
    batches = runner._batches(exp, runner.expand_points(exp))
    assert [[p.params["i"] for p in b] for b in batches] == [[0], [1, 3], [2, 4]]
