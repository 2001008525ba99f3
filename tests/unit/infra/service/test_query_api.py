"""The query API's answers to bodies it cannot read, without Spark: what is wrong, in words."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from pydantic import SecretStr

from infra.service.query_api import create_app
from infra.service.query_metrics import QueryMetrics
from infra.service.tenant_access import KeyCheck
from tests.support.uvicorn_server import serving

OPERATOR_KEY = "operator-key-for-unit-tests"


class NoStatements:
    """A service no statement reaches: each of these bodies is refused before one could."""

    def run(self, *_args: object) -> None:
        raise AssertionError("a body that cannot be read reached the service")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    app = create_app(
        NoStatements(),  # type: ignore[arg-type]
        KeyCheck(tmp_path_factory.mktemp("conf"), SecretStr(OPERATOR_KEY), 60.0),
        lambda tenant: [],
        QueryMetrics(),
    )
    with serving(app) as url:
        yield url


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"sql": ', "expecting value at line 1 column 9"),
        ('{"sql": "SELECT 1",\n "format": json}', "expecting value at line 2 column 12"),
        ('{"sql": "SELECT 1" "format": "json"}', "expecting ',' delimiter at line 1 column 20"),
        ("{'sql': 'SELECT 1'}", "expecting property name enclosed in double quotes at line 1 "
         "column 2"),
    ],
)  # fmt: skip
def test_a_body_that_is_not_json_gets_what_is_wrong_and_where(
    api: str, body: str, message: str
) -> None:
    answer = requests.post(
        f"{api}/v1/query",
        data=body,
        headers={"Authorization": f"Bearer {OPERATOR_KEY}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == {
        "code": "bad_request",
        "message": f"the request body is not valid JSON: {message}",
    }


def test_a_body_of_the_wrong_shape_names_the_field(api: str) -> None:
    answer = requests.post(
        f"{api}/v1/query",
        json={"sql": "SELECT 1", "format": "xml"},
        headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
        timeout=30,
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith("format: Input should be 'json'")
