"""The S3-compatible servers the tests start (tests/s3.py): moto's server and SeaweedFS.

What the object-store tests rely on: a bucket per test, objects that come back as they went
in, ``If-None-Match: *`` refusing a second create with 412, requests counted from the
server's own log, and a stop/start on the same port. Each test runs on both servers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from s3 import STORE_PREFIX, S3Server
from waits import wait_until

SERVERS = ["moto_server", pytest.param("seaweedfs", marks=pytest.mark.slow)]


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> S3Server:
    server: S3Server = request.getfixturevalue(request.param)
    return server.start()  # up again if a test before this one left it stopped


def bucket_of(url: str) -> str:
    assert url.startswith("s3://") and url.endswith(f"/{STORE_PREFIX}"), url
    return url.removeprefix("s3://").split("/")[0]


def test_each_store_is_an_empty_bucket_of_its_own(server: S3Server) -> None:
    first, second = server.store(), server.store()
    assert first.url != second.url and first.endpoint == second.endpoint == server.endpoint
    client = server.client()
    client.put_object(Bucket=bucket_of(first.url), Key=f"{STORE_PREFIX}/x", Body=b"1")
    assert client.list_objects_v2(Bucket=bucket_of(second.url)).get("KeyCount") == 0
    assert set(first.env) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}


def test_objects_come_back_as_they_were_put_with_boto3(server: S3Server, tmp_path) -> None:
    bucket = bucket_of(server.bucket())
    client = server.client()
    small = os.urandom(1000)
    client.put_object(Bucket=bucket, Key="tier/a b/small", Body=small)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(9 << 20))  # above boto3's 8 MiB threshold: a multipart upload
    client.upload_file(str(big), bucket, "tier/a b/big")
    assert client.get_object(Bucket=bucket, Key="tier/a b/small")["Body"].read() == small
    assert client.get_object(Bucket=bucket, Key="tier/a b/big")["Body"].read() == big.read_bytes()
    listed = client.list_objects_v2(Bucket=bucket, Prefix="tier/")["Contents"]
    assert sorted((o["Key"], o["Size"]) for o in listed) == [
        ("tier/a b/big", 9 << 20),
        ("tier/a b/small", 1000),
    ]


def test_if_none_match_refuses_a_second_create_with_412(server: S3Server) -> None:
    bucket = bucket_of(server.bucket())
    client = server.client()
    client.put_object(Bucket=bucket, Key="tier/manifest.json", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=bucket, Key="tier/manifest.json", Body=b"second", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    body = client.get_object(Bucket=bucket, Key="tier/manifest.json")["Body"].read()
    assert body == b"first"


def test_requests_lists_one_key_per_request_from_the_servers_own_log(server: S3Server) -> None:
    bucket = bucket_of(server.bucket())
    client = server.client()
    for key in ("c/objects/u1/shard-00000", "c/objects/u1/shard-00001", "other/x"):
        client.put_object(Bucket=bucket, Key=f"tier/{key}", Body=b"data")
    for key in (
        "c/objects/u1/shard-00000",
        "c/objects/u1/shard-00001",
        "c/objects/u1/shard-00001",
        "other/x",
    ):
        client.get_object(Bucket=bucket, Key=f"tier/{key}")
    client.head_object(Bucket=bucket, Key="tier/c/objects/u1/shard-00000")
    with pytest.raises(ClientError):
        client.get_object(Bucket=bucket, Key="tier/c/objects/u1/missing")

    # the server writes its log behind the responses: wait for the last request's line
    wait_until(
        lambda: "c/objects/u1/missing" in server.requests("GET", "c/objects/", bucket=bucket),
        10,
        "the last GET in the server's log",
    )
    gets = server.requests("GET", "c/objects/", bucket=bucket)
    assert gets == [
        "c/objects/u1/shard-00000",
        "c/objects/u1/shard-00001",
        "c/objects/u1/shard-00001",
        "c/objects/u1/missing",
    ]
    assert server.requests("GET", "c/objects/", bucket=bucket, status=200) == gets[:3]
    assert server.requests("PUT", bucket=bucket) == [
        "c/objects/u1/shard-00000",
        "c/objects/u1/shard-00001",
        "other/x",
    ]
    assert server.requests("HEAD", bucket=bucket) == ["c/objects/u1/shard-00000"]
    assert ("GET", bucket, "tier/other/x", 200) in {
        (r.method, r.bucket, r.key, r.status) for r in server.access_log()
    }


def test_env_is_all_a_process_needs_besides_the_endpoint(server: S3Server) -> None:
    store = server.store()
    bucket = bucket_of(store.url)
    server.client().put_object(Bucket=bucket, Key="tier/seen", Body=b"1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | store.env
    listing = subprocess.run(
        [
            sys.executable,
            "-c",
            "import boto3, json, sys; c = boto3.client('s3', "
            "endpoint_url=sys.argv[1]); print(json.dumps([o['Key'] for o in "
            "c.list_objects_v2(Bucket=sys.argv[2])['Contents']]))",
            store.endpoint,
            bucket,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(listing.stdout) == ["tier/seen"]


def test_a_stopped_server_refuses_connections_and_starts_again_on_the_same_port(
    server: S3Server,
) -> None:
    bucket = bucket_of(server.bucket())
    client = server.client(retries={"max_attempts": 1}, connect_timeout=2)
    client.put_object(Bucket=bucket, Key="tier/before", Body=b"kept?")
    endpoint = server.endpoint
    server.stop()
    try:
        assert not server.alive()
        with pytest.raises(EndpointConnectionError):
            client.get_object(Bucket=bucket, Key="tier/before")
    finally:
        server.start()
    assert server.endpoint == endpoint
    listed = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    if server.kind == "moto":  # objects in memory: the bucket is back, empty
        assert listed == []
    else:  # objects on disk
        assert listed == ["tier/before"]
        assert client.get_object(Bucket=bucket, Key="tier/before")["Body"].read() == b"kept?"
    client.put_object(Bucket=bucket, Key="tier/after", Body=b"new")
    # the server writes its log on its own schedule: the line may come a moment later
    wait_until(
        lambda: server.requests("PUT", "after", bucket=bucket) == ["after"],
        40,
        "the PUT after the restart in the server's log",
    )
    assert server.requests("PUT", "before", bucket=bucket) == ["before"]  # counts span it
