"""A short run loads only what it uses (issue 27's start-up): each command runs as the console script does, in a
fresh interpreter that reports at exit which heavy modules it imported.

pandas costs 0.25-0.5 s and is installed beside embedcli by the ray and test extras; pyarrow imports it on its
first conversion of Python values (`embedcli.io.arrow_values` says where). torch and transformers load only for a
model that computes; the Hub client only for a model that is not local.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixtures.static_models import build_m2v

# numpy.ma (np.unique imports it) and tqdm (a terminal's bar) cost 10-30 ms each and a run without a bar uses neither;
# pydantic (~0.1-0.2 s with its plugin loader) only coerces flag values that need it (`embedcli.cli.coercion`).
HEAVY = ("torch", "transformers", "pandas", "pyarrow.dataset", "pyarrow.compute", "huggingface_hub.hf_api", "sympy",
         "numpy.ma", "tqdm", "pydantic")
_PROBE = f"""
import atexit, json, runpy, sys
sys.argv = ["embedcli", *sys.argv[1:]]
atexit.register(lambda: print("imported:", json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]), file=sys.stderr))
runpy.run_module("embedcli", run_name="__main__")
"""


def imported(tmp: Path, *args: object) -> set[str]:
    """The heavy modules `embedcli ARGS` imported (it must succeed)."""
    env = {**os.environ, "EMBEDCLI_CACHE_DIR": str(tmp / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _PROBE, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("imported:"), done.stderr
    return set(json.loads(last.removeprefix("imported:")))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A static model and the same rows as JSONL, CSV and Parquet (with a kept integer column)."""
    root = tmp_path_factory.mktemp("lean")
    rows = [{"id": f"r{i}", "text": f"the cat sat on mat {i}", "n": i} for i in range(7)]
    paths = {"static": build_m2v(root / "m2v"), "jsonl": root / "in.jsonl", "csv": root / "in.csv",
             "parquet": root / "in.parquet"}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["csv"].write_text("id,text\n" + "".join(f"{r['id']},{r['text']}\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), paths["parquet"])
    return paths


def test_help_imports_nothing_heavy(tmp_path: Path) -> None:
    assert imported(tmp_path, "--help") == set()
    assert imported(tmp_path, "embed", "--help") == set()


# pyarrow.compute (~50 ms) is fair where the run casts (Parquet ids to strings) or flattens vectors (JSONL, .npy).
@pytest.mark.parametrize(("source", "out", "extra", "allowed"), [
    ("jsonl", "out.parquet", [], set()),
    ("csv", "out.jsonl", [], {"pyarrow.compute"}),
    ("parquet", "out.parquet", ["--keep-cols", "n", "--incremental"], {"pyarrow.compute"}),
    ("jsonl", "out.npy", [], {"pyarrow.compute"}),
    ("parquet", "out.parquet", ["--shard", "0/2"], {"pyarrow.compute"}),
])
def test_a_static_run_and_its_noop_rerun_import_nothing_heavy(
    inputs: dict[str, Path], tmp_path: Path, source: str, out: str, extra: list[str], allowed: set[str]
) -> None:
    args = ["embed", inputs[source], "-m", inputs["static"], "-o", tmp_path / out, "-q", *extra]
    assert imported(tmp_path, *args) <= allowed
    assert imported(tmp_path, *args) <= allowed  # the rerun finds the output complete


def test_a_model_run_imports_torch_only_to_compute(inputs: dict[str, Path], st_model: Path, tmp_path: Path) -> None:
    args = ["embed", inputs["jsonl"], "-m", st_model, "-o", tmp_path / "out.parquet", "-q", "--dtype", "float32"]
    assert imported(tmp_path, *args) - {"tqdm"} == {"torch"}  # its own backbone: no transformers, no pandas (torch imports tqdm)
    assert imported(tmp_path, *args) == set()  # the no-op rerun


_GC_PROBE = """
import atexit, gc, runpy, sys
sys.argv = ["embedcli", *sys.argv[1:]]
atexit.register(lambda: print("gc:", gc.isenabled(), gc.get_freeze_count() > 0, file=sys.stderr))
runpy.run_module("embedcli", run_name="__main__")
"""


def test_the_collector_is_off_until_the_work_starts(inputs: dict[str, Path], tmp_path: Path) -> None:
    """A run with work computes with the collector on, the start's objects frozen; a no-op rerun never turns it on."""
    args = ["embed", inputs["jsonl"], "-m", inputs["static"], "-o", tmp_path / "out.parquet", "-q"]
    env = {**os.environ, "EMBEDCLI_CACHE_DIR": str(tmp_path / "cache")}
    states = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _GC_PROBE, *map(str, args)], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        states.append(done.stderr.strip().splitlines()[-1])
    assert states == ["gc: True True", "gc: False False"]
