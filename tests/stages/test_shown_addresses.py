"""An address a message shows (the MLflow tracking URI, a critic endpoint, a server's store) is
shown without its user and password, and a malformed one is a one-line refusal, not a
traceback (``stages.tracking.lineage.without_credentials``; the host ``[::1`` without its ``]`` made
urllib raise ValueError)."""

from __future__ import annotations

import pytest

from flows.servers import Stores
from physai_core.errors import ConfigError
from stages.evaluation.critic import URL_ENV, CriticError, endpoint
from stages.sections.models import CriticConfig
from stages.tracking.lineage import LineageRecorder, without_credentials

PASSWORD = "pa55word"


@pytest.mark.parametrize(("uri", "shown"), [
    ("http://user:pa55word@mlflow:5000/", "http://mlflow:5000/"),
    ("postgresql+psycopg2://user:pa55word@db/mlflow", "postgresql+psycopg2://db/mlflow"),
    ("https://user:pa55word@[::1", "https://[::1"),
    # a single address, not free text: a quote or a space ends no password
    ("postgresql://user:pa'55word@db/mlflow", "postgresql://db/mlflow"),
    ("postgresql://user:pa55 word@db/mlflow", "postgresql://db/mlflow"),
    ("sqlite:////srv/a@b/mlflow.db", "sqlite:////srv/a@b/mlflow.db"),
    ("/srv/user@host/mlruns", "/srv/user@host/mlruns"),
])
def test_an_address_is_shown_without_user_and_password(uri: str, shown: str) -> None:
    assert without_credentials(uri) == shown
    assert LineageRecorder(uri).shown_uri == shown


def test_a_malformed_critic_endpoint_is_one_line_without_its_password() -> None:
    with pytest.raises(CriticError, match=r"PHYSAI_COSMOS_URL: 'https://\[::1' is not an "
                                          r"http\(s\) URL") as err:
        endpoint(CriticConfig(), env={URL_ENV: f"https://user:{PASSWORD}@[::1"})
    assert PASSWORD not in str(err.value)


@pytest.mark.parametrize(("stores", "option"), [
    (Stores(prefect_database=f"postgresql+asyncpg://prefect:{PASSWORD}@[::1/prefect"),
     "--prefect-database"),
    (Stores(mlflow_database=f"postgresql://mlflow:{PASSWORD}@[::1/mlflow"), "--mlflow-database"),
])
def test_a_malformed_server_database_is_one_line_without_its_password(
        stores: Stores, option: str) -> None:
    with pytest.raises(ConfigError, match=f"flows server up: {option}: not a URL") as err:
        stores.check()
    assert PASSWORD not in str(err.value)
    assert err.value.exit_code == 2
