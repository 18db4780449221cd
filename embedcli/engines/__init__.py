"""Engines other than the local runner: `ray_engine` runs the same runner inside Ray actors."""
