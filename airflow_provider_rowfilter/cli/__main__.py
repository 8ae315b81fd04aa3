"""``python -m airflow_provider_rowfilter.cli``: the ``rowfilter`` command."""
from __future__ import annotations

import sys

from airflow_provider_rowfilter.cli import main

if __name__ == "__main__":
    sys.exit(main())
