"""What every `Embedder` method shares: the model flags (one `ModelChoice`, as the CLI's), the resolved model,
the runners built so far, and `embed`'s defaults."""

from __future__ import annotations

from collections.abc import Sequence

from embedcli.api.inputs import texts_of
from embedcli.api.runners import Runners
from embedcli.compute.build import RunnerRecipe, embed_recipe
from embedcli.errors import UsageError
from embedcli.models.llm_reranker import reranker_flags
from embedcli.tasks.common import ModelChoice, load_spec


class Session:
    """A model resolved offline with the flags every command shares; its weights load on first use, once."""

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        threads: int | None = None,
        max_batch_tokens: int | None = None,
        max_length: int | None = None,
        allow_pickle: bool = False,
        trust_remote_code: bool = False,
        quantize: bool = False,
        classifier_from_tokens: str | Sequence[str] | None = None,
        pair_template: str | None = None,
        instruction: str | None = None,
        reranker_preset: str | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> None:
        tokens = classifier_from_tokens
        if tokens is not None and not isinstance(tokens, str):
            tokens = ",".join(texts_of(tokens, "classifier_from_tokens"))
        reranker = reranker_flags(tokens, pair_template, instruction, reranker_preset)
        self.choice = ModelChoice(None if model is None else str(model), device, dtype, max_length, allow_pickle,
                                  trust_remote_code, quantize, reranker, threads)
        self.choice.options()  # refused device / dtype / quantize values: usage errors now, not at first use
        self.spec = load_spec(self.choice)  # resolved (its weight files hashed) once; weights load on first use
        self.max_batch_tokens = max_batch_tokens
        self._embed_defaults = (normalize, dimensions, prompt, prompt_name)
        self._runners = Runners()

    def _embed_recipe(
        self, normalize: bool | None = None, dimensions: int | None = None, prompt: str | None = None,
        prompt_name: str | None = None, long_inputs: str = "truncate", truncation_side: str | None = None,
        strip: bool = False,
    ) -> RunnerRecipe:
        """`embedcli embed`'s recipe; what is not given here is the constructor's (a prompt asked here replaces
        the constructor's prompt and prompt name both)."""
        d_normalize, d_dimensions, d_prompt, d_prompt_name = self._embed_defaults
        if prompt is None and prompt_name is None:
            prompt, prompt_name = d_prompt, d_prompt_name
        return embed_recipe(
            self.spec, self.choice.options(), max_batch_tokens=self.max_batch_tokens,
            normalize=d_normalize if normalize is None else normalize, strip=strip,
            dimensions=d_dimensions if dimensions is None else dimensions, prompt=prompt, prompt_name=prompt_name,
            long_inputs=long_inputs, truncation_side=truncation_side, threads=self.choice.threads,
        )

    def _no_quantize(self, method: str) -> None:
        """UsageError when `quantize=True` was asked of a method the CLI does not quantize."""
        if self.choice.quantize:
            raise UsageError(f"{method}: quantize=True (int8 dynamic) applies to embed only, as "
                             "`embedcli embed --quantize`; make an Embedder without it")
