"""results.csv: atomic appends, resume after a kill, failed points as rows, the kind plugins."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from ddpbench.experiments import kinds, runner, schema

REPO = Path(__file__).resolve().parents[2]

# A kind defined outside the runner, through the plugin interface of runner's docstring:
# point i sleeps, then returns i**2; point `fail` fails while SLEEPY_FAIL is set (a fault
# outside the spec, so fixing it changes no point's key).
SLEEPY = '''
import os, sys, time
from pydantic import BaseModel, ConfigDict
from ddpbench.experiments import kinds, naming, runner, schema

class Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    n: int
    delay: float = 0.0
    fail: int = -1

class Sleepy:
    Spec = Spec
    @staticmethod
    def expand(spec):
        return [{"mode": "emulate", "i": i, "delay": spec.delay, "fail": spec.fail}
                for i in range(spec.n)]
    @staticmethod
    def point_name(p):
        return naming.make_name("sleepy", {"i": p["i"]})
    @staticmethod
    def run_point(p):
        print("ran", p["i"], flush=True)
        time.sleep(p["delay"])
        if p["i"] == p["fail"] and os.environ.get("SLEEPY_FAIL"):
            raise ValueError(f"point {p['i']} fails on purpose")
        return {"value": p["i"] ** 2, "samples_s": [0.5, 0.25]}
    @staticmethod
    def render(df, outdir, spec):
        return []

kinds.EXPERIMENT_KINDS["sleepy"] = Sleepy
'''


def sleepy_script(tmp_path: Path) -> Path:
    script = tmp_path / "sleepy_run.py"
    script.write_text(SLEEPY + textwrap.dedent('''
        exp = schema.load_experiment(sys.argv[1])
        force = "--force" in sys.argv
        s = runner.run_experiment(exp, sys.argv[2], jobs=1, progress=False, force=force)
        print("summary", s.ok, s.failed, s.skipped, flush=True)
        '''))
    return script


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_kill_mid_sweep_then_rerun_gives_every_row_once(tmp_path):
    n = 12
    exp = tmp_path / "sleepy.yaml"
    exp.write_text(f"name: sleepy\nkind: sleepy\nn: {n}\ndelay: 0.15\n")
    out = tmp_path / "out"
    script = sleepy_script(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), str(exp), str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = out / "results.csv"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if results.exists() and len(read_rows(results)) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    first = read_rows(results)
    assert 3 <= len(first) < n, "the kill should land mid-sweep"
    finished = {r["point"] for r in first}

    rerun = subprocess.run([sys.executable, str(script), str(exp), str(out)], env=env,
                           capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    ran_again = {f"sleepy[i={line.split()[1]}]" for line in rerun.stdout.splitlines()
                 if line.startswith("ran ")}
    assert not (ran_again & finished), "finished points must not run again"
    rows = read_rows(results)
    assert sorted(r["point"] for r in rows) == sorted(f"sleepy[i={i}]" for i in range(n))
    for r in rows:
        i = int(r["point"][len("sleepy[i="):-1])
        assert r["status"] == "ok" and int(r["value"]) == i * i
        assert r["samples_s"] == "[0.5,0.25]"
    # A third run has nothing to do.
    again = subprocess.run([sys.executable, str(script), str(exp), str(out)], env=env,
                           capture_output=True, text=True, timeout=60)
    assert "ran " not in again.stdout and f"summary 0 0 {n}" in again.stdout


def test_failed_point_is_a_row_and_is_retried_once_fixed(tmp_path):
    exp = tmp_path / "sleepy.yaml"
    exp.write_text("name: sleepy\nkind: sleepy\nn: 5\nfail: 3\n")
    out = tmp_path / "out"
    script = sleepy_script(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run1 = subprocess.run([sys.executable, str(script), str(exp), str(out)],
                          env={**env, "SLEEPY_FAIL": "1"}, capture_output=True, text=True,
                          timeout=60)
    assert "summary 4 1 0" in run1.stdout, run1.stdout + run1.stderr
    rows = {r["point"]: r for r in read_rows(out / "results.csv")}
    assert rows["sleepy[i=3]"]["status"] == "failed"
    assert rows["sleepy[i=3]"]["error"].startswith("ValueError: point 3 fails on purpose")
    assert rows["sleepy[i=3]"]["value"] == ""
    # Fixed: only the failed point runs again, and its row replaces the failed one.
    run2 = subprocess.run([sys.executable, str(script), str(exp), str(out)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert "summary 1 0 4" in run2.stdout and run2.stdout.count("ran ") == 1
    rows = read_rows(out / "results.csv")
    assert len(rows) == 5 and all(r["status"] == "ok" for r in rows)
    # --force runs everything again, still one row per point.
    run3 = subprocess.run([sys.executable, str(script), str(exp), str(out), "--force"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert "summary 5 0 0" in run3.stdout
    assert len(read_rows(out / "results.csv")) == 5


def test_store_drops_a_torn_last_line_and_unions_columns(tmp_path):
    path = tmp_path / "results.csv"
    store = runner.ResultsStore(path)
    store.append({"mode": "simulate", "point": "a[x=1]", "repetition": 0, "status": "ok",
                  "t": 1.5})
    store.append({"mode": "simulate", "point": "a[x=2]", "repetition": 0, "status": "ok",
                  "t": 2.5})
    with open(path, "a") as f:
        f.write("simulate,a[x=3],0,o")  # a kill in the middle of a write
    store = runner.ResultsStore(path)
    assert [r["point"] for r in store.rows] == ["a[x=1]", "a[x=2]"]
    assert path.read_text().endswith("2.5\n")
    # A row with a new column rewrites the file with the union of the columns.
    store.append({"mode": "simulate", "point": "a[x=3]", "repetition": 0, "status": "ok",
                  "t": 3.5, "extra": [1, 2]})
    rows = read_rows(path)
    assert [r["extra"] for r in rows] == ["", "", "[1,2]"]
    assert [float(r["t"]) for r in rows] == [1.5, 2.5, 3.5]
    assert store.done() == {("simulate", f"a[x={i}]", "0") for i in (1, 2, 3)}
    assert not list(tmp_path.glob(".tmp*"))


def test_store_sets_aside_a_row_that_does_not_parse(tmp_path, capsys):
    # A row cut short in the middle of the file, one with a cut JSON list, one whose cut
    # quote would run into the rows below it, one with an unknown status: none is counted
    # as finished, each is reported with its line, all go to results.rejected.csv as they
    # were, and the good rows around them stay.
    path = tmp_path / "results.csv"
    store = runner.ResultsStore(path)
    for i in range(6):
        store.append({"mode": "simulate", "point": f"a[x={i}]", "repetition": 0,
                      "status": "ok", "t": i + 0.5, "samples": [i, i]})
    lines = path.read_text().split("\n")
    bad = {2: lines[2][:12], 3: lines[3].replace("[2,2]", "[2,"),
           4: lines[4].replace('"[3,3]"', '"[3,3]'), 5: lines[5].replace(",ok,", ",okay,")}
    for i, text in bad.items():
        lines[i] = text
    path.write_text("\n".join(lines))
    store = runner.ResultsStore(path)
    assert [r["point"] for r in store.rows] == ["a[x=0]", "a[x=5]"]
    assert store.done() == {("simulate", "a[x=0]", "0"), ("simulate", "a[x=5]", "0")}
    err = capsys.readouterr().err
    assert "4 row(s) of" in err and "set aside in results.rejected.csv beside it" in err
    for number in (3, 4, 5, 6):
        assert f"  line {number}: " in err, err
    assert "cut short or run together" in err and "is not valid JSON" in err
    assert "a quoted cell is not closed" in err
    assert "status 'okay' is neither ok nor failed" in err
    aside = (tmp_path / runner.REJECTED).read_text().split("\n")
    assert aside[0] == lines[0] and aside[1:5] == [bad[i] for i in (2, 3, 4, 5)]
    # The file now holds the good rows only, and a second read finds nothing to set aside.
    assert [r["point"] for r in runner.ResultsStore(path).rows] == ["a[x=0]", "a[x=5]"]
    assert "does not parse" not in capsys.readouterr().err


def test_store_writes_one_line_per_row(tmp_path):
    path = tmp_path / "results.csv"
    runner.ResultsStore(path).append({"mode": "simulate", "point": "a[x=1]", "repetition": 0,
                                      "status": "failed", "error": "two\nlines"})
    assert path.read_text().count("\n") == 2
    assert runner.ResultsStore(path).rows[0]["error"] == "two lines"


def test_store_puts_rows_and_columns_in_the_sweeps_order(tmp_path):
    # Points finish in any order under parallel jobs; the file ends in the sweep's order,
    # with columns as they first appear along it, whatever order the rows came in.
    def finish(order):
        path = tmp_path / f"{''.join(map(str, order))}.csv"
        store = runner.ResultsStore(path)
        for i in order:
            extra = {"only_b": 1.0} if i == 1 else {}
            store.append({"experiment": "e", "kind": "k", "mode": "simulate",
                          "point": f"a[x={i}]", "repetition": 0, "status": "ok",
                          "error": "", "x": i, **extra, "t": i / 2})
        store.put_in_order([("simulate", f"a[x={i}]", "0") for i in range(3)])
        return path.read_text()

    text = finish([2, 0, 1])
    assert text == finish([1, 2, 0]) == finish([0, 1, 2])
    header, *rows = text.splitlines()
    assert header == "experiment,kind,mode,point,repetition,status,error,x,t,only_b"
    assert [r.split(",")[3] for r in rows] == ["a[x=0]", "a[x=1]", "a[x=2]"]
    # In order already: nothing is rewritten.
    path = tmp_path / "012.csv"
    before = path.stat().st_mtime_ns
    runner.ResultsStore(path).put_in_order([("simulate", f"a[x={i}]", "0") for i in range(3)])
    assert path.stat().st_mtime_ns == before


def test_only_glob_matches_brackets_literally(tmp_path):
    exp_file = tmp_path / "s.yaml"
    exp_file.write_text("name: s\nkind: sleepy\nn: 12\n")
    exec(compile(SLEEPY, "sleepy", "exec"), {})
    try:
        exp = schema.load_experiment(exp_file)
        names = [p.name for p in runner.expand_points(exp, "sleepy[*=1]")]
        assert names == ["sleepy[i=1]"]
        assert len(runner.expand_points(exp, "sleepy[*")) == 12
        assert [p.name for p in runner.expand_points(exp, "i=1")] == [
            "sleepy[i=1]", "sleepy[i=10]", "sleepy[i=11]"]
        assert runner.run_experiment(exp, tmp_path / "out", mode="emulate", only="i=1",
                                     dry_run=True, progress=False).planned == [
            ("emulate", "sleepy[i=1]"), ("emulate", "sleepy[i=10]"), ("emulate", "sleepy[i=11]")]
        with pytest.raises(ValueError, match="--mode 'real' matches none .* modes: .'emulate'."):
            runner.run_experiment(exp, tmp_path / "out", mode="real", dry_run=True)
    finally:
        kinds.EXPERIMENT_KINDS.pop("sleepy", None)


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    n: int


def test_missing_kind_module_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(kinds.EXPERIMENT_KINDS, "ghost", "ddpbench.no_such_module")
    with pytest.raises(schema.ExperimentError) as info:
        schema.parse_experiment("name: g\nkind: ghost\nn: 1\n", "g.yaml")
    assert "g.yaml:2: field 'kind'" in str(info.value)
    assert "ddpbench.no_such_module" in str(info.value)

    class Partial:
        Spec = _Spec

    monkeypatch.setitem(kinds.EXPERIMENT_KINDS, "partial", Partial)
    with pytest.raises(schema.ExperimentError, match="lacks \\['expand'"):
        schema.parse_experiment("name: g\nkind: partial\nn: 1\n", "g.yaml")


def test_duplicate_point_names_are_refused(monkeypatch):
    class Clash:
        Spec = _Spec

        @staticmethod
        def expand(spec):
            return [{"i": i} for i in range(spec.n)]

        @staticmethod
        def point_name(p):
            return "same"

        run_point = render = staticmethod(lambda *a: None)

    monkeypatch.setitem(kinds.EXPERIMENT_KINDS, "clash", Clash)
    exp = schema.parse_experiment("name: c\nkind: clash\nn: 2\n")
    with pytest.raises(ValueError, match="two points share the name 'same'"):
        runner.expand_points(exp)
