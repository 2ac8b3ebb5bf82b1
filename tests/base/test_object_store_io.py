"""Bytes that TensorFlow reads after staging from the object store are the bytes written, and
`storage.copy_tree` streams files of any size.

TensorFlow's own `s3://` client returns wrong data or hangs on SeaweedFS for large files and
vocabulary tables (see README.md, section 'Object storage notes'). Nothing here reads `s3://`
through TensorFlow: the Kubeflow launcher (played by tests/stand_ins/kfp_launcher.py) copies
artifacts to local disk, and the project's own IO goes through Beam and boto3. The first test pins
that path with the two cases that broke: a TFRecord file over 10 MB and a vocabulary table read to
its last line. The others pin copy_tree (the pusher's and the baseline's copy of a model): a file
over the multipart threshold goes up in parts without being held in memory, saved_model.pb goes up
last, and an empty file is copied too.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from components.base import object_store as object_store_module
from components.base import path_globs, storage
from components.base.launcher_paths import local_path
from components.base.object_store import s3_client
from tests.stand_ins.kfp_launcher import download


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


MiB = 1024 * 1024


def _write_random_file(path: Path, size: int, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        for start in range(0, size, 4 * MiB):
            f.write(rng.bytes(min(4 * MiB, size - start)))


def _assert_same_bytes(local: Path, bucket: str, key: str) -> None:
    """The object's bytes equal the local file's, compared in chunks (neither is held whole)."""
    body = s3_client().get_object(Bucket=bucket, Key=key)["Body"]
    with open(local, "rb") as f:
        offset = 0
        while chunk := f.read(4 * MiB):
            assert body.read(len(chunk)) == chunk, f"{key} differs after byte {offset}"
            offset += len(chunk)
    assert body.read() == b"", f"{key} is longer than {local}"


def _peak_python_memory(copy, *args, **kwargs) -> tuple[int, int]:
    """(copy's result, the peak of Python's allocations while it ran, in bytes). A copy that
    reads a file whole holds at least the file's size here (bytes objects are traced)."""
    gc.collect()
    tracemalloc.start()
    try:
        result = copy(*args, **kwargs)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _multipart_etag_suffix(size: int) -> str:
    parts = -(-size // storage._COPY_CHUNK_BYTES)
    return f'-{parts}"'


def test_a_file_over_the_multipart_threshold_is_streamed_in_parts(object_store, tmp_path):
    # 16 parts of 8 MiB. Measured peaks: reading the file whole and sending it in one PUT (the
    # old copy) held 130 MiB local->s3 and 287 MiB s3->s3; streaming holds a few parts, 28 MiB
    # local->s3 and 40 MiB s3->s3 (of which ~13 MiB is the botocore session Beam builds for
    # every `s3://` listing).
    size = 128 * MiB
    bucket = object_store.new_bucket("stream")
    source = tmp_path / "model"
    big = "variables/variables.data-00000-of-00001"
    _write_random_file(source / big, size, seed=1)
    storage.list_files(f"s3://{bucket}/**")  # Beam's S3 modules load outside the measurement

    for label, source_dir, destination in [
        ("local->s3", str(source), f"s3://{bucket}/first"),
        ("s3->s3", f"s3://{bucket}/first", f"s3://{bucket}/second"),
    ]:
        count, peak = _peak_python_memory(storage.copy_tree, source_dir, destination)
        assert count == 1
        assert peak < size / 2, f"{label} held {peak / MiB:.0f} MiB for a {size // MiB} MiB file"
        key = f"{storage.split_s3(destination)[1]}/{big}"
        _assert_same_bytes(source / big, bucket, key)
        head = s3_client().head_object(Bucket=bucket, Key=key)
        assert head["ContentLength"] == size
        assert head["ETag"].endswith(_multipart_etag_suffix(size)), (label, head["ETag"])


class _UploadRecorder:
    """Records, in the order they happen, the start and the end of every upload request a
    boto3 client makes: (event, operation, key)."""

    OPERATIONS = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")

    def __init__(self):
        self.events: list[tuple[str, str, str]] = []

    def attach(self, client):
        for operation in self.OPERATIONS:
            # unique_id: s3_client() hands out one client per process, attached once.
            client.meta.events.register(f"before-parameter-build.s3.{operation}", self._start,
                                        unique_id=f"recorder-start-{operation}")  # fmt: skip
            client.meta.events.register(f"after-call.s3.{operation}", self._end,
                                        unique_id=f"recorder-end-{operation}")  # fmt: skip
        return client

    def _start(self, params, model, context, **_):
        context["recorded_key"] = params["Key"]
        self.events.append(("start", model.name, params["Key"]))

    def _end(self, http_response, model, context, **_):
        assert http_response.status_code < 300, (model.name, http_response.status_code)
        self.events.append(("end", model.name, context["recorded_key"]))


def test_saved_model_pb_goes_up_after_every_other_file_has_finished(
    object_store, tmp_path, monkeypatch
):
    bucket = object_store.new_bucket("order")
    source = tmp_path / "model"
    big = "variables/variables.data-00000-of-00001"
    _write_random_file(source / big, 20 * MiB, seed=2)  # 3 parts
    (source / "variables" / "variables.index").write_bytes(b"index")
    (source / "assets").mkdir()
    (source / "assets" / "empty.txt").write_bytes(b"")
    (source / "fingerprint.pb").write_bytes(b"fingerprint")
    (source / "saved_model.pb").write_bytes(b"graph")
    recorder = _UploadRecorder()
    real_client = object_store_module.s3_client
    monkeypatch.setattr(object_store_module, "_CLIENTS", {})  # a client of this test's own
    monkeypatch.setattr(
        object_store_module, "s3_client", lambda *a, **k: recorder.attach(real_client(*a, **k))
    )

    for source_dir, destination in [
        (str(source), f"s3://{bucket}/first"),
        (f"s3://{bucket}/first", f"s3://{bucket}/second"),
    ]:
        recorder.events.clear()
        assert storage.copy_tree(source_dir, destination, last="saved_model.pb") == 5
        prefix = storage.split_s3(destination)[1] + "/"
        events = [(e, op, key[len(prefix) :]) for e, op, key in recorder.events]
        last_file_events = [i for i, (_, _, key) in enumerate(events) if key == "saved_model.pb"]
        other_events = [i for i, (_, _, key) in enumerate(events) if key != "saved_model.pb"]
        assert min(last_file_events) > max(other_events), events
        assert events[-2:] == [
            ("start", "PutObject", "saved_model.pb"),
            ("end", "PutObject", "saved_model.pb"),
        ]
        # The 20 MiB file goes up in 3 parts (at most 2 at a time), not in one PUT.
        big_operations = [op for e, op, key in events if key == big and e == "end"]
        want = ["CreateMultipartUpload", "UploadPart", "UploadPart", "UploadPart"]
        assert big_operations == [*want, "CompleteMultipartUpload"], big_operations
        for relative in ("assets/empty.txt", "variables/variables.index", "fingerprint.pb"):
            assert [op for e, op, key in events if key == relative and e == "end"] == ["PutObject"]

        client = s3_client()
        empty = client.head_object(Bucket=bucket, Key=prefix + "assets/empty.txt")
        assert empty["ContentLength"] == 0
        for relative in ("saved_model.pb", "fingerprint.pb", "variables/variables.index"):
            assert _read_object(bucket, prefix + relative) == (source / relative).read_bytes()
        _assert_same_bytes(source / big, bucket, prefix + big)


def _read_object(bucket: str, key: str) -> bytes:
    return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()


def test_a_nested_tree_is_copied_from_s3_to_local_disk(object_store, tmp_path):
    # Measured peaks: the old copy (whole file in memory) held 158 MiB; streaming holds 15 MiB,
    # of which ~13 MiB is the botocore session Beam builds for the listing.
    size = 64 * MiB
    bucket = object_store.new_bucket("tolocal")
    source = tmp_path / "source"
    files = {
        "saved_model.pb": b"graph",
        "assets/empty.txt": b"",
        "assets/vocabularies/deep/tokens.txt": b"a\nb\n",
        "variables/variables.index": b"index",
    }
    for relative, data in files.items():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_bytes(data)
    big = "variables/variables.data-00000-of-00001"
    _write_random_file(source / big, size, seed=3)
    assert storage.copy_tree(str(source), f"s3://{bucket}/model") == 5
    storage.list_files(f"s3://{bucket}/**")  # Beam's S3 modules load outside the measurement

    destination = tmp_path / "copied"
    count, peak = _peak_python_memory(
        storage.copy_tree, f"s3://{bucket}/model", str(destination), last="saved_model.pb"
    )
    assert count == 5
    assert peak < size / 2, f"s3->local held {peak / MiB:.0f} MiB for a {size // MiB} MiB file"
    copied = sorted(str(p.relative_to(destination)) for p in destination.rglob("*") if p.is_file())
    assert copied == sorted([*files, big])
    for relative, data in files.items():
        assert (destination / relative).read_bytes() == data
    assert (destination / big).stat().st_size == size
    with open(source / big, "rb") as want, open(destination / big, "rb") as got:
        while chunk := want.read(4 * MiB):
            assert got.read(len(chunk)) == chunk


def test_a_failed_copy_names_the_source_and_the_destination(object_store, tmp_path):
    bucket = object_store.new_bucket("fail")
    source = tmp_path / "model"
    source.mkdir()
    (source / "saved_model.pb").write_bytes(b"graph")
    assert storage.copy_tree(str(source), f"s3://{bucket}/model") == 1
    (tmp_path / "a-file").write_bytes(b"")
    for source_dir, destination in [
        (str(source), "s3://x/model"),  # SeaweedFS refuses a one-letter bucket name
        (f"s3://{bucket}/model", str(tmp_path / "a-file" / "model")),  # a folder below a file
    ]:
        with pytest.raises(storage.StorageError) as raised:
            storage.copy_tree(source_dir, destination)
        message = str(raised.value)
        assert storage.join(source_dir, "saved_model.pb") in message
        assert storage.join(destination, "saved_model.pb") in message


# Beam's FileSystems.match rules (apache_beam/io/filesystem.py): "*" within a folder, "**" across,
# "?", "[...]" and "[!...]", a trailing "/" as "/*", a pattern without a glob as one object.
GLOBS = ["{root}/**", "{root}/*", "{root}/", "{root}/a/*.csv", "{root}/a/**", "{root}/[ab]/x?.csv",
         "{root}/a/x1.csv", "{root}/a/missing.csv", "{root}/c*/**", "{root}/a/x[!1].csv",
         "{root}/**.txt", "{root}"]  # fmt: skip


def test_listing_without_beam_finds_what_beams_match_finds(object_store, tmp_path):
    """storage lists `s3://` through boto3 and local paths through os.walk (path_globs.py), so
    that a run with nothing new or a step without Beam never imports Beam: for every kind of
    pattern each finds the files Beam's match finds, with their sizes and times."""
    bucket = object_store.new_bucket("glob")
    keys = ["r/a/x1.csv", "r/a/x2.csv", "r/a/sub/x3.csv", "r/b/x1.csv", "r/c1/d/e.txt",
            "r/top.txt", "r-other/a.csv", "r"]  # fmt: skip
    for i, key in enumerate(keys):
        s3_client().put_object(Bucket=bucket, Key=key, Body=b"x" * (i + 1))
        local = tmp_path / key if key != "r" else tmp_path / "r-file"
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(b"x" * (i + 1))
    beam = storage.beam_filesystems()
    roots = {f"s3://{bucket}/r": lambda p: path_globs.match_s3(s3_client(), p),
             str(tmp_path / "r"): path_globs.match_local}  # fmt: skip
    for root, match in roots.items():
        for glob in GLOBS:
            pattern = glob.format(root=root)
            ours = match(pattern)
            if pattern == root and not root.startswith("s3://"):  # a folder: Beam raises
                assert ours == []
                continue
            beams = sorted((m.path, m.size_in_bytes, m.last_updated_in_seconds)
                           for m in beam.match([pattern])[0].metadata_list)  # fmt: skip
            assert [(p, n) for p, n, _ in ours] == [(p, n) for p, n, _ in beams], pattern
            assert all(abs(a[2] - b[2]) < 1 for a, b in zip(ours, beams, strict=True)), pattern
            assert [info.path for info in storage.list_file_infos(pattern)] == [p for p, *_ in ours]
        assert len(match(f"{root}/**")) == 6  # the test sees files
    # No such bucket: no files (Beam's s3io.list_files breaks on the 404), as before.
    assert storage.list_files("s3://no-such-bucket-here/x/*") == []
    assert beam.match(["s3://no-such-bucket-here/x/*"])[0].metadata_list == []
