"""The paper-model benchmark (nopelib.tools.bench_paper) on a tiny stand-in model: every mode it
can time on this CPU is timed against float32, and the threads comparison runs."""

from dataclasses import replace

from nopelib.core.devices import bf16_available
from nopelib.core.model import GPTConfig
from nopelib.tools import bench_paper
from nopelib.training.profiles import PROFILES


def test_the_paper_benchmark_times_every_mode_against_float32(monkeypatch, tmp_path):
    tiny = replace(PROFILES["paper_study"], model=GPTConfig(n_layer=1, n_head=1, n_embd=8))
    monkeypatch.setitem(bench_paper.PROFILES, bench_paper.PROFILE, tiny)
    monkeypatch.setattr(bench_paper, "MODES", bench_paper.MODES[:2])  # no compile: seconds
    out = tmp_path / "b.json"
    result = bench_paper.main(["--tasks", "addition", "--repeats", "2", "--thread-steps", "2",
                               "--json", str(out)])
    modes = [r["mode"] for r in result["modes"]]
    assert modes == (["float32 (ref)", "bf16 autocast"] if bf16_available()
                     else ["float32 (ref)"])
    assert result["modes"][0]["speedup"] == 1.0
    assert all(r["status"] == "ok" and r["min_ms"] <= r["step_ms"] <= r["max_ms"]
               for r in result["modes"])
    threads = result["threads"]
    assert [r["setting"] for r in threads] == ["1 run x 2 threads (ref)", "2 runs x 1 thread"]
    assert threads[1]["steps"] == 2 * threads[0]["steps"] and threads[0]["speedup"] == 1.0
    assert out.is_file()
