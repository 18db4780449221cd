"""A cheap completeness check of a `.safetensors` file: its header must parse and cover the file exactly."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from embedcli.errors import ModelConfigError

_MAX_HEADER = 100 << 20  # the safetensors format caps its JSON header at 100 MB


def check_safetensors(path: Path) -> None:
    """Raise ModelConfigError (one line: the file, what is wrong, the fix) for a truncated or corrupt file.

    The file is 8 bytes of header length, the JSON header, then the tensors; the header's largest
    `data_offsets` end must reach exactly the end of the file. A copy cut short fails this.
    """
    fix = "the file is incomplete or corrupt (an interrupted download or copy?): fetch the model again"
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelConfigError(f"{path}: {size} bytes, too short for a safetensors header; {fix}")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise ModelConfigError(f"{path}: truncated ({size:,} bytes; its header alone claims {n:,}); {fix}")
            header = json.loads(f.read(n))
    except OSError as e:
        raise ModelConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError):
        raise ModelConfigError(f"{path}: the safetensors header is not valid JSON; {fix}") from None
    if not isinstance(header, dict):
        raise ModelConfigError(f"{path}: the safetensors header is not a JSON object; {fix}")
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)
            and isinstance(t.get("data_offsets"), list) and len(t["data_offsets"]) == 2]
    expected = 8 + n + max(ends, default=0)
    if expected != size:
        what = "truncated" if size < expected else "longer than its header says"
        raise ModelConfigError(f"{path}: {what} ({size:,} bytes, the header describes {expected:,}); {fix}")
