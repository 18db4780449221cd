"""The one compiled piece: embedcli's AVX-512 / AVX2 CPU kernels (embedcli/models/kernels/_cpu.cpp); metadata is in pyproject.toml.

Optional: without a C++ compiler (or off x86-64) the build only warns, and embedcli computes the same thing through
torch (embedcli/models/kernels/native.py reports the extension missing; its callers take their torch paths). It
needs no torch headers and builds in seconds.
"""

import platform

from setuptools import Extension, setup

X86 = platform.machine().lower() in ("x86_64", "amd64")

setup(
    ext_modules=[
        Extension(
            "embedcli.models.kernels._cpu",
            sources=["embedcli/models/kernels/_cpu.cpp"],
            # The AVX-512 and AVX2 code is compiled under target pragmas and chosen at run time from cpuid; the rest is plain.
            # -Wno-(maybe-)uninitialized: GCC 12 warns inside its own AVX-512 headers (their _mm512_undefined_* values).
            extra_compile_args=[
                "-O3", "-std=c++17", "-fno-exceptions", "-fno-rtti", "-fvisibility=hidden", "-Wno-maybe-uninitialized", "-Wno-uninitialized",
            ],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
    if X86
    else [],
)
