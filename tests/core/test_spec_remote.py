"""The spec's spark_remote: a Spark Connect URL, never with its token."""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec import SubscriptionSpec

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
