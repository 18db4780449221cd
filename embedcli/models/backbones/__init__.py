"""The own varlen backbones (one file per architecture), their shared layers, and the exact fallback."""
