"""`--engine ray` (the Ray Data engine) on the session's real two-node cluster: the local engine's output,
bad rows, exit codes, errors file, provenance, repair, `--incremental` and `-o -`, with the driver only
planning and committing slices."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed_helpers import vectors, write_corpus

ray = pytest.importorskip("ray")

ROWS = 300
SMALL = ("--max-batch-tokens", 16)
"""A small token budget: the run's cuts (where slices may start) every 2 KiB of input, so small inputs have several."""


@pytest.fixture(scope="module", autouse=True)
def driver(ray_driver):  # type: ignore[no-untyped-def]
    """The in-process CLI runs of this module drive the session's cluster."""
    return ray_driver


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("ray_corpus") / "corpus.jsonl", ROWS, seed=7)


def ray_flags(driver) -> tuple[object, ...]:  # type: ignore[no-untyped-def]
    return ("--engine", "ray", "--workers", 2, "--ray-address", driver.address)


def test_ray_output_equals_local_output(cli, st_model: Path, tmp_path: Path, driver) -> None:  # type: ignore[no-untyped-def]
    """JSON Lines (a BOM, blank lines, a kept column) and Parquet (row groups) cut into slices: the same rows,
    in the same order, vectors within 1e-6, the same metadata, one shard per slice."""
    rng = np.random.default_rng(1)
    with (tmp_path / "a.jsonl").open("w", encoding="utf-8") as f:
        f.write("\ufeff")
        for i in range(130):
            if i % 50 == 7:
                f.write("\n")
            f.write(json.dumps({"id": f"a{i}", "text": f"row {i} " + "market " * int(rng.integers(1, 20)),
                                "k": i}) + "\n")
    pq.write_table(pa.table({"id": [f"b{i}" for i in range(90)], "text": [f"parquet row {i}" for i in range(90)],
                             "k": list(range(90))}), tmp_path / "b.parquet", row_group_size=30)
    inputs = (tmp_path / "a.jsonl", tmp_path / "b.parquet")
    local, remote = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    common = ("-m", st_model, "--keep-cols", "k", "--shard-rows", 40, "-q", *SMALL)
    cli("embed", *inputs, "-o", local, *common, "--stats", tmp_path / "l.json")
    cli("embed", *inputs, "-o", remote, *common, "--stats", tmp_path / "s.json", *ray_flags(driver))
    l_ids, l_emb, l_meta = vectors(local)
    r_ids, r_emb, r_meta = vectors(remote)
    assert r_ids == l_ids == [f"a{i}" for i in range(130)] + [f"b{i}" for i in range(90)]
    assert np.array_equal(r_emb, l_emb)  # slices start where the local run ends a batch: its forwards, bit for bit
    assert pq.read_table(remote).column("k").to_pylist() == pq.read_table(local).column("k").to_pylist()
    assert r_meta == l_meta  # provenance, config hash, inputs, row counts: all the same
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["computed_rows"] == 220 and stats["tokens"] > 0 and stats["exit_code"] == 0
    assert stats["shards"] >= 3  # slices of about 40 records, starting only at the run's cuts
    assert stats["forwards"] == json.loads((tmp_path / "l.json").read_text())["forwards"]
    cli("inspect", remote, "--check")


def test_small_files_share_forwards_as_in_a_local_run(cli, st_model: Path, tmp_path: Path, driver) -> None:  # type: ignore[no-untyped-def]
    """A slice of many small files pools their rows into the local run's forwards (not one forward a file):
    the same forwards, and the same vectors bit for bit."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(120):
        lines = 1 + i % 3
        (folder / f"f{i:03d}.jsonl").write_text(
            "".join(json.dumps({"id": f"{i}-{j}", "text": f"file {i} line {j} " + "chart " * (i % 7)}) + "\n"
                    for j in range(lines)), encoding="utf-8")
    inputs = sorted(folder.glob("*.jsonl"))
    local, remote = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    common = ("-m", st_model, "-q", "--shard-rows", 5000)
    cli("embed", *inputs, "-o", local, *common, "--stats", tmp_path / "l.json")
    cli("embed", *inputs, "-o", remote, *common, "--stats", tmp_path / "r.json", *ray_flags(driver))
    l_stats, r_stats = (json.loads((tmp_path / n).read_text()) for n in ("l.json", "r.json"))
    assert r_stats["shards"] == 1 and r_stats["computed_rows"] == l_stats["computed_rows"] == 240
    assert r_stats["forwards"] == l_stats["forwards"] < 10
    l_ids, l_emb, _ = vectors(local)
    r_ids, r_emb, _ = vectors(remote)
    assert r_ids == l_ids and np.array_equal(r_emb, l_emb)


def test_a_parquet_file_of_one_row_group_is_cut_into_slices(cli, st_model: Path, tmp_path: Path, driver) -> None:  # type: ignore[no-untyped-def]
    """pyarrow writes up to a million rows as one row group: its slices start inside it, at the run's cuts."""
    texts = [f"parquet row {i} " + "word " * (i % 9) for i in range(600)]
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(600)], "text": texts}), tmp_path / "one.parquet")
    assert pq.ParquetFile(tmp_path / "one.parquet").metadata.num_row_groups == 1
    local, remote = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    common = ("-m", st_model, "--shard-rows", 100, "-q", *SMALL)
    cli("embed", tmp_path / "one.parquet", "-o", local, *common, "--stats", tmp_path / "l.json")
    cli("embed", tmp_path / "one.parquet", "-o", remote, *common, "--stats", tmp_path / "r.json", *ray_flags(driver))
    l_stats, r_stats = (json.loads((tmp_path / n).read_text()) for n in ("l.json", "r.json"))
    assert r_stats["shards"] >= 3 and r_stats["forwards"] == l_stats["forwards"]
    for suffix in ("", ".embedcli-index.parquet"):
        assert Path(f"{remote}{suffix}").read_bytes() == Path(f"{local}{suffix}").read_bytes()


def test_deleted_shard_is_recomputed_alone(cli, st_model: Path, corpus: Path, tmp_path: Path, driver) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "dir"
    cli("embed", corpus, "-m", st_model, "-o", f"{out}/", "--shard-rows", 100, "-q", *SMALL, *ray_flags(driver))
    parts = sorted(p.name for p in out.iterdir() if p.is_file())
    assert len(parts) >= 3 and parts == [f"part-{k:06d}.parquet" for k in range(len(parts))]  # no worker leftovers
    before = {p: (out / p).stat().st_mtime_ns for p in parts}
    saved = pq.read_table(out / "part-000001.parquet")
    (out / "part-000001.parquet").unlink()
    cli("inspect", out, "--check", code=1)
    r = cli("embed", corpus, "-m", st_model, "-o", f"{out}/", "--shard-rows", 100, *SMALL, *ray_flags(driver))
    lo, hi = json.loads((out / "_embedcli" / "manifest.json").read_text())["shards"][1]["records"]
    assert f"repaired part-000001.parquet: recomputed input records {lo}-{hi} ({hi - lo} rows)" in r.stderr
    assert "repaired part-000000" not in r.stderr and "repaired part-000002" not in r.stderr
    assert pq.read_table(out / "part-000001.parquet").equals(saved)
    for p in (p for p in parts if p != "part-000001.parquet"):
        assert (out / p).stat().st_mtime_ns == before[p]  # untouched
    cli("inspect", out, "--check")
    assert not list(tmp_path.glob("*.embedcli-repair*")) and not list(tmp_path.glob("*staging*"))


def test_bad_rows_across_slices_as_the_local_engine(cli, st_model: Path, tmp_path: Path, driver) -> None:  # type: ignore[no-untyped-def]
    """Null texts, a malformed line and ids repeated from an earlier slice: under --on-error skip the same
    rows, errors file (in input order) and exit 3 as the local engine; --max-errors and --on-error fail stop
    with exit 1."""
    corpus = write_corpus(tmp_path / "bad.jsonl", 160, seed=8, bad_at=57)
    lines = corpus.read_text().splitlines()
    lines[90] = '{"id": "d3", "text": "a repeat of an id of the first slice"}'
    lines[130] = "{not json"
    lines[94] = '{"id": "n94", "text": null}'  # after the repeat, in its slice: the driver finds the repeat later
    lines[150] = '{"id": "d125", "text": "a repeat within its own slice"}'
    corpus.write_text("\n".join(lines) + "\n")
    outputs = {}
    for engine, extra in (("local", ()), ("ray", ray_flags(driver))):
        out, errors = tmp_path / f"{engine}.parquet", tmp_path / f"{engine}-errors.jsonl"
        r = cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 40, "--on-error", "skip",
                "--errors-file", errors, *SMALL, *extra, code=3)
        assert "5 bad input rows were skipped" in r.stderr
        records = [json.loads(line) for line in errors.read_text().splitlines()]
        outputs[engine] = (vectors(out), [(e["location"], e["id"], e["reason"]) for e in records])
    (l_ids, l_emb, l_meta), l_errors = outputs["local"]
    (r_ids, r_emb, r_meta), r_errors = outputs["ray"]
    assert r_errors == l_errors
    assert [e[0] for e in r_errors] == ["line 58", "line 91", "line 95", "line 131", "line 151"]
    assert ("line 91", "d3", f"duplicate id 'd3': first seen at {corpus} line 4") in r_errors
    assert r_ids == l_ids and len(r_ids) == 155 and np.array_equal(r_emb, l_emb)
    assert r_meta["embedcli.skipped_rows"] == l_meta["embedcli.skipped_rows"] == "5"
    r = cli("embed", corpus, "-m", st_model, "-o", tmp_path / "m.parquet", "--shard-rows", 40, "--on-error", "skip",
            "--max-errors", 2, *SMALL, *ray_flags(driver), code=1)
    assert "more than 2 bad rows (--max-errors 2)" in r.stderr and "line 95" in r.stderr  # the third bad row
    r = cli("embed", corpus, "-m", st_model, "-o", tmp_path / "f.parquet", "--shard-rows", 40,
            "--errors-file", tmp_path / "f-errors.jsonl", *SMALL, *ray_flags(driver), code=1)
    assert "line 58" in r.stderr and "text is null" in r.stderr  # the first bad row stops the run
    assert [json.loads(line)["location"] for line in (tmp_path / "f-errors.jsonl").read_text().splitlines()] == ["line 58"]
    assert not (tmp_path / "f.parquet").exists()


def test_incremental_and_stdout(cli, st_model: Path, corpus: Path, tmp_path: Path, driver) -> None:  # type: ignore[no-untyped-def]
    """--incremental carries unchanged rows over through the same manifest and index; -o - streams the rows."""
    out = tmp_path / "o.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 100, "-q", *SMALL, *ray_flags(driver))
    lines = corpus.read_text().splitlines()
    lines[5] = json.dumps({"id": "d5", "text": "a text changed since the first run"})
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join(lines) + "\n")
    cli("embed", changed, "-m", st_model, "-o", out, "--shard-rows", 100, "-q", "--incremental",
        "--stats", tmp_path / "s.json", *SMALL, *ray_flags(driver))
    stats = json.loads((tmp_path / "s.json").read_text())
    assert (stats["computed_rows"], stats["carried_rows"]) == (1, ROWS - 1)
    assert stats["shards"] >= 3
    local = tmp_path / "local.parquet"
    cli("embed", changed, "-m", st_model, "-o", local, "-q", *SMALL)
    assert vectors(out)[0] == vectors(local)[0]
    assert np.abs(vectors(out)[1] - vectors(local)[1]).max() <= 1e-6
    r = cli("embed", changed, "-m", st_model, "-o", "-", "--output-format", "jsonl", "--shard-rows", 100, "-q",
            *SMALL, *ray_flags(driver))
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["id"] for row in rows] == vectors(local)[0]
    assert np.abs(np.asarray([row["embedding"] for row in rows]) - vectors(local)[1]).max() <= 1e-6


def test_incremental_slices_carry_a_changed_blocks_unchanged_lines(cli, st_model: Path, tmp_path: Path, driver) -> None:  # type: ignore[no-untyped-def]
    """Under `--incremental` a slice parses only the changed lines of a changed block, as the local loop does
    (they read the same rows), and the output is the bytes of a full run, row index included."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", 3000, seed=5)
    flags = ("--shard-rows", 500, "-q", "--max-batch-tokens", 64)  # cuts every 8 KiB: slices of ~500 lines
    out, local = tmp_path / "ray.parquet", tmp_path / "local.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out, *flags, "--stats", tmp_path / "first.json", *ray_flags(driver))
    assert json.loads((tmp_path / "first.json").read_text())["shards"] >= 3
    cli("embed", corpus, "-m", st_model, "-o", local, *flags)
    lines = corpus.read_text().splitlines()
    for i in (7, 1234, 2999):  # the first slice's first batch, inside a later slice, the last line
        lines[i] = json.dumps({"id": f"d{i}", "text": f"row {i} changed since the first run"})
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join(lines) + "\n")
    read = {}
    for name, path, extra in (("ray", out, ray_flags(driver)), ("local", local, ())):
        cli("embed", changed, "-m", st_model, "-o", path, *flags, "--incremental", "--stats", tmp_path / f"{name}.json",
            *extra)
        stats = json.loads((tmp_path / f"{name}.json").read_text())
        assert (stats["computed_rows"], stats["carried_rows"]) == (3, 2997)
        read[name] = stats["rows_read"]
    assert read["ray"] == read["local"] < 3000
    full = tmp_path / "full.parquet"
    cli("embed", changed, "-m", st_model, "-o", full, *flags)
    for suffix in ("", ".embedcli-index.parquet"):
        assert Path(f"{out}{suffix}").read_bytes() == Path(f"{full}{suffix}").read_bytes()


def test_a_slice_ending_inside_an_unchanged_file_counts_its_row_groups_once(cli, st_model: Path, tmp_path: Path,
                                                                            driver) -> None:  # type: ignore[no-untyped-def]
    """Under `--incremental` a slice that stops at a row group of a file unchanged since the last run reads it up to
    there (its first row group carried over): the file's row groups are counted once, as a full run counts them,
    so the output and row index (its input units) are the bytes of a full run, and the next rerun carries them."""
    def parquet(path: Path, prefix: str, n: int, groups: int, changed: int = -1) -> None:
        texts = [f"{prefix} row {i}" + (" changed" if i == changed else "") for i in range(n)]
        pq.write_table(pa.table({"id": [f"{prefix}{i}" for i in range(n)], "text": texts}), path, row_group_size=groups)

    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    parquet(a, "a", 200, 100)
    parquet(b, "b", 300, 200)  # row groups of 200 and 100 rows: slices of 100 records stop at the second
    out = tmp_path / "ray.parquet"
    flags = ("-m", st_model, "--shard-rows", 100, "-q", *SMALL)
    cli("embed", a, b, "-o", out, *flags, "--stats", tmp_path / "first.json", *ray_flags(driver))
    assert json.loads((tmp_path / "first.json").read_text())["shards"] >= 3
    parquet(a, "a", 200, 100, changed=150)
    for k, computed in enumerate((1, 0)):  # the changed row; then none (nothing changed since)
        cli("embed", a, b, "-o", out, *flags, "--incremental", "--stats", tmp_path / "s.json", *ray_flags(driver))
        assert json.loads((tmp_path / "s.json").read_text())["computed_rows"] == computed
        full = tmp_path / f"full{k}.parquet"
        cli("embed", a, b, "-o", full, *flags)
        for suffix in ("", ".embedcli-index.parquet"):
            assert Path(f"{out}{suffix}").read_bytes() == Path(f"{full}{suffix}").read_bytes()


def test_slices_type_the_first_batch_as_a_local_run(cli, st_model: Path, tmp_path: Path, driver) -> None:  # type: ignore[no-untyped-def]
    """The inputs' first cut (256 KiB in: rows with a big field not read) ends a local run's first batch, whose
    rows fix the kept column's type (null so far: text): a Ray run and its `--incremental` rerun end theirs
    there too, so they type it and index its rows as the local run does."""
    def write(changed: int) -> Path:
        path = tmp_path / "in.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for i in range(400):
                f.write(json.dumps({"id": f"r{i}", "text": f"row {i}" + (" changed" if i == changed else ""),
                                    "meta": "m" * 4000, "k": None if i < 100 else i}) + "\n")
        return path

    flags = ("-m", st_model, "--keep-cols", "k", "--shard-rows", 200, "-q")
    out = tmp_path / "ray.parquet"
    cli("embed", write(-1), "-o", out, *flags, *ray_flags(driver))
    local = tmp_path / "local.parquet"
    cli("embed", write(-1), "-o", local, *flags)
    assert pq.read_schema(local).field("k").type == pa.string()
    assert pq.read_schema(out).field("k").type == pa.string()
    index = [pq.read_table(f"{p}.embedcli-index.parquet").column("line") for p in (out, local)]
    assert index[0].equals(index[1])
    cli("embed", write(300), "-o", out, *flags, "--incremental", *ray_flags(driver))
    full = tmp_path / "full.parquet"
    cli("embed", write(300), "-o", full, *flags)
    for suffix in ("", ".embedcli-index.parquet"):
        assert Path(f"{out}{suffix}").read_bytes() == Path(f"{full}{suffix}").read_bytes()


def test_a_run_staged_by_the_local_engine_resumes_under_ray(cli, st_model: Path, corpus: Path, tmp_path: Path,
                                                            driver, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The local engine's manifest records read points as this one's: the rest is planned from the last one."""
    from embedcli.compute.runner import Runner

    real = Runner.map

    def stop_after_three(self, batches):  # type: ignore[no-untyped-def]
        for i, result in enumerate(real(self, batches)):
            if i == 3:
                raise KeyboardInterrupt
            yield result

    out = tmp_path / "o.parquet"
    monkeypatch.setattr(Runner, "map", stop_after_three)
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 50, "-q", *SMALL, code=130)
    monkeypatch.setattr(Runner, "map", real)
    assert not out.exists()
    manifest = json.loads((tmp_path / "o.parquet.embedcli-staging" / "_embedcli" / "manifest.json").read_text())
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 50, "-q", "--stats", tmp_path / "s.json", *SMALL,
        *ray_flags(driver))
    stats = json.loads((tmp_path / "s.json").read_text())
    resumed = stats["resumed_rows"]  # whole commits, from the manifest
    assert resumed == manifest["records_done"] > 0 and stats["computed_rows"] == ROWS - resumed
    assert stats["rows_read"] == ROWS - resumed  # the committed rows are not read again
    assert stats["shards"] >= 2  # the rest in slices
    local = tmp_path / "local.parquet"
    cli("embed", corpus, "-m", st_model, "-o", local, "-q", *SMALL, "--shard-rows", 50)
    assert vectors(out)[0] == vectors(local)[0]
    assert np.array_equal(vectors(out)[1], vectors(local)[1])  # a commit and the cuts end batches: bit for bit


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Data's own context fields
def test_embed_dataset_keeps_bad_rows_as_error_records(st_model: Path, tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    from embedcli.compute.runner import Runner
    from embedcli.engines.ray_engine import ERROR_COL, embed_dataset

    texts = [f"row {i} about the market" for i in range(40)]
    items = [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
    items[5]["text"] = None
    ctx = ray.data.DataContext.get_current()
    before = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True
    try:
        ds = embed_dataset(ray.data.from_items(items), str(st_model), workers=2, batch_size=16, dtype="float32")
        rows = ds.take_all()
    finally:
        ctx.execution_options.preserve_order = before
    assert [r["id"] for r in rows] == [f"d{i}" for i in range(40)]
    assert rows[5]["embedding"] is None and rows[5][ERROR_COL] == "text is null"
    good = [i for i in range(40) if i != 5]
    expected = Runner(tiny_loaded("bert-st")).embed([texts[i] for i in good])
    got = np.stack([np.asarray(rows[i]["embedding"], dtype=np.float32) for i in good])
    assert np.abs(got - expected).max() <= 1e-6
    assert all(rows[i][ERROR_COL] is None for i in good)
