"""embedcli: vLLM's pooling tasks (embed, score, rerank, classify, token tasks) over files on disk."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embedcli.version import __version__

if TYPE_CHECKING:
    from embedcli.api import Embedder

__all__ = ["Embedder", "__version__"]


def __getattr__(name: str) -> Any:
    # Keep `import embedcli` (and so `embedcli --help`) free of torch/transformers start-up cost.
    if name == "Embedder":
        from embedcli.api import Embedder

        return Embedder
    raise AttributeError(name)
