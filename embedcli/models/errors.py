"""Errors of model reading: a folder embedcli cannot serve (exit 1) and a config it refuses (exit 2)."""

from __future__ import annotations


class ModelConfigError(ValueError):
    """A model folder embedcli cannot serve, with the file at fault and the fix."""


class ConfigRefusedError(ModelConfigError):
    """A model file or flag value embedcli refuses on purpose (exit 2), naming the file and key."""
