"""pyspark and pyspark-client install into the same package directory: their versions must agree."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def test_pyspark_client_does_not_overwrite_pyspark_with_another_version():
    # Mixed files broke Python UDFs and mapInArrow ("Constructor UserDefinedPythonFunction … does not exist").
    try:
        client = version("pyspark-client")
    except PackageNotFoundError:
        client = None
    assert client in (None, version("pyspark"))
