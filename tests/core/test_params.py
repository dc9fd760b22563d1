"""Tests of nopelib.core.params and of every chapter's parameter check (issue 12).

The papermill tests run each chapter with one bad parameter and an empty cache: the chapter must
fail in the check cell right after ``parameters`` (seconds, counting the kernel start), with an
error that names the parameter.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import nbformat
import pytest

from nopelib.core.cost import ALLOW_SLOW_ENV, Cost
from nopelib.core.params import (SEED, SEED_MAX, Choice, Device, Float, Int, ListOf, Optional,
                                 check_params)
from nopelib.training.gate import check_training_time, training_time_problem
from nopelib.training.launch import train_missing
from nopelib.training.profiles import PROFILES

BOOK = Path(__file__).resolve().parents[2] / "book"


def test_every_bad_parameter_is_named_once_with_its_value_and_what_is_allowed():
    spec = {"n": Int(min=1), "x": Float(min=0, max=1), "task": Choice(["a", "b"]),
            "seeds": ListOf(Int(min=0), unique=True), "maybe": Optional(ListOf(Int())),
            "ok": Int()}
    values = {"n": 0, "x": float("nan"), "task": "c", "seeds": [0, 0], "maybe": "[1]", "ok": 3}
    with pytest.raises(ValueError) as err:
        check_params(spec, values)
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 5
    assert "n=0 is not allowed: an integer >= 1" in lines[0]
    assert "x=nan" in lines[1] and "finite" in lines[1]
    assert "task='c'" in lines[2] and "['a', 'b']" in lines[2]
    assert "seeds=[0, 0]" in lines[3] and "no repeats" in lines[3]
    assert "maybe='[1]'" in lines[4] and "-y" in lines[4]  # papermill's -p passes a list as text


def test_types_are_exact():
    assert Int().problem(True, {}) is not None
    assert Int().problem(2.0, {}) is not None
    assert Float().problem("1", {}) is not None
    assert ListOf(Choice(["nope"])).problem('["nope"]', {}) is not None  # a string, not a list
    assert Int().problem(2, {}) is None and Float().problem(2, {}) is None


def test_conditions_may_look_at_other_parameters():
    spec = {"T": Int(min=1).where(lambda t, p: t > p["w"], "greater than w"), "w": Int(min=1)}
    check_params(spec, {"T": 5, "w": 2})
    with pytest.raises(ValueError, match="T=2 is not allowed: greater than w"):
        check_params(spec, {"T": 2, "w": 2})
    with pytest.raises(ValueError, match="w is missing"):
        check_params(spec, {"T": 2})


def test_an_unknown_name_is_refused_with_the_closest_known_one():
    """papermill only warns about ``-p profil paper``; the check names it and the parameter
    that was meant. Private, kernel, module, function and non-literal names are not flagged."""
    spec = {"profile": Choice(["cpu", "paper"]), "n_seeds": Int(min=1)}
    values = {"profile": "cpu", "n_seeds": 3, "profil": "paper", "zzz": [1, {"a": None}],
              "_": 5, "In": ["x = 1"], "Out": {}, "get_ipython": print, "math": math,
              "TASKS": {"a": object()}, "SPEC": spec, "Rule": Int, "flag": True}
    with pytest.raises(ValueError) as err:
        check_params(spec, values)
    lines = str(err.value).splitlines()[1:]
    assert lines == [
        "  profil='paper' is not a parameter of this chapter; did you mean 'profile'?",
        "  zzz=[1, {'a': None}] is not a parameter of this chapter; its parameters: "
        "['n_seeds', 'profile']",
        "  flag=True is not a parameter of this chapter; its parameters: ['n_seeds', 'profile']"]
    empty: dict = {}
    check_params(empty, {"SPEC": empty})  # the spec itself, even an empty (plain) one


def test_a_long_value_is_cut_short_in_the_message():
    with pytest.raises(ValueError) as err:
        check_params({"xs": ListOf(Float(), max_len=3, why="cost")}, {"xs": [0.5] * 20_000})
    text = str(err.value)
    assert len(text) < 600
    assert "(20000 items) is not allowed: a list of 1 to 3 item(s) (cost)" in text


def test_seeds_are_32_bit():
    for ok in (0, 1, SEED_MAX):
        assert SEED.problem(ok, {}) is None
    for bad in (-1, SEED_MAX + 1, 2**64, 1.0, True):
        assert "32-bit seed" in SEED.problem(bad, {})


def test_bounds_and_their_reasons():
    assert Int(max=5, why="5 is an hour").problem(6, {}) == "an integer <= 5 (5 is an hour)"
    assert ListOf(Int(), max_len=2).problem([1, 2, 3], {}).startswith("a list of 1 to 2 item(s)")
    assert Float(min=0, max=1, open_min=True).problem(0.0, {}) == "a finite number > 0 and <= 1"
    assert Float(min=0, max=1, open_min=True).problem(1.0, {}) is None


def test_devices():
    assert Device().problem("cpu", {}) is None
    assert Device().problem("tpu", {}).startswith("device='tpu' is unknown; allowed: 'auto', ")


def test_a_joint_cost_over_its_bound_is_refused_with_the_estimate(monkeypatch):
    """Each size within its own bound, the product over an hour: refused, with the product,
    the estimate and the bound; an opt-in turns it into a warning."""
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    cost = Cost(("n_seeds", "inputs"), 0.5, "~0.5 s, one model on one input")
    spec = {"n_seeds": Int(min=1, max=200).costing(cost), "inputs": ListOf(Int())}
    check_params(spec, {"n_seeds": 200, "inputs": [1] * 36})  # 7,200 x 0.5 s: the hour
    with pytest.raises(ValueError) as err:
        check_params(spec, {"n_seeds": 200, "inputs": [1] * 40})
    assert str(err.value).splitlines()[1] == (
        "  n_seeds=200 is not allowed: n_seeds x inputs = 200 x 40 = 8,000 unit(s) of ~0.5 s, "
        "one model on one input: about 1.1 h; allowed: at most 1 h (7,200 units), or set "
        f"{ALLOW_SLOW_ENV}=1 to run it anyway")
    # a bad size is named by its own rule, not by the cost
    with pytest.raises(ValueError, match=r"inputs='x' is not allowed") as err:
        check_params(spec, {"n_seeds": 200, "inputs": "x"})
    assert "unit(s)" not in str(err.value)
    monkeypatch.setenv(ALLOW_SLOW_ENV, "1")
    with pytest.warns(UserWarning, match=r"n_seeds x inputs = 200 x 40 .* about 1.1 h$"):
        check_params(spec, {"n_seeds": 200, "inputs": [1] * 40})


def test_a_scaled_joint_cost_names_its_factor(monkeypatch):
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    cost = Cost(("seeds",), 60, "~1 min", scale=lambda p: (p["T"] / 100) ** 2,
                scale_text="(T / 100)^2")
    assert cost.problem({"seeds": [0] * 10, "T": 100}) is None
    assert cost.problem({"seeds": [0] * 10, "T": 300}).startswith(
        "seeds x (T / 100)^2 = 10 x 9 = 90 unit(s) of ~1 min: about 1.5 h; allowed: at most 1 h "
        "(60 units)")


def test_paper_training_on_a_cpu_needs_an_opt_in(monkeypatch):
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    with pytest.raises(ValueError, match=rf"profile='paper'.*about \d+ h.*{ALLOW_SLOW_ENV}=1"):
        check_training_time("paper", 20, "cpu")
    check_training_time("cpu", 8, "cpu")  # minutes: no word
    monkeypatch.setenv(ALLOW_SLOW_ENV, "1")
    with pytest.warns(UserWarning, match=r"about \d+ h"):
        check_training_time("paper", 20, "cpu")
    # a budget that follows progress: the step cap bounds the time, no more
    with pytest.warns(UserWarning, match=r"profile='paper_study'.* up to about \d+ h .*step cap"):
        check_training_time("paper_study", 1, "cpu")


def test_the_training_time_counts_rounds_of_workers_and_every_configuration(monkeypatch):
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    # 4 runs of 1,000 s: 2 rounds on 2 processes, 4 on one
    cpu, paper = PROFILES["cpu"], PROFILES["paper"]
    assert training_time_problem(cpu, 4, "cpu", run_seconds=1000, workers=2) is None
    assert training_time_problem(cpu, 4, "cpu", run_seconds=1000, workers=1,
                                 basis="as in the committed study").startswith(
        "profile='cpu' trains 4 run(s) on the CPU in about 1.1 h (1 process(es), one thread "
        "each) as in the committed study; allowed: a GPU")
    # a grid: its configurations one after another, each its runs
    assert training_time_problem([cpu, paper], 1, "cpu", run_seconds=1900,
                                 allowed="fewer").startswith(
        "profiles ['cpu', 'paper'] train 1 run(s) each on the CPU in about 1.1 h")


def test_a_profile_is_resolved_once_where_training_starts():
    # the helpers below the entry points take the object; a name there is a caller's slip
    with pytest.raises(TypeError, match="profile='cpu'.*TrainProfile"):
        training_time_problem("cpu", 4, "cpu")
    with pytest.raises(TypeError, match=r"jobs: the profile of \('addition', 0\) is 'cpu'"):
        train_missing([("addition", 0, "cpu")], device="cpu")
    with pytest.raises(ValueError, match="profile='bogus' is unknown"):  # the entry point
        check_training_time("bogus", 1, "cpu")


def test_a_chapter_resolves_its_profile_before_its_memoised_computations():
    # the memoised functions take the object, so their keys are the profile's fields and a
    # name passed there is refused, not looked up a second time
    from nopelib.studies import early_study, text_study

    with pytest.raises(TypeError, match="init_check: profile='study'.*TrainProfile"):
        early_study.init_check("study", ["addition"], [0])
    with pytest.raises(TypeError, match="init_scores: profile='text'.*TextProfile"):
        text_study.init_scores("text", [0], [32])
    with pytest.raises(TypeError, match="init_predicted: profile='text'.*TextProfile"):
        text_study.init_predicted("text", [32])


# --- the chapters -----------------------------------------------------------------------------

BAD = [  # (chapter, parameters, what the error must name): every finding of issue 12
    ("averaging_effect", {"n_texts": 0}, "n_texts=0"),
    ("averaging_effect", {"task": "nope"}, "task='nope'"),
    ("averaging_effect", {"level": 1.5}, "level=1.5"),
    ("random_init", {"n_seeds": 0}, "n_seeds=0"),
    ("random_init", {"lengths": [2, 64]}, "lengths=[2, 64]"),
    ("random_init", {"grid_widths": [100]}, "grid_widths=[100]"),
    ("random_init", {"init_stds": [0.02, -1.0]}, "init_stds=[0.02, -1.0]"),
    ("random_init", {"init_means": []}, "init_means=[]"),
    ("trained", {"profile": "bogus"}, "profile='bogus'"),
    ("trained", {"tasks": '["nope"]'}, "tasks='[\"nope\"]'"),
    ("trained", {"live_seeds": []}, "live_seeds=[]"),
    ("trained", {"live_tasks": ["reversal", "ordering"], "tasks": ["reversal"]},
     "live_tasks=['reversal', 'ordering']"),
    ("trained", {"heatmap_task": "addition", "live_tasks": ["reversal"]},
     "heatmap_task='addition'"),
    ("trained", {"profile": "paper", "device": "cpu", "live_seeds": [0, 1, 2, 3, 4],
                 "live_tasks": ["addition", "reversal", "indexing", "ordering"]},
     "profile='paper'"),
    ("averaging_effect", {"archs": [[6, 100]]}, "archs=[[6, 100]]"),
    ("averaging_effect", {"excess_seeds": 0}, "excess_seeds=0"),
    ("random_init", {"level": 1.0}, "level=1.0"),
    ("random_init", {"length_seqs": 0}, "length_seqs=0"),
    ("probes", {"n_fit_tokens": 3}, "n_fit_tokens=3"),
    ("probes", {"profile": "bogus"}, "profile='bogus'"),
    ("probes", {"model_seeds": [0, 1]}, "model_seeds=[0, 1]"),  # fewer than 5
    ("probes", {"T": 8}, "T=8"),
    ("probes", {"grid_lengths": [8], "grid_windows": [8]}, "grid_lengths=[8]"),
    ("scorecard", {"profile": "bogus"}, "profile='bogus'"),
    ("long_sequences", {"T": 8}, "T=8"),
    ("long_sequences", {"widths": [100]}, "widths=[100]"),
    ("long_sequences", {"seeds": [0, 1]}, "seeds=[0, 1]"),  # fewer than 3
    ("long_sequences", {"layer": 7}, "layer=7"),
    ("early_dynamics", {"profile": "cpu"}, "profile='cpu'"),
    ("early_dynamics", {"init_seeds": [0, 0]}, "init_seeds=[0, 0]"),
    ("text", {"seeds": [0, 1]}, "seeds=[0, 1]"),  # fewer than the rule's 3
    ("text", {"lengths": [100]}, "lengths=[100]"),
    ("text", {"profile": "study"}, "profile='study'"),
    ("early_dynamics", {"init_profiles": ["paper"]}, "init_profiles=['paper']"),
    ("intro", {"headline_profile": "bogus"}, "headline_profile='bogus'"),
]


def _cells(chapter: str) -> tuple[str, str]:
    """Sources of the chapter's parameters cell and of the check cell after it."""
    notebook = nbformat.read(BOOK / f"{chapter}.ipynb", as_version=4)
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    i = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    return cells[i].source, cells[i + 1].source


@pytest.mark.parametrize("chapter, params, named", BAD,
                         ids=[f"{c}-{'-'.join(p)}" for c, p, _ in BAD])
def test_the_check_cell_names_each_bad_parameter(monkeypatch, chapter, params, named):
    """The cell after ``parameters``, run in this process on the chapter's defaults plus the bad
    values (as papermill injects them), rejects them; the defaults pass."""
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    parameters, check = _cells(chapter)
    namespace: dict = {}
    exec(parameters, namespace)
    if chapter == "trained":
        namespace["device"] = "cpu"  # the defaults must pass on a GPU-less machine too
    exec(check, dict(namespace))
    namespace.update(params)
    with pytest.raises(ValueError) as err:
        exec(check, namespace)
    assert named in str(err.value)


PAPERMILL = [("averaging_effect", {"n_texts": 0}, "n_texts=0"),
             ("random_init", {"n_seeds": 0}, "n_seeds=0"),
             ("trained", {"tasks": '["nope"]'}, "tasks='[\"nope\"]'"),
             ("probes", {"n_fit_tokens": 3}, "n_fit_tokens=3")]


@pytest.mark.parametrize("chapter, params, named", PAPERMILL, ids=[c for c, _, _ in PAPERMILL])
def test_a_bad_parameter_fails_the_chapter_within_seconds(tmp_path, monkeypatch, chapter, params,
                                                          named):
    papermill = pytest.importorskip("papermill")
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cold-cache"))
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    start = time.perf_counter()
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(str(BOOK / f"{chapter}.ipynb"), str(tmp_path / "out.ipynb"),
                                   parameters=params, cwd=str(BOOK), progress_bar=False,
                                   kernel_name="python3")
    seconds = time.perf_counter() - start
    assert err.value.ename == "ValueError"
    assert named in err.value.evalue, err.value.evalue
    assert err.value.source.startswith("# Check every parameter")  # the cell after parameters
    assert seconds < 30, f"{chapter} took {seconds:.1f} s to reject {params}"


def _run_check(chapter: str, params: dict) -> None:
    """The chapter's check cell on its defaults updated with ``params``, as papermill injects
    them (trained: on the CPU, so that the defaults pass on a GPU-less machine too)."""
    parameters, check = _cells(chapter)
    namespace: dict = {}
    exec(parameters, namespace)
    if chapter == "trained":
        namespace["device"] = "cpu"
    namespace.update(params)
    exec(check, namespace)


@pytest.mark.parametrize("chapter", ["averaging_effect", "random_init", "trained", "probes",
                                     "long_sequences", "text"])
def test_every_chapter_passes_its_defaults(monkeypatch, chapter):
    """Nothing the check cell defines (imports, the spec) reads as an unknown parameter."""
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    _run_check(chapter, {})


def test_the_readme_papermill_example_passes(monkeypatch):
    """``-p n_seeds 20 -p inputs_per_task 128`` on random_init (the README's example)."""
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    _run_check("random_init", {"n_seeds": 20, "inputs_per_task": 128})


@pytest.mark.parametrize("values, named", [
    ({"n_seeds": 200, "inputs_per_task": 2048}, "n_seeds x inputs_per_task"),
    ({"n_seeds": 200, "init_means": [0.0] * 32, "init_stds": [0.02] * 32},
     "init_means x init_stds x n_seeds"),
])
def test_random_init_parameters_each_within_bounds_are_refused_together(monkeypatch, values,
                                                                       named):
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    with pytest.raises(ValueError) as err:
        _run_check("random_init", values)
    assert named in str(err.value)


TYPOS = [("averaging_effect", "n_text", "n_texts"), ("random_init", "n_seed", "n_seeds"),
         ("trained", "profil", "profile"), ("probes", "model_seed", "model_seeds"),
         ("scorecard", "profil", "profile"), ("long_sequences", "seed", "seeds")]


@pytest.mark.parametrize("chapter, typo, meant", TYPOS, ids=[t for _, t, _ in TYPOS])
def test_a_misspelt_parameter_names_the_one_meant(chapter, typo, meant):
    with pytest.raises(ValueError) as err:
        _run_check(chapter, {typo: 20})
    assert str(err.value).splitlines()[1:] == [
        f"  {typo}=20 is not a parameter of this chapter; did you mean {meant!r}?"]


BOUNDS = [  # (chapter, parameters, what the error must name, its estimate), one per new bound
    ("averaging_effect", {"n_texts": 2049}, "n_texts=2049", "~17 min at 2048"),
    ("averaging_effect", {"n_long": 1025}, "n_long=1025", "~9 min at 1024"),
    ("averaging_effect", {"n_models": 10**9}, "n_models=", "~10 min at 1024"),
    ("averaging_effect", {"sweep_seeds": 129}, "sweep_seeds=", "~17 min at 128"),
    ("averaging_effect", {"n_grid": 501}, "n_grid=", "~13 min at 500"),
    ("averaging_effect", {"mc_draws": 100_001}, "mc_draws=", "3.4 GB at 100,000 draws"),
    ("averaging_effect", {"mc_dim": 4097}, "mc_dim=4097", "4.3 GB at width 4096"),
    ("averaging_effect", {"mc_draws": 100_000, "mc_dim": 128}, "mc_dim=128", "4.4 GB"),
    ("averaging_effect", {"n_null": 100_001}, "n_null=", "~6 min at 100,000"),
    ("averaging_effect", {"archs": [[6, 384]] * 17}, "archs=", "~1.5 min at 16"),
    ("averaging_effect", {"archs": [[97, 192]]}, "archs=[[97, 192]]", "n_layer <= 96"),
    ("averaging_effect", {"archs": [[24, 3072]]}, "archs=[[24, 3072]]", "4.8 GB"),
    ("averaging_effect", {"thr_seeds": 257}, "thr_seeds=", "~20 min at 256"),
    ("averaging_effect", {"thr_texts": 513}, "thr_texts=", "~17 min at 512"),
    ("averaging_effect", {"thr_grid": 201}, "thr_grid=", "~10 min at 200"),
    ("averaging_effect", {"excess_seeds": 1025}, "excess_seeds=", "~10 min at 1024"),
    ("averaging_effect", {"excess_sigmas": [0.1 + i for i in range(65)]}, "excess_sigmas=",
     "~4 min at 64"),
    ("random_init", {"n_seeds": 10**9}, "n_seeds=1000000000", "~1.1 h at 200"),
    ("random_init", {"inputs_per_task": 10**8}, "inputs_per_task=", "~1.7 h at 2048"),
    ("random_init", {"init_means": [0.0] * 33}, "init_means=", "~8 min at 32"),
    ("random_init", {"init_stds": [0.02] * 20_000}, "init_stds=", "~8 min at 32"),
    ("random_init", {"grid_layers": [10**6]}, "grid_layers=[1000000]", "0.68 G parameters"),
    ("random_init", {"grid_layers": [6] * 9}, "grid_layers=", "up to ~15 s each"),
    ("random_init", {"grid_widths": [3078]}, "grid_widths=[3078]", "0.68 G parameters"),
    ("random_init", {"grid_widths": [192] * 9}, "grid_widths=", "up to ~15 s each"),
    ("random_init", {"grid_layers": [96], "grid_widths": [3072]}, "grid_widths=[3072]",
     "1.2 G parameters"),
    ("random_init", {"grid_seeds": 101}, "grid_seeds=", "~50 min at 100"),
    ("random_init", {"grid_inputs_per_task": 513}, "grid_inputs_per_task=", "3.5 GB"),
    ("random_init", {"lengths": [32, 8193]}, "lengths=[32, 8193]", "1.9 GB at T = 8192"),
    ("random_init", {"lengths": list(range(3, 36))}, "lengths=", "~10 s each at T = 8192"),
    ("random_init", {"length_seeds": 33}, "length_seeds=", "~4 min at 32"),
    ("random_init", {"length_seqs": 33}, "length_seqs=", "~2 min at 32"),
    ("random_init", {"control_vocab": 10**12}, "control_vocab=", "1.6 GB at 2^20"),
    ("random_init", {"control_vocab": 2**20, "lengths": [32, 4096]}, "control_vocab=", "8 GB"),
    ("trained", {"live_seeds": list(range(21))}, "live_seeds=", "~35 min on one core"),
    ("probes", {"model_seeds": list(range(101))}, "model_seeds=", "~40 min at 100"),
    ("probes", {"w": 1024, "T": 1024}, "w=1024", "below T, which is at most 1024"),
    ("probes", {"T": 10**7}, "T=10000000", "6.4 GB at T = 1024"),
    ("probes", {"n_fit_tokens": 100_001}, "n_fit_tokens=", "~6 GB"),
    ("probes", {"grid_windows": [1024], "grid_lengths": [1025]}, "grid_windows=[1024]",
     "at most 1024"),
    ("probes", {"grid_windows": list(range(1, 18))}, "grid_windows=", "~0.5 s each"),
    ("probes", {"grid_lengths": [1025]}, "grid_lengths=[1025]", "6.4 GB"),
    ("probes", {"grid_lengths": list(range(32, 49))}, "grid_lengths=", "~3 s at T = 128"),
    ("probes", {"grid_seeds": list(range(101))}, "grid_seeds=", "~15 min at 100"),
    ("probes", {"grid_fit_tokens": 10**9}, "grid_fit_tokens=", "~6 GB at 100,000"),
    # each within its own bound, together over an hour: the joint cost
    ("long_sequences", {"T": 8192, "seeds": list(range(20)), "widths": [192, 384, 768, 1536]},
     "seeds=", "seeds x models (each (T / 8192)^2 x max(1, width / 768)^2; windows at width 384) "
     "= 20 x 8 = 160 unit(s) of ~2 min, a model of width <= 768 at 8,192 tokens on the 2-core "
     "development machine: about 5.3 h; allowed: at most 1 h (30 units)"),
    ("long_sequences", {"T": 64, "windows": [128]}, "windows=[128]", "each window at most T"),
]


@pytest.mark.parametrize("chapter, params, named, estimate", BOUNDS,
                         ids=[f"{c}-{'-'.join(p)}" for c, p, _, _ in BOUNDS])
def test_a_size_beyond_its_bound_is_refused_with_the_estimate(monkeypatch, chapter, params,
                                                              named, estimate):
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    with pytest.raises(ValueError) as err:
        _run_check(chapter, params)
    line = next((ln for ln in str(err.value).splitlines() if ln.strip().startswith(named)), "")
    assert estimate in line, str(err.value)


SEEDS = [("trained", "live_seeds", [0, 2**64]), ("probes", "model_seeds", [0, 1, 2, 3, 2**32]),
         ("probes", "grid_seeds", [-1])]


@pytest.mark.parametrize("chapter, name, seeds", SEEDS, ids=[n for _, n, _ in SEEDS])
def test_every_seed_parameter_takes_32_bit_seeds(monkeypatch, chapter, name, seeds):
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    with pytest.raises(ValueError, match=rf"{name}=.*<= {SEED_MAX} \(a 32-bit seed"):
        _run_check(chapter, {name: seeds})
    _run_check(chapter, {name: [SEED_MAX - i for i in range(len(seeds))]})


TYPO_PAPERMILL = [("averaging_effect", "n_text"), ("random_init", "n_seed"),
                  ("trained", "profil"), ("probes", "model_seed")]


@pytest.mark.parametrize("chapter, typo", TYPO_PAPERMILL, ids=[c for c, _ in TYPO_PAPERMILL])
def test_a_misspelt_parameter_fails_the_chapter_in_its_kernel(tmp_path, monkeypatch, chapter,
                                                               typo):
    """In a real kernel (IPython's In, Out, exit... in the globals) only the typo is named."""
    papermill = pytest.importorskip("papermill")
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cold-cache"))
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(str(BOOK / f"{chapter}.ipynb"), str(tmp_path / "out.ipynb"),
                                   parameters={typo: 20, "device": "cpu"} if chapter == "trained"
                                   else {typo: 20}, cwd=str(BOOK), progress_bar=False,
                                   kernel_name="python3")
    assert err.value.source.startswith("# Check every parameter")
    assert err.value.evalue.splitlines()[1:] == [
        f"  {typo}=20 is not a parameter of this chapter; did you mean"
        f" {next(m for c, t, m in TYPOS if c == chapter)!r}?"]
