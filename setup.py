"""The compiled transport engine (traffic/native), built from source with the machine's C
compiler when fabriclab is installed; everything else is in pyproject.toml.

``optional=True``: a machine without a compiler (or Python's headers) still installs, and
runs the transports' Python engine, saying so once (traffic/native/__init__.py)."""

from glob import glob

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "traffic.native._engine",
    sources=sorted(glob("traffic/native/src/*.c")),
    depends=sorted(glob("traffic/native/src/*.h")),
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
    optional=True)])
