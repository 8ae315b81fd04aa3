"""The C extension of the capture's decoder (everything else is in pyproject.toml).

``optional=True``: where no C compiler is found the install goes on without it, and the capture uses
its numpy decoder, which gives the same change log (publisher/pgoutput_columns.py).
"""

from __future__ import annotations

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "airflow_provider_rowfilter.publisher._pgoutput_native",
    ["airflow_provider_rowfilter/publisher/_pgoutput_native.c"],
    extra_compile_args=["-O2"],
    optional=True,
)])
