"""Compute engines other than the local process (see `embedcli.engines.ray_engine`)."""
