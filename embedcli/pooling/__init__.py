"""vLLM's pooler re-made in pure PyTorch: methods, activations, heads, poolers and their parameters (no I/O)."""

from embedcli.pooling.activations import (
    LambdaPoolerActivation,
    PoolerActivation,
    PoolerClassify,
    PoolerIdentity,
    PoolerMultiLabelClassify,
    PoolerNormalize,
    get_activation,
    resolve_classifier_activation,
)
from embedcli.pooling.heads import (
    ClassifierPoolerHead,
    EmbeddingPoolerHead,
    TokenClassifierPoolerHead,
    TokenEmbeddingPoolerHead,
)
from embedcli.pooling.metadata import PoolingCursor, PoolingMetadata, PoolingState
from embedcli.pooling.methods import (
    AllPool,
    CLSPool,
    LastPool,
    MeanPool,
    StepPool,
    get_tok_pooling_method,
    segment_sum_float32,
)
from embedcli.pooling.params import (
    POOLING_TASKS,
    EmbeddingShape,
    PoolerConfig,
    PoolingConfigError,
    PoolingParams,
    PoolingTask,
)
from embedcli.pooling.poolers import (
    DispatchPooler,
    Pooler,
    SequencePooler,
    TokenPooler,
    pooler_for_classify,
    pooler_for_embed,
    pooler_for_token_classify,
    pooler_for_token_embed,
)
from embedcli.pooling.splade import SpladePooler, splade_activation, to_sparse
from embedcli.pooling.st_pooling import get_seq_pooling_method
from embedcli.pooling.token_score import TokenLogitScore

__all__ = [
    "POOLING_TASKS",
    "AllPool",
    "CLSPool",
    "ClassifierPoolerHead",
    "DispatchPooler",
    "EmbeddingPoolerHead",
    "EmbeddingShape",
    "LambdaPoolerActivation",
    "LastPool",
    "MeanPool",
    "Pooler",
    "PoolerActivation",
    "PoolerClassify",
    "PoolerConfig",
    "PoolerIdentity",
    "PoolerMultiLabelClassify",
    "PoolerNormalize",
    "PoolingConfigError",
    "PoolingCursor",
    "PoolingMetadata",
    "PoolingParams",
    "PoolingState",
    "PoolingTask",
    "SequencePooler",
    "SpladePooler",
    "StepPool",
    "TokenClassifierPoolerHead",
    "TokenEmbeddingPoolerHead",
    "TokenLogitScore",
    "TokenPooler",
    "get_activation",
    "get_seq_pooling_method",
    "get_tok_pooling_method",
    "pooler_for_classify",
    "pooler_for_embed",
    "pooler_for_token_classify",
    "pooler_for_token_embed",
    "resolve_classifier_activation",
    "segment_sum_float32",
    "splade_activation",
    "to_sparse",
]
