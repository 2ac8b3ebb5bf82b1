"""Object-storage helpers on Beam's FileSystems: `s3://`, `gs://` and local paths, one code path.

Beam reads S3 through boto3, which takes its endpoint and credentials from the environment
(`AWS_ENDPOINT_URL_S3`, `AWS_ACCESS_KEY_ID`, ...): nothing secret is passed as an argument, so
nothing secret lands in MLMD, logs or a compiled spec. TensorFlow's own `s3://` client is not used
here (see STACK.md: its reads are broken against SeaweedFS).
"""

from __future__ import annotations

import posixpath
import re
from typing import NamedTuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.errors import ActionableError

if FileSystems._pipeline_options is None:  # Beam's S3 client refuses to start without options
    FileSystems.set_options(PipelineOptions([]))


class StorageError(ActionableError, RuntimeError):
    """An object store could not be reached or answered with an error."""


def join(*parts: str) -> str:
    return posixpath.join(*parts) if "://" in parts[0] else FileSystems.join(*parts)


def split_s3(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` -> ("bucket", "some/key")."""
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


class FileInfo(NamedTuple):
    path: str
    size: int
    mtime: float


def list_file_infos(pattern: str) -> list[FileInfo]:
    """Files matching a glob (`*` stays within a folder, `**` crosses folders), sorted by path.

    Raises StorageError naming the pattern when the store cannot be read.
    """
    try:
        result = FileSystems.match([pattern])[0]
    except Exception as e:  # Beam wraps boto3 errors in several exception types
        raise StorageError(
            f"cannot list {pattern}: {e}. Check that the object store is running and that "
            "AWS_ENDPOINT_URL_S3 / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are set."
        ) from e
    infos = (
        FileInfo(m.path, m.size_in_bytes, m.last_updated_in_seconds) for m in result.metadata_list
    )
    return sorted(infos)


def list_files(pattern: str) -> list[str]:
    return [info.path for info in list_file_infos(pattern)]


def check_reachable(path: str) -> None:
    """Fails within seconds, naming endpoint and bucket, when an `s3://` path's store does not
    answer: Beam's own client retries with backoff for minutes before it gives up."""
    if not path.startswith("s3://"):
        return
    from pipelines.object_store import s3_client

    bucket, _ = split_s3(path)
    client = s3_client()
    try:
        client.head_bucket(Bucket=bucket)
    except Exception as e:
        raise StorageError(
            f"cannot reach bucket {bucket!r} of {path} at {client.meta.endpoint_url}: {e}. "
            "Check that the object store runs, the bucket exists, and AWS_ENDPOINT_URL_S3, "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are set for it."
        ) from e


def numbered_children(parent: str, prefix: str = "") -> dict[int, str]:
    """Maps N to the child folder `<parent>/<prefix>N/` for every such folder that holds files."""
    check_reachable(parent)
    found: dict[int, str] = {}
    pattern = re.compile(re.escape(parent.rstrip("/") + "/" + prefix) + r"(\d+)/")
    for path in list_files(parent.rstrip("/") + "/" + prefix + "*/**"):
        match = pattern.match(path)
        if match:
            found[int(match.group(1))] = match.group(0)
    return found


def read_bytes(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def write_bytes(path: str, data: bytes) -> None:
    """Writes one object. S3 objects go up in a single PUT: Beam's multipart upload cannot
    write an empty object to SeaweedFS, and a single PUT never leaves a partial object behind."""
    if path.startswith("s3://"):
        from pipelines.object_store import s3_client

        bucket, key = split_s3(path)
        try:
            s3_client().put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as e:
            raise StorageError(f"cannot write {path}: {e}") from e
        return
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(data)


def copy_tree(source_dir: str, destination_dir: str, last: str | None = None) -> int:
    """Copies every file under source_dir to destination_dir; returns the number of files.

    `last` names a file (relative path) written after all others, so that a reader that waits for
    it (TF Serving waits for saved_model.pb) never sees a half-copied directory.
    """
    source_dir = source_dir.rstrip("/") + "/"
    files = list_files(source_dir + "**")
    files.sort(key=lambda p: p[len(source_dir) :] == last)
    for path in files:
        relative = path[len(source_dir) :]
        write_bytes(join(destination_dir, relative), read_bytes(path))
    return len(files)
