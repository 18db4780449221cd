"""Issue 22, item 11: `embedcli download` fetches the chosen files by exact name (a listed file named `*` is
not a glob that pulls pickle weights), and a `../` name is refused before anything is fetched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.hub_server import FakeHub, serving
from tests.models.test_download import _embedcli, _env, _model_files


@pytest.fixture(scope="module")
def hub(tiny_model) -> Iterator[FakeHub]:  # type: ignore[no-untyped-def]
    files = _model_files(tiny_model("bert-st"))
    star = {**files, "*": b"a file named star", "pytorch_model.bin": b"pickle: never without --allow-pickle",
            "weights/model.ckpt": b"pickle too"}
    escape = {**files, "../outside.txt": b"must never be written"}
    with serving({"odd/star": star, "odd/escape": escape}) as server:
        yield server


def test_a_file_named_star_does_not_fetch_pickle_weights(hub: FakeHub, tmp_path: Path) -> None:
    done = _embedcli(["download", "odd/star", "-q"], _env(hub, tmp_path / "hf"))
    assert done.returncode == 0, done.stderr
    fetched = hub.fetched()
    assert "model.safetensors" in fetched
    assert "pytorch_model.bin" not in fetched and "weights/model.ckpt" not in fetched
    assert not (Path(done.stdout.strip()) / "pytorch_model.bin").exists()


def test_a_name_outside_the_folder_is_one_line_and_leaves_no_snapshot(hub: FakeHub, tmp_path: Path) -> None:
    home = tmp_path / "hf"
    before = hub.fetched()
    done = _embedcli(["download", "odd/escape"], _env(hub, home))
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "'../outside.txt'" in done.stderr and "outside the model folder" in done.stderr
    assert hub.fetched() == before
    assert not (home / "hub" / "models--odd--escape" / "snapshots").exists()
    assert not (home / "hub" / "outside.txt").exists()


def test_exact_pattern_matches_only_its_name() -> None:
    import fnmatch

    from embedcli.models.checkpoint.download import exact_pattern

    for name in ["*", "a[1].json", "what?.txt", "dir/*.bin"]:
        assert fnmatch.fnmatch(name, exact_pattern(name))
        assert not fnmatch.fnmatch("pytorch_model.bin", exact_pattern(name))
