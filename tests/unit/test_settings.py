"""The pack's switches (kernels/settings.py): one parser for every variable, read once, a warning for a value it does
not understand, the experiments list; and the shipped code naming no variable but these."""

from __future__ import annotations

import logging
import pathlib
import re

import pytest
from comfyui_ideogram4_int8.kernels import path_choice, registry, settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED_DIRS = ("kernels", "ideogram4", "nodes", "web")
TEXT_SUFFIXES = {".py", ".js", ".mjs", ".json", ".md", ".css", ".html"}
NAME = re.compile(r"IDEOGRAM4_INT8_[A-Z0-9_]*[A-Z0-9]")
ON_SPELLINGS = ("1", "on", "true", "yes", "ON", " True ", "Yes")
OFF_SPELLINGS = ("0", "off", "false", "no", "OFF", " False", "NO ")


def shipped_files() -> list[pathlib.Path]:
    """The code users install: kernels/, ideogram4/, nodes/, web/ and the root's Python files."""
    files = [p for d in SHIPPED_DIRS for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES]
    return sorted(files + list(ROOT.glob("*.py")))


@pytest.mark.parametrize("name", [n for n, s in settings.SWITCHES.items() if s.kind == "on-off"])
def test_on_off_switches_take_every_spelling(name):
    for raw in ON_SPELLINGS:
        assert settings.read({name: raw}).values[name] is True, raw
    for raw in OFF_SPELLINGS:
        assert settings.read({name: raw}).values[name] is False, raw
    unset = settings.read({})
    assert unset.values[name] is settings.SWITCHES[name].default and not unset.problems


def test_cuda_graphs_takes_auto_and_the_on_off_spellings():
    assert settings.read({}).values[settings.CUDA_GRAPHS] == "auto"
    for raw, mode in (("auto", "auto"), ("AUTO", "auto"), *((s, "on") for s in ON_SPELLINGS)):
        assert settings.read({settings.CUDA_GRAPHS: raw}).values[settings.CUDA_GRAPHS] == mode, raw
    for raw in OFF_SPELLINGS:
        assert settings.read({settings.CUDA_GRAPHS: raw}).values[settings.CUDA_GRAPHS] == "off", raw


def test_choices_and_their_defaults():
    for path in settings.GEMM_PATHS:
        assert settings.read({settings.GEMM_PATH: f" {path.upper()} "}).values[settings.GEMM_PATH] == path
    assert settings.read({settings.GEMM_PATH: "auto"}).values[settings.GEMM_PATH] == "auto"
    assert settings.read({settings.ATTENTION: "ComfyUI"}).values[settings.ATTENTION] == "comfyui"
    assert settings.read({}).values[settings.ATTENTION] == "auto"
    for path in settings.ATTENTION_PATHS:
        assert settings.read({settings.ATTENTION: path.upper()}).values[settings.ATTENTION] == path


def test_the_forcible_paths_are_the_registrys():
    assert settings.GEMM_PATHS == (registry.PATH_TRITON, registry.PATH_CUBLAS, registry.PATH_DEQUANT)
    assert settings.GEMM_PATHS == path_choice._QUANT_PATHS


def test_slots_and_the_cache_folder():
    assert settings.read({settings.STREAM_SLOTS: "4"}).values[settings.STREAM_SLOTS] == 4
    assert settings.read({}).values[settings.STREAM_SLOTS] is None
    folder = "/Data/Cache Dir"  # kept as given: case and spaces inside
    assert settings.read({settings.CACHE_DIR: f" {folder} "}).values[settings.CACHE_DIR] == folder


@pytest.mark.parametrize(
    ("name", "raw", "default", "accepted"),
    [
        (settings.STREAM, "maybe", True, "1/on/true/yes or 0/off/false/no"),
        (settings.GEMM_TIMING, "sometimes", None, "1/on/true/yes"),
        (settings.CUDA_GRAPHS, "always", "auto", "auto, on, off"),
        (settings.GEMM_PATH, "fastest-please", "auto", "auto, triton-int8, cublas-int8, dequant-bf16"),
        (settings.ATTENTION, "sage", "auto", "auto, comfyui, sdpa, int8, fp8"),
        (settings.STREAM_SLOTS, "0", None, "a whole number >= 1"),
        (settings.STREAM_SLOTS, "two", None, "a whole number >= 1"),
    ],
)
def test_a_value_not_understood_falls_back_and_says_why(name, raw, default, accepted):
    got = settings.read({name: raw})
    assert got.values[name] == default
    problem = got.problems[name]
    assert problem.startswith(f"{name}={raw!r} is not understood") and accepted in problem, problem
    assert "using the default" in problem


def test_a_bad_value_warns_once_and_never_raises(caplog):
    environ = {settings.CUDA_GRAPHS: "always", settings.STREAM: "on"}
    with caplog.at_level(logging.WARNING, logger="comfyui_ideogram4_int8"):
        settings.reload(environ)
        settings.reload(environ)  # the same problem read again: not warned again
        for _ in range(3):
            assert settings.cuda_graphs() == "auto" and settings.stream() is True
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and settings.CUDA_GRAPHS in warnings[0] and "'always'" in warnings[0], warnings
    with caplog.at_level(logging.WARNING, logger="comfyui_ideogram4_int8"):
        settings.reload({settings.CUDA_GRAPHS: "sometimes"})  # a new value: a new warning
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_read_once_until_reloaded(monkeypatch):
    monkeypatch.delenv(settings.CUDA_GRAPHS, raising=False)
    settings.reload()
    monkeypatch.setenv(settings.CUDA_GRAPHS, "off")
    assert settings.cuda_graphs() == "auto"  # the reading of this run stands
    settings.reload()
    assert settings.cuda_graphs() == "off" and settings.said(settings.CUDA_GRAPHS) == f"{settings.CUDA_GRAPHS}=off"


def test_the_experiments_list():
    got = settings.read({settings.EXPERIMENTS_VAR: " Block-Norms = comfyui ,no-resident-conds,, stream-whole-blocks "})
    assert got.experiments == {"block-norms": "comfyui", "no-resident-conds": "", "stream-whole-blocks": ""}
    assert not got.problems
    later = settings.read({settings.EXPERIMENTS_VAR: "block-norms=comfyui,block-norms=no-handoff"})
    assert later.experiments == {"block-norms": "no-handoff"}
    assert settings.read({}).experiments == {}


def test_experiments_not_understood_are_named_and_ignored():
    raw = "no-such-thing,rope=comfyui,no-autotune=1,block-norms,smooth-fold=sqrt"
    got = settings.read({settings.EXPERIMENTS_VAR: raw})
    assert got.experiments == {"rope": "comfyui"}
    problem = got.problems[settings.EXPERIMENTS_VAR]
    assert "'no-such-thing' is not an experiment (known: no-autotune, cpu-gemm," in problem
    assert "no-autotune takes no value" in problem
    assert "block-norms takes block-norms=comfyui|no-handoff" in problem
    assert "smooth-fold takes smooth-fold=geo|max|min|w1|ratio|off (got 'smooth-fold=sqrt')" in problem
    assert problem.endswith("those entries are ignored")


def test_the_experiment_accessors(setting):
    setting.experiments("rope=comfyui", "no-autotune")
    assert settings.experiment("rope") == "comfyui" and settings.flag("no-autotune")
    assert settings.experiment("block-norms") is None and not settings.flag("no-fuse-gate-up")
    assert settings.said("rope") == f"{settings.EXPERIMENTS_VAR} has rope=comfyui"
    assert settings.said("no-autotune") == f"{settings.EXPERIMENTS_VAR} has no-autotune"
    with pytest.raises(KeyError, match="not an experiment"):
        settings.experiment("no-autotuning")  # a name in the code that is not in the table is a bug


def test_a_variable_of_the_pack_that_is_not_a_setting_is_named():
    got = settings.read({"IDEOGRAM4_INT8_STREAM_PIECES": "0", "OTHER_VARIABLE": "1"})
    problem = got.problems["IDEOGRAM4_INT8_STREAM_PIECES"]
    assert "is not a setting of this pack" in problem and settings.EXPERIMENTS_VAR in problem
    assert "stream-whole-blocks" in problem and list(got.problems) == ["IDEOGRAM4_INT8_STREAM_PIECES"]


def test_every_switch_and_experiment_is_documented():
    doc = settings.__doc__
    for name, switch in settings.SWITCHES.items():
        assert name in doc, name
        for choice in switch.choices:
            assert choice in doc.split(name, 1)[1].splitlines()[0], (name, choice)
    assert settings.EXPERIMENTS_VAR in doc
    assert all(e.what for e in settings.EXPERIMENTS.values())


def test_the_shipped_code_names_at_most_nine_variables_all_read_by_settings():
    found: dict[str, set[str]] = {}
    for path in shipped_files():
        for name in NAME.findall(path.read_text(encoding="utf-8", errors="replace")):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    known = {*settings.SWITCHES, settings.EXPERIMENTS_VAR}
    assert len(known) <= 9
    assert set(found) <= known, {n: sorted(f) for n, f in found.items() if n not in known}


def test_the_docs_name_only_variables_settings_reads():
    """README, CONTRIBUTING and docs/ tell users what to set: a variable renamed or folded into the experiments list
    must not live on there (CHANGELOG keeps its history)."""
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    known = {*settings.SWITCHES, settings.EXPERIMENTS_VAR}
    stale = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in docs
        for name in NAME.findall(path.read_text(encoding="utf-8"))
        if name not in known
    }
    assert len(docs) > 3 and not stale, sorted(stale)
