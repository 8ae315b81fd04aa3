"""Variables set in this process's environment for a while: a change log store's credentials, which pyarrow's
clients (GCS, Azure) and the jobs run in a task read there."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment while the block runs, then as before."""
    changed = {k: v for k, v in values.items() if os.environ.get(k) != v}
    saved = {k: os.environ.get(k) for k in changed}
    os.environ.update(changed)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
