"""A real S3 endpoint for tests: moto's server on 127.0.0.1 with one bucket, `lake`; and the
settings of a lake on an S3 endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import boto3
from moto.server import ThreadedMotoServer

from infra.dev.local_stack import find_free_loopback_port

BUCKET = "lake"


@contextmanager
def moto_s3(access_key: str, secret_key: str) -> Iterator[str]:
    """Serve S3 until the block ends; yields the endpoint as `host:port`."""
    port = find_free_loopback_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"127.0.0.1:{port}"
    try:
        boto3.client(
            "s3",
            endpoint_url=f"http://{endpoint}",
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def s3_environ(endpoint_url: str, access_key: str, secret_key: str) -> dict[str, str]:
    """The `TW_LAKE__S3__*` variables of a lake on the plain-HTTP S3 endpoint `endpoint_url`."""
    return {
        "TW_LAKE__S3__ENDPOINT_URL": endpoint_url,
        "TW_LAKE__S3__ALLOW_HTTP": "true",
        "TW_LAKE__S3__ACCESS_KEY_ID": access_key,
        "TW_LAKE__S3__SECRET_ACCESS_KEY": secret_key,
    }
