"""The package version (one place: pyproject.toml reads it, outputs record it in their provenance)."""

__version__ = "0.1.0"
