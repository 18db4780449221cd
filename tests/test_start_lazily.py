"""Start only what is needed: commands that need no model, and reruns that find nothing to do, never import torch.

The outputs are made in-process (torch is loaded there anyway); each checked command runs in a fresh
interpreter that reports whether torch was imported. The provenance a run plans before loading must be the
one the loaded runner has, for every option that enters it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

# Runs `embedcli ARGS` as the console script does, then says on the last stderr line whether torch was imported.
# An exit handler, since the console script leaves without interpreter teardown once torch is loaded.
_PROBE = """
import atexit, runpy, sys
sys.argv = ["embedcli", *sys.argv[1:]]
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
runpy.run_module("embedcli", run_name="__main__")
"""


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "EMBEDCLI_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}


def fresh(cache: Path, *args: object) -> subprocess.CompletedProcess[str]:
    """`embedcli ARGS` in a new interpreter."""
    return subprocess.run(
        [sys.executable, "-c", _PROBE, *map(str, args)], capture_output=True, text=True, env=_env(cache), timeout=300
    )


def imported_torch(result: subprocess.CompletedProcess[str]) -> bool:
    """What the probe's last stderr line says."""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("torch imported:"), result.stderr
    return last.endswith("True")


@pytest.fixture(scope="module")
def made(st_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A corpus, the cache dir, and complete outputs of it: one per dtype choice, and a --shard 0/2, 1/2 set."""
    from embedcli.cli import app

    root = tmp_path_factory.mktemp("lazy")
    corpus = root / "in.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"row number {i}"}) + "\n" for i in range(6)))
    cache = root / "cache"
    paths = {"corpus": corpus, "cache": cache, "model": st_model}
    runner = CliRunner()
    env = {"EMBEDCLI_CACHE_DIR": str(cache)}
    jobs = {
        "auto": ["--dtype", "auto"],  # probed once here; the rerun reads the cached decision (or no bf16 CPU)
        "float32": ["--dtype", "float32"],
        "shard0": ["--dtype", "float32", "--shard", "0/2"],
        "shard1": ["--dtype", "float32", "--shard", "1/2"],
    }
    for name, extra in jobs.items():
        out = root / f"{name}.parquet"
        result = runner.invoke(app, ["embed", str(corpus), "-m", str(st_model), "-o", str(out), "-q", *extra], env=env)
        assert result.exit_code == 0, result.output
        paths[name] = out
    return paths


@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_noop_rerun_of_complete_output_does_not_import_torch(made: dict[str, Path], dtype: str) -> None:
    out = made[dtype]
    before = out.read_bytes()
    result = fresh(made["cache"], "embed", made["corpus"], "-m", made["model"], "-o", out, "--dtype", dtype)
    assert result.returncode == 0, result.stderr
    assert "is already complete" in result.stderr and "nothing to do" in result.stderr
    assert not imported_torch(result)
    assert out.read_bytes() == before


@pytest.mark.parametrize("change", [["--dtype", "bfloat16"], ["--no-normalize"], ["--prompt", "query: "]])
def test_config_mismatch_is_refused_without_importing_torch(made: dict[str, Path], change: list[str]) -> None:
    out = made["float32"]
    before = out.read_bytes()
    args = ["embed", made["corpus"], "-m", made["model"], "-o", out, "--dtype", "float32", *change]
    result = fresh(made["cache"], *args)
    assert result.returncode == 2, result.stderr
    assert "different config" in result.stderr
    assert not imported_torch(result)
    assert out.read_bytes() == before


def test_staged_work_of_another_config_is_refused_without_importing_torch(made: dict[str, Path], tmp_path: Path) -> None:
    from embedcli.cli import app

    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(made["corpus"].read_text() + "not json\n")  # the run stops here, its shards committed
    out = tmp_path / "out.parquet"
    args = ["embed", str(corpus), "-m", str(made["model"]), "-o", str(out), "--dtype", "float32", "--shard-rows", "2"]
    assert CliRunner().invoke(app, [*args, "-q"]).exit_code != 0
    manifest = Path(f"{out}.embedcli-staging") / "_embedcli" / "manifest.json"
    staged = manifest.read_bytes()
    result = fresh(made["cache"], *args, "--no-normalize")
    assert result.returncode == 2, result.stderr
    assert "holds the work of an interrupted run with a different config" in result.stderr
    assert not imported_torch(result)
    assert manifest.read_bytes() == staged


def test_commands_without_a_model_do_not_import_torch(made: dict[str, Path], tmp_path: Path) -> None:
    commands = [
        ["--help"],
        ["embed", "--help"],
        ["info", made["model"]],
        ["inspect", made["float32"]],
        ["merge", made["shard0"], made["shard1"], "-o", tmp_path / "merged.parquet"],
    ]
    for args in commands:
        result = fresh(made["cache"], *args)
        assert result.returncode == 0, (args, result.stderr)
        assert not imported_torch(result), args
    assert pq.read_table(tmp_path / "merged.parquet").num_rows == 6


def test_a_run_with_work_still_loads_the_model(made: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "new.parquet"
    result = fresh(made["cache"], "embed", made["corpus"], "-m", made["model"], "-o", out, "--dtype", "float32", "-q")
    assert result.returncode == 0, result.stderr
    assert imported_torch(result)
    assert pq.read_table(out).num_rows == 6


@pytest.mark.parametrize(("caller", "scanned"), [(None, False), ("1", True)])
def test_torch_backend_plugins_are_scanned_only_when_the_caller_asks(
    made: dict[str, Path], tmp_path: Path, caller: str | None, scanned: bool
) -> None:
    # An installed out-of-tree backend plugin (a `torch.backends` entry point) that leaves a mark when loaded.
    site = tmp_path / "site"
    (site / "mark_backend-1.0.dist-info").mkdir(parents=True)
    (site / "mark_backend-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mark-backend\nVersion: 1.0\n")
    (site / "mark_backend-1.0.dist-info" / "entry_points.txt").write_text("[torch.backends]\nmark = mark_backend:load\n")
    mark = tmp_path / "loaded"
    (site / "mark_backend.py").write_text(f"def load():\n    open({str(mark)!r}, 'w').close()\n")
    env = {**_env(made["cache"]), "PYTHONPATH": str(site)}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    if caller is not None:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = caller
    out = tmp_path / "new.parquet"
    args = ["embed", made["corpus"], "-m", made["model"], "-o", out, "--dtype", "float32", "--device", "cpu", "-q"]
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert imported_torch(result) and pq.read_table(out).num_rows == 6
    assert mark.exists() == scanned


@pytest.mark.parametrize(("device", "skipped"), [("auto", True), ("cpu", True), ("cuda:1", True), ("npu:0", False)])
def test_backend_autoload_is_skipped_for_torchs_own_devices(
    monkeypatch: pytest.MonkeyPatch, device: str, skipped: bool
) -> None:
    from embedcli.compute.build import skip_backend_autoload

    # A copy of the environment, so that what the call sets does not outlive the test in this worker.
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"})
    skip_backend_autoload(device)
    assert os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == ("0" if skipped else None)


@pytest.mark.parametrize(
    ("model", "dtype", "options"),
    [
        ("bert-st", "float32", {}),
        ("bert-st", "bfloat16", {}),
        ("bert-st", "auto", {}),  # the decision `made` cached (or float32 on a CPU without native bf16)
        ("bert-st", "auto", {"quantize": True}),
        ("bert-st", "float32", {"normalize": False, "dimensions": 16, "prompt": "query: "}),
        ("bert-st", "float32", {"normalize": True, "long_inputs": "chunk", "truncation_side": "left", "strip": True}),
        ("bert-st-cls", "float32", {}),  # no Normalize module: the model's own normalize is False
        ("bert-st-dense", "float16", {"max_length": 8}),
        ("qwen2-st6", "float32", {}),
    ],
)
def test_planned_provenance_is_the_loaded_runners(
    made: dict[str, Path],
    tiny_model: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    dtype: str,
    options: dict[str, object],
) -> None:
    from embedcli.compute.build import build_runner, embed_recipe
    from embedcli.compute.plan import plan_runner
    from embedcli.tasks.common import ModelChoice, load_spec, planned_provenance, provenance

    monkeypatch.setenv("EMBEDCLI_CACHE_DIR", str(made["cache"]))  # where `made` cached bert-st's auto decision
    options = dict(options)
    quantize = bool(options.pop("quantize", False))
    max_length = options.pop("max_length", None)
    choice = ModelChoice(str(tiny_model(model)), device="cpu", dtype=dtype, quantize=quantize, max_length=max_length)
    spec = load_spec(choice)
    recipe = embed_recipe(spec, choice.options(), **options)  # type: ignore[arg-type]
    plan = plan_runner(recipe)
    assert plan is not None
    extra = {"precision": "float32"}
    runner = build_runner(recipe)
    assert planned_provenance(spec, plan, recipe.runner_options, extra) == provenance(runner.model, runner, extra)


def test_a_model_that_loads_otherwise_than_planned_stops_the_run(
    made: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import dataclasses

    import embedcli.tasks.common as common
    from embedcli.cli import app

    real = common.plan_runner
    monkeypatch.setattr(common, "plan_runner", lambda recipe: dataclasses.replace(real(recipe), dtype_reason="wrong"))
    out = tmp_path / "out.parquet"
    args = ["embed", str(made["corpus"]), "-m", str(made["model"]), "-o", str(out), "--dtype", "float32", "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "differs from its plan in ['embedcli.dtype_reason']" in str(result.exception)
    assert not out.exists()


def test_known_activations_are_torch_module_classes() -> None:
    # A spec names one of these without importing torch: each must be what importing it would check.
    import importlib

    import torch

    from embedcli.models.checkpoint.st_config import _KNOWN_ACTIVATIONS

    for name in _KNOWN_ACTIVATIONS:
        module, _, cls = name.rpartition(".")
        assert issubclass(getattr(importlib.import_module(module), cls), torch.nn.Module), name


# -- the other compute commands: score, token-embed, token-classify, sparse-embed (and embed with a Dense) ---------------------------
# Each case: the command, the model (a checkpoint saved the way users get it), its flags, and the flags of a
# changed config. `rerank` and `search` are not here: they write their output once, from a whole scan, and
# have no complete-output rerun to skip (see embedcli.tasks.search's docstring).
CASES: dict[str, tuple[str, str, list[str], list[str]]] = {
    "score-cross-encoder": ("score", "cross-encoder", [], ["--raw-scores"]),
    "score-cosine": ("score", "bi-encoder", [], ["--method", "maxsim"]),
    "score-maxsim": ("score", "bi-encoder", ["--method", "maxsim", "--raw-scores"], ["--method", "maxsim"]),
    "score-llm-reranker": ("score", "llm-reranker", [], ["--max-length", "32"]),
    "score-sparse": ("score", "splade", [], ["--raw-scores"]),
    "token-embed": ("token-embed", "bi-encoder", [], ["--no-normalize"]),
    "token-embed-dims": ("token-embed", "bi-encoder", ["--dimensions", "16", "--no-normalize"], ["--dimensions", "8"]),
    "token-classify": ("token-classify", "token-classifier", [], ["--activation", "sigmoid"]),
    "token-classify-all": ("token-classify", "token-classifier", ["--all-scores", "--keep-special"], ["--all-scores"]),
    "sparse-embed": ("sparse-embed", "splade", [], ["--sparse-top-k", "3"]),
    "sparse-embed-tokens": ("sparse-embed", "splade", ["--with-tokens"], []),
    "embed-dense": ("embed", "dense", [], ["--no-normalize"]),  # a Dense module's activation_function (Tanh)
}


@pytest.fixture(scope="module")
def families(
    tiny_model: Callable[[str], Path], st_model: Path, made: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The models of `CASES`, a corpus of pairs and texts, and each case's complete output (made in-process)."""
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    from embedcli.cli import app
    from tests.fixtures.tiny_families import build_llm_reranker, build_splade
    from tests.fixtures.tiny_models import copy_model

    root = tmp_path_factory.mktemp("lazy_families")
    torch.manual_seed(7)
    CrossEncoder(str(tiny_model("bert")), num_labels=1, device="cpu").save_pretrained(str(root / "cross-encoder"))
    token_classifier = copy_model(tiny_model("bert"), root / "token-classifier")
    transformers.BertForTokenClassification.from_pretrained(
        str(tiny_model("bert")), num_labels=3, id2label={0: "O", 1: "B-X", 2: "I-X"}, label2id={"O": 0, "B-X": 1, "I-X": 2}
    ).save_pretrained(str(token_classifier))
    paths = {
        "cross-encoder": root / "cross-encoder",
        "bi-encoder": st_model,
        "llm-reranker": build_llm_reranker("qwen3", root / "llm")[1],
        "splade": build_splade(root / "splade"),
        "token-classifier": token_classifier,
        "dense": tiny_model("bert-st-dense"),
        "cache": made["cache"],
    }
    corpus = root / "pairs.jsonl"
    rows = [{"id": str(i), "text": f"row number {i}", "left": f"query {i}", "right": f"the answer is {i}"} for i in range(5)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["corpus"] = corpus
    runner = CliRunner()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the fresh interpreters run (OMP_NUM_THREADS=1): the same sums, the same bits
    try:
        for case in CASES:
            out = root / f"{case}.parquet"
            result = runner.invoke(app, [*case_args(paths, case, out), "-q"], env={"EMBEDCLI_CACHE_DIR": str(made["cache"])})
            assert result.exit_code == 0, (case, result.output, result.exception)
            paths[case] = out
    finally:
        torch.set_num_threads(threads)
    return paths


def case_args(paths: dict[str, Path], case: str, out: Path, changed: bool = False) -> list[str]:
    """The command line of `case` writing `out` (with the flags of the changed config when `changed`)."""
    command, model, flags, other = CASES[case]
    return [command, str(paths["corpus"]), "-m", str(paths[model]), "-o", str(out), "--dtype", "float32",
            *(other if changed else flags)]


@pytest.mark.parametrize("case", list(CASES))
def test_other_commands_noop_rerun_does_not_import_torch(families: dict[str, Path], case: str) -> None:
    out = families[case]
    before = out.read_bytes()
    result = fresh(families["cache"], *case_args(families, case, out))
    assert result.returncode == 0, result.stderr
    assert "is already complete" in result.stderr and "nothing to do" in result.stderr
    assert not imported_torch(result)
    assert out.read_bytes() == before


@pytest.mark.parametrize("case", list(CASES))
def test_other_commands_config_mismatch_is_refused_without_importing_torch(families: dict[str, Path], case: str) -> None:
    out = families[case]
    before = out.read_bytes()
    result = fresh(families["cache"], *case_args(families, case, out, changed=True))
    assert result.returncode == 2, result.stderr
    assert "different config" in result.stderr
    assert not imported_torch(result)
    assert out.read_bytes() == before


@pytest.mark.parametrize("case", list(CASES))
def test_other_commands_with_work_load_the_model_and_write_the_same_bytes(
    families: dict[str, Path], case: str, tmp_path: Path
) -> None:
    # The loaded runner's provenance is checked against the planned one (an internal error otherwise), and the
    # rows must be those of the in-process run that made the complete output.
    out = tmp_path / f"{case}.parquet"
    result = fresh(families["cache"], *case_args(families, case, out), "-q")
    assert result.returncode == 0, result.stderr
    assert imported_torch(result)
    assert out.read_bytes() == families[case].read_bytes()


@pytest.mark.parametrize("missing", ["missing.jsonl", "nothing-*.jsonl"])
def test_a_missing_input_is_said_before_a_first_auto_run_loads_the_model(
    made: dict[str, Path], tmp_path: Path, missing: str
) -> None:
    """A fresh cache: `auto` is not probed yet, so a run with work would load the model to plan; a missing
    input must not wait for that."""
    result = fresh(tmp_path / "fresh-cache", "embed", tmp_path / missing, "-m", made["model"], "-o", tmp_path / "o.parquet")
    assert result.returncode == 1, result.stderr
    assert "no such file" in result.stderr
    assert not imported_torch(result)
