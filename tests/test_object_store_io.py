"""Bytes that TensorFlow reads after staging from the object store are the bytes written.

STACK.md: TensorFlow's own `s3://` client returns wrong data or hangs on SeaweedFS for large
files and vocabulary tables. Nothing here reads `s3://` through TensorFlow: the Kubeflow launcher
(played by tests/kfp_launcher.py) copies artifacts to local disk, and the project's own IO goes
through Beam and boto3. This test pins that path with the two cases that broke: a TFRecord file
over 10 MB and a vocabulary table read to its last line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from pipelines import storage
from pipelines.kfp_entrypoint import local_path
from tests.kfp_launcher import download


def test_large_tfrecord_and_vocabulary_survive_the_round_trip(object_store, tmp_path):
    bucket = object_store.new_bucket("io")
    records = [np.random.default_rng(i).bytes(1000 + i % 97) for i in range(11_000)]  # ~11.5 MB
    local_records = tmp_path / "written" / "data.tfrecord"
    local_records.parent.mkdir()
    with tf.io.TFRecordWriter(str(local_records)) as writer:
        for record in records:
            writer.write(record)
    vocabulary = [f"token-{i}" for i in range(150_000)]  # > 1 MB, past TextFileInitializer's buffer
    artifact = f"s3://{bucket}/pipeline_root/Transform/u/transform_graph"
    storage.write_bytes(f"{artifact}/data.tfrecord", local_records.read_bytes())
    storage.write_bytes(f"{artifact}/vocab.txt", "\n".join(vocabulary).encode() + b"\n")
    assert local_records.stat().st_size > 10 * 1024 * 1024

    staged = local_path(artifact, str(tmp_path / "launcher"))
    download(artifact, Path(staged))

    read_back = [r.numpy() for r in tf.data.TFRecordDataset(f"{staged}/data.tfrecord")]
    assert read_back == records
    table = tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(
            f"{staged}/vocab.txt",
            key_dtype=tf.string,
            key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
            value_dtype=tf.int64,
            value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
        ),
        default_value=-1,
    )
    assert int(table.size()) == len(vocabulary)
    probe = tf.constant(["token-0", "token-149999", "missing"])
    assert table.lookup(probe).numpy().tolist() == [0, 149_999, -1]
