"""Which commands a model serves and which prompt an embed run uses: decided from the spec, without torch."""

from __future__ import annotations

from embedcli.errors import UsageError
from embedcli.models.spec import ModelSpec


def require_task(spec: ModelSpec, task: str, command: str) -> None:
    """A usage error (exit 2) naming what the model can do, when it cannot do `task`."""
    if task == "embed" and spec.late_interaction is not None:
        raise UsageError(
            f"{command}: model {spec.name!r} is a late-interaction (ColBERT) model: it gives one vector per token, "
            "not one per text; use `embedcli token-embed --role query|document`, or rerank / score (MaxSim)"
        )
    if task not in spec.tasks:
        hint = ""
        if task == "sparse_embed" and spec.architecture.endswith("ForMaskedLM"):
            # sentence-transformers' SparseEncoder would guess SPLADE (max, relu) for a bare masked LM; the
            # pooling and activation are the model's to say, so ask for the folder that says them.
            hint = (
                f"; it is a bare {spec.architecture} without a SpladePooling module (modules.json): save it as a "
                "SparseEncoder first, e.g. SparseEncoder(folder).save_pretrained(out) (SPLADE max of relu), then "
                "run sparse-embed on that folder"
            )
        raise UsageError(f"{command}: model {spec.name!r} cannot do {task!r}; {can_do(spec)}{hint}")


def commands_for(spec: ModelSpec) -> list[str]:
    """The embedcli commands a model can serve (what `info` lists)."""
    commands: list[str] = []
    if "embed" in spec.tasks:
        commands.append("embed")
        if spec.head == "static":
            commands.append("search")
    if "token_embed" in spec.tasks:
        commands.append("token-embed")
    if spec.score_type:
        commands += ["rerank", "score"]
    if "classify" in spec.tasks:
        commands.append("classify")
    if "token_classify" in spec.tasks:
        commands.append("token-classify")
    if "sparse_embed" in spec.tasks:
        commands.append("sparse-embed")
    return commands


def can_do(spec: ModelSpec) -> str:
    """`it supports ... (commands: ...)`, for error messages."""
    return f"it supports {', '.join(spec.tasks)} (commands: {', '.join(commands_for(spec))})"


def embed_prompt(spec: ModelSpec, prompt: str | None, prompt_name: str | None) -> str:
    """The prompt prepended to every text: `--prompt`, else `--prompt-name`'s entry in the model's prompts,
    else the model's `default_prompt_name` (as sentence-transformers), else none."""
    if prompt is not None and prompt_name is not None:
        raise UsageError("--prompt and --prompt-name conflict: give one")
    if prompt is not None:
        return prompt
    name = prompt_name if prompt_name is not None else spec.default_prompt_name
    if name is None:
        return ""
    table = dict(spec.prompts)
    if name not in table:
        known = ", ".join(table) or "none"
        raise UsageError(f"--prompt-name {name!r} is not one of the model's prompts ({known})")
    return table[name]
