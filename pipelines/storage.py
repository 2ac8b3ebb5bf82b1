"""Object-storage helpers on Beam's FileSystems, so `s3://`, `gs://` and local paths share one code path.

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

if FileSystems._pipeline_options is None:  # Beam's S3 client refuses to start without options
    FileSystems.set_options(PipelineOptions([]))


class StorageError(RuntimeError):
    """An object store could not be reached or answered with an error."""


def join(*parts: str) -> str:
    return posixpath.join(*parts) if "://" in parts[0] else FileSystems.join(*parts)


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
    infos = (FileInfo(m.path, m.size_in_bytes, m.last_updated_in_seconds) for m in result.metadata_list)
    return sorted(infos)


def list_files(pattern: str) -> list[str]:
    return [info.path for info in list_file_infos(pattern)]


def numbered_children(parent: str, prefix: str = "") -> dict[int, str]:
    """Maps N to the child folder `<parent>/<prefix>N/` for every such folder that holds files."""
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
