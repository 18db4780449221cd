"""Issue 22 acceptance: the commit-protocol kill test of `embed` (test_run_commit_kill) for `search -o`,
`rerank -o` and `run-batch`: SIGKILL before each commit step that can leave a distinct state leaves the older
complete output, or work the same command completes to the bytes of an uninterrupted run; `inspect --check`
passes only on a complete output."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.run.test_run_commit_kill import Server, _corpus, _leftovers, _output_files, _sample, _staged


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("whole-server") / "child.log")
    yield s
    s.close()


def _requests(path: Path, prefix: str, n: int) -> Path:
    lines = [json.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/embeddings",
                         "body": {"input": f"{prefix} text number {i}"}}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


KINDS = ["search-parquet", "search-jsonl", "rerank-parquet", "rerank-jsonl", "run-batch"]


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_at_each_commit_step_of_a_whole_output(kind: str, server: Server, st_model: Path, tmp_path: Path) -> None:
    command, _, ext = kind.rpartition("-") if kind != "run-batch" else (kind, "", "jsonl")
    name = f"out.{ext}"
    work = tmp_path / "work"
    work.mkdir()
    out = work / name
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    if command == "search":
        vectors = inputs / "vectors.parquet"
        code, log = server.run("embed", _corpus(inputs / "docs.jsonl", "d", 12), "-m", st_model, "-o", vectors, "-q")
        assert code == 0, log
        old_in, new_in = _corpus(inputs / "old.jsonl", "old", 3), _corpus(inputs / "new.jsonl", "new", 4)

        def argv(src: Path) -> tuple[object, ...]:
            return ("search", vectors, "--queries", src, "-m", st_model, "--top-k", 5, "-o", out, "-q")
    elif command == "rerank":
        old_in, new_in = _corpus(inputs / "old.jsonl", "old", 6), _corpus(inputs / "new.jsonl", "new", 7)

        def argv(src: Path) -> tuple[object, ...]:
            return ("rerank", src, "--query", "the market", "-m", st_model, "-o", out, "-q")
    else:
        old_in, new_in = _requests(inputs / "old.jsonl", "old", 9), _requests(inputs / "new.jsonl", "new", 9)

        def argv(src: Path) -> tuple[object, ...]:
            return ("run-batch", src, "-m", st_model, "-o", out, "--shard-rows", 4, "-q")

    def check() -> tuple[int, str]:
        return server.run("inspect", out, "--check")

    code, log = server.run(*argv(old_in))
    assert code == 0, log
    pristine = tmp_path / "pristine"
    shutil.copytree(work, pristine, symlinks=True)
    old = _output_files(work)
    assert check()[0] == 0
    # the same command over other inputs is the same config: it replaces the output (no --overwrite needed)
    code, log = server.run(*argv(new_in), count=tmp_path / "steps", within=work)
    assert code == 0, log
    steps = [tuple(step) for step in json.loads((tmp_path / "steps").read_text())]
    new = _output_files(work)
    assert new != old and check()[0] == 0 and _leftovers(work) == []

    outcomes = {}
    for kill_at in _sample(steps, every=False):
        shutil.rmtree(work)
        shutil.copytree(pristine, work, symlinks=True)
        code, log = server.run(*argv(new_in), kill_at=kill_at, within=work)
        assert code == -signal.SIGKILL, (kill_at, code, log)
        after = _output_files(work)
        state = "old" if after == old else "new" if after == new else "other"
        code, report = check()
        outcomes[kill_at] = (state, code)
        where = f"{kind}: a kill before step {kill_at} of {len(steps)}"
        if state == "other":
            assert code != 0, f"{where} left an output that is neither old nor new, and inspect --check passes: {report}"
        elif state == "old" and _staged(work, name):
            assert code != 0 and "unfinished run" in report, f"{where}: {report}"
        else:
            assert code == 0, f"{where} left the {state} output failing inspect --check: {report}"
        code, log = server.run(*argv(new_in))
        assert code == 0, (kill_at, log)
        assert _output_files(work) == new, f"{where}: the rerun differs from an uninterrupted run"
        assert _leftovers(work) == [], (kill_at, _leftovers(work))
    print(f"\n{kind}: {len(steps)} commit steps; kill before step -> (output state, inspect --check): {outcomes}")
    assert outcomes[1][0] == "old" and any(state == "new" for state, _ in outcomes.values()), outcomes
