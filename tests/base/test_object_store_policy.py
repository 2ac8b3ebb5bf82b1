"""kubeflow/object-store-policy.json, one namespace's credentials, against a real SeaweedFS with
IAM on: `-s3.config` with an admin and two namespaces, ns-a and ns-b, each an identity bound to
the shipped policy (SeaweedFS 4.48 evaluates it AWS-style: weed/s3api/auth_credentials.go).

A whole pipeline run as ns-a, its data and serving roots under tfx-pipeline/ns-a/, needs nothing
beyond that prefix; ns-b's objects, the bucket's root and bucket-level calls are refused, and a
run pointed at ns-b's data stops at once naming the prefix its credentials may not list.
"""

from __future__ import annotations

import json
import secrets

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from components.base.config import REPO_ROOT
from components.base.object_store import EmbeddedObjectStore
from tests.pipelines import cli_process

POLICY = REPO_ROOT / "kubeflow" / "object-store-policy.json"
BUCKET = "tfx-pipeline"  # the bucket the shipped policy names, the config's default
NAMESPACES = ("ns-a", "ns-b")


def _credentials(name: str) -> dict[str, str]:
    return {"accessKey": f"{name.upper().replace('-', '')}{secrets.token_hex(8).upper()}",
            "secretKey": secrets.token_hex(20)}  # fmt: skip


@pytest.fixture(scope="module")
def iam_store(tmp_path_factory):
    """(endpoint, name -> credentials): SeaweedFS accepting only these keys."""
    work = tmp_path_factory.mktemp("iam-store")
    keys = {name: _credentials(name) for name in ("admin", *NAMESPACES)}
    policy = POLICY.read_text()
    assert policy.count("NAMESPACE") == 2  # the placeholder an operator replaces
    config = {
        "identities": [
            {"name": "admin", "credentials": [keys["admin"]], "actions": ["Admin"]},
            *[{"name": ns, "credentials": [keys[ns]], "policyNames": [ns]} for ns in NAMESPACES],
        ],
        "policies": [
            {"name": ns, "content": policy.replace("NAMESPACE", ns)} for ns in NAMESPACES
        ],  # fmt: skip
    }
    path = work / "s3.json"
    path.write_text(json.dumps(config))
    # start() points this process's AWS_ENDPOINT_URL_S3 at it: the session store's is put back
    # afterwards (as the other tests that start a store do), or later tests on this worker would
    # talk to a stopped store.
    with pytest.MonkeyPatch.context() as environment:
        environment.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        store = EmbeddedObjectStore(work / "data", s3_config=path).start()
        try:
            _client(store.endpoint, keys["admin"]).create_bucket(Bucket=BUCKET)
            yield store.endpoint, keys
        finally:
            store.stop()


def _client(endpoint: str, credentials: dict[str, str]):
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=credentials["accessKey"],
        aws_secret_access_key=credentials["secretKey"],
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )  # fmt: skip


def _environment(endpoint: str, credentials: dict[str, str]) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": credentials["accessKey"],
            "AWS_SECRET_ACCESS_KEY": credentials["secretKey"]}  # fmt: skip


def test_a_namespace_keeps_to_its_prefix(iam_store):
    endpoint, keys = iam_store
    a, b = (_client(endpoint, keys[ns]) for ns in NAMESPACES)
    b.put_object(Bucket=BUCKET, Key="ns-b/data/secret.csv", Body=b"ns-b's rows")
    a.put_object(Bucket=BUCKET, Key="ns-a/data/own.csv", Body=b"ns-a's rows")
    listed = a.list_objects_v2(Bucket=BUCKET, Prefix="ns-a/")
    assert [item["Key"] for item in listed["Contents"]] == ["ns-a/data/own.csv"]
    refused = {
        "read ns-b's object": lambda: a.get_object(Bucket=BUCKET, Key="ns-b/data/secret.csv"),
        "write under ns-b": lambda: a.put_object(Bucket=BUCKET, Key="ns-b/planted", Body=b""),
        "delete ns-b's object": lambda: a.delete_object(Bucket=BUCKET, Key="ns-b/data/secret.csv"),
        "list ns-b": lambda: a.list_objects_v2(Bucket=BUCKET, Prefix="ns-b/"),
        "list the bucket": lambda: a.list_objects_v2(Bucket=BUCKET),
        "list a prefix of both": lambda: a.list_objects_v2(Bucket=BUCKET, Prefix="ns-"),
        "copy from ns-b": lambda: a.copy_object(
            Bucket=BUCKET,
            Key="ns-a/stolen",
            CopySource={"Bucket": BUCKET, "Key": "ns-b/data/secret.csv"},
        ),
        "create a bucket": lambda: a.create_bucket(Bucket="ns-a-own"),
    }
    for what, call in refused.items():
        with pytest.raises(ClientError) as error:
            call()
        assert error.value.response["Error"]["Code"] == "AccessDenied", what
    body = b.get_object(Bucket=BUCKET, Key="ns-b/data/secret.csv")["Body"].read()
    assert body == b"ns-b's rows"  # untouched


def test_a_whole_run_as_the_namespace_needs_nothing_beyond_its_prefix(iam_store, tmp_path):
    endpoint, keys = iam_store
    environment = _environment(endpoint, keys["ns-a"])
    roots = ("--set", f"data_root=s3://{BUCKET}/ns-a/data/taxi-trips",
             "--set", f"serving_root=s3://{BUCKET}/ns-a/serving")  # fmt: skip
    added = cli_process.run(tmp_path, "add-span", "--rows", "3000", *roots, **environment)
    assert added.returncode == 0, added.stdout + added.stderr
    settings = ("--set", "train_steps=200", "--set", "epochs=1", "--set", "eval_steps=5",
                "--set", "min_auc=0.5", "--set", "min_accuracy=0.5")  # fmt: skip
    run = cli_process.run(tmp_path, "run", *roots, *settings, **environment)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"s3://{BUCKET}/ns-a/serving/taxi-tips/1" in run.stdout  # pushed and served
    admin = _client(endpoint, keys["admin"])
    written = [item["Key"] for page in admin.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET) for item in page.get("Contents", [])]  # fmt: skip
    assert any(key.startswith("ns-a/serving/taxi-tips/1/") for key in written)
    assert all(key.startswith(("ns-a/", "ns-b/")) for key in written), written

    # The same credentials pointed at ns-b's data: stopped at once, naming what they may not do.
    other = cli_process.run(tmp_path, "run", "--set", f"data_root=s3://{BUCKET}/ns-b/data",
                            *roots[2:], *settings, **environment)  # fmt: skip
    assert other.returncode != 0
    assert f"may not list s3://{BUCKET}/ns-b/data/" in other.stderr + other.stdout
