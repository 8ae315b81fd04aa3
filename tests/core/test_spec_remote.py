"""The spec's spark_remote: a Spark Connect URL, never with its token."""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.spark_remote import remote_params, with_remote_params
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

BASE = {"subscription": "s1", "publications": ["p1"]}


@pytest.mark.parametrize("url", ["sc://127.0.0.1:15002", "sc://spark.example/;use_ssl=true;user_id=etl", "sc://[::1]:15002"])
def test_a_connect_url_is_kept_and_crosses_as_json(url):
    spec = SubscriptionSpec.from_dict({**BASE, "spark_remote": url})
    assert spec.spark_remote == url
    assert SubscriptionSpec.from_json(spec.to_json()).spark_remote == url


@pytest.mark.parametrize("url, message", [
    ("spark://127.0.0.1:7077", "spark_remote of subscription 's1' = 'spark://127.0.0.1:7077' is not a Spark Connect URL"),
    ("sc://", "is not a Spark Connect URL"),
    (15002, "spark_remote=15002 is not a Spark Connect URL"),
])
def test_what_is_not_a_connect_url_is_refused(url, message):
    with pytest.raises(SpecError, match="sc://host:15002") as e:
        SubscriptionSpec.from_dict({**BASE, "spark_remote": url})
    assert message in str(e.value)


@pytest.mark.parametrize("url", ["sc://h:15002/;token=s3cr3t-Tok", "sc://h/;use_ssl=true;TOKEN = s3cr3t-Tok"])
def test_a_token_in_the_url_is_refused_without_showing_it(url):
    with pytest.raises(SpecError, match="carries a token") as e:
        SubscriptionSpec.from_dict({**BASE, "spark_remote": url})
    assert "s3cr3t-Tok" not in str(e.value)
    assert "SPARK_CONNECT_AUTHENTICATE_TOKEN" in str(e.value)


# The parameters as pyspark's ChannelBuilder reads them, and the URL built back with a job's Connect session id
# (spark/session.py).
SID = ("session_id", "6b2f0d3e-8f63-4c4e-9a53-2f7d3c1a9e10")


@pytest.mark.parametrize(("url", "params", "with_session"), [
    pytest.param("sc://h:15002", [], "sc://h:15002/;session_id=6b2f0d3e-8f63-4c4e-9a53-2f7d3c1a9e10", id="bare"),
    pytest.param("sc://h:15002/", [], "sc://h:15002/;session_id=6b2f0d3e-8f63-4c4e-9a53-2f7d3c1a9e10", id="slash"),
    pytest.param("sc://h:15002/;", [], "sc://h:15002/;session_id=6b2f0d3e-8f63-4c4e-9a53-2f7d3c1a9e10",
                 id="empty parameter list"),
    pytest.param("sc://h:1/;use_ssl=true;;User_Id=etl", [("use_ssl", "true"), ("user_id", "etl")],
                 "sc://h:1/;use_ssl=true;user_id=etl;session_id=6b2f0d3e-8f63-4c4e-9a53-2f7d3c1a9e10",
                 id="parameters, an empty one, a key in capitals"),
    pytest.param("sc://h:1/;x_session_id=a", [("x_session_id", "a")],
                 "sc://h:1/;x_session_id=a;session_id=6b2f0d3e-8f63-4c4e-9a53-2f7d3c1a9e10", id="a key that ends alike"),
])
def test_remote_params(url: str, params: list[tuple[str, str]], with_session: str) -> None:
    base, found = remote_params(url)
    assert found == params
    assert with_remote_params(base, [*found, SID]) == with_session
