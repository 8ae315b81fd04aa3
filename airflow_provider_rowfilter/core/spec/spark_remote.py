"""A Spark Connect URL (``sc://host:port/;param=value;…``) as pyspark reads it, and the one secret it must not carry."""

from __future__ import annotations

from airflow_provider_rowfilter.core.errors import SpecError

#: The environment variable pyspark's Spark Connect client reads its bearer token from (never the spec).
SPARK_CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
#: The refusal of a spark_remote that is no Spark Connect URL, and its fix (core/spec/values.py names them too).
NOT_A_URL = "is not a Spark Connect URL"
URL_HINT = "write spark_remote: sc://host:15002 or leave it out"


def remote_params(url: str) -> tuple[str, list[tuple[str, str]]]:
    """``sc://host:port/;key=value;…`` as pyspark's ChannelBuilder reads it: the URL before its first ``;``,
    and its parameters in order, keys stripped (lower-case: pyspark's are), values as written, empty ones left out."""
    base, _, params = url.partition(";")
    return base, [(k.strip().lower(), v) for k, _, v in (p.partition("=") for p in params.split(";")) if k.strip()]


def with_remote_params(base: str, params: list[tuple[str, str]]) -> str:
    """The URL of ``base`` (``sc://host:port/``) with these parameters: what :func:`remote_params` split."""
    return ";".join([base if base.endswith("/") or not params else base + "/", *(f"{k}={v}" for k, v in params)])


def check_spark_remote(url: str, what: str) -> None:
    """Refuse a ``spark_remote`` that is not a Spark Connect URL or that carries a secret.

    pyspark's ChannelBuilder reads ``sc://host:port/;param=value;…``; its ``token`` parameter is a
    bearer token, which must not travel in the spec (the spec crosses process boundaries as JSON on
    a command line): the client reads it from :data:`SPARK_CONNECT_TOKEN_ENV` instead.
    """
    if not url.startswith("sc://") or len(url) == len("sc://"):
        raise SpecError(f"{what} = {url!r} {NOT_A_URL}", hint=URL_HINT)
    if any(key == "token" for key, _ in remote_params(url)[1]):
        raise SpecError(f"{what} carries a token (the URL is not shown: it holds a secret)",
                        hint=f"remove ;token=… and give the token in the environment variable {SPARK_CONNECT_TOKEN_ENV} "
                        "(in Airflow: the Token of the spark_connect connection)")
