"""Whether the Spark Connect server of a spec's ``spark_remote`` answers, without loading pyspark.

spark/session.py asks it before it builds a Connect session: pyspark's client would retry an
unreachable server for minutes, and takes about 0.7 s to import (gRPC, pandas, pyarrow) before it
even tries; a TCP connection takes a millisecond.
"""

from __future__ import annotations

import socket

from airflow_provider_rowfilter.core.errors import SparkUnavailableError

#: Spark Connect's port when ``sc://host`` names none (pyspark's ChannelBuilder.default_port).
DEFAULT_PORT = 15002


def remote_address(remote: str) -> tuple[str, int]:
    """``(host, port)`` of ``sc://host:port/;…`` as pyspark's ChannelBuilder reads it."""
    netloc = remote.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0]
    host, _, port = netloc.rpartition(":") if netloc.rfind(":") > netloc.rfind("]") else (netloc, "", "")
    return host.strip("[]"), int(port) if port.isdigit() else DEFAULT_PORT


def require_server(remote: str) -> None:
    """Raise at once when nothing listens at ``remote``: pyspark's client would retry for minutes.

    :raises SparkUnavailableError: transient, a later run may find the server up.
    """
    host, port = remote_address(remote)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise SparkUnavailableError(f"no Spark Connect server answers at spark_remote {remote!r}: {e.strerror or e}",
                                    hint="start it (`rowfilter spark-server start` for the local one) or fix "
                                    "spark_remote in the spec") from None
