"""Object-storage helpers: `s3://`, `gs://` and local paths behind one set of calls.

Beam is imported on first use (`beam_filesystems`), not with this module: `s3://` objects are
listed, read and written through boto3 and local files through Python's own calls (path_globs.py
keeps Beam's glob rules), so a run that only checks for new data, and a Kubeflow step that works
on its local artifact copies without Beam, never pay Beam's import (about 2 s). Beam serves
`gs://` and streamed reads of `s3://` objects.

Beam reads S3 through boto3, which takes its endpoint and credentials from the environment
(`AWS_ENDPOINT_URL_S3`, `AWS_ACCESS_KEY_ID`, ...): nothing secret is passed as an argument, so
nothing secret lands in MLMD, logs or a compiled spec. TensorFlow's own `s3://` client is not used
here (see README.md, section 'Object storage notes': its reads are broken against SeaweedFS).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shutil
import sys
import time
from typing import NamedTuple

from boto3.s3.transfer import TransferConfig

from components.base import path_globs

# Re-exported: callers catch storage.StorageError and ask storage.unreachable(error).
from components.base.store_errors import StorageError, store_error, unreachable

_BEAM_READY = []  # [True] once beam_filesystems() has set Beam's file systems up


def beam_filesystems():
    """Beam's FileSystems, imported and set up on the first call: options (its S3 client refuses
    to start without), and the three fixes below. Every process that runs a step calls it before
    its first read or write (components/steps/__init__.py), so TFX's and Beam's own S3 calls have
    the fixes too."""
    from apache_beam.io.filesystems import FileSystems

    if not _BEAM_READY:
        from apache_beam.options.pipeline_options import PipelineOptions

        if FileSystems._pipeline_options is None:
            FileSystems.set_options(PipelineOptions([]))
        _reuse_boto3_clients()
        _no_long_retries_without_an_answer()
        _anonymous_towards_a_gcs_emulator()
        _BEAM_READY.append(True)
    return FileSystems


def _uncompressed():
    from apache_beam.io.filesystem import CompressionTypes

    return CompressionTypes.UNCOMPRESSED


def _reuse_boto3_clients() -> None:
    """Beam builds a new boto3 session and S3 client for every FileSystems call (two for a
    match): about 0.4 s of CPU each, 95 % of a listing's time against a local store. A boto3
    client is thread-safe and depends only on its settings and the AWS_* environment it was
    built in, so one client per such key is kept and shared."""
    from apache_beam.io.aws.clients.s3 import boto3_client
    from apache_beam.options.pipeline_options import PipelineOptions

    if getattr(boto3_client.Client, "_reused", False) or boto3_client.boto3 is None:
        return
    build = boto3_client.Client.__init__
    clients: dict = {}

    def __init__(self, options):
        settings = options.get_all_options() if isinstance(options, PipelineOptions) else options
        environment = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        key = repr((os.getpid(),  # a forked child must not share the parent's sockets
                    sorted((k, str(v)) for k, v in settings.items() if k.startswith("s3_")),
                    sorted(environment.items())))  # fmt: skip
        if key not in clients:
            build(self, options)
            clients[key] = self.client
        self.client = clients[key]

    boto3_client.Client.__init__ = __init__
    boto3_client.Client._reused = True


def _no_long_retries_without_an_answer() -> None:
    """Beam retries an S3 call 7 times, waiting from 5 s and doubling (about 10 minutes), when
    boto3 got no answer (its S3ClientError then has no status code): a store that refused
    connections held the Pusher silent for 527 s. boto3 has retried such a call already, within
    seconds (legacy mode: 5 attempts), so Beam's retries are kept for answers that ask for them
    (5xx, throttling, 408), each announced on the console, and dropped for no answer at all. Beam
    binds a filter where it decorates a method, so each decorated method is decorated again from
    the function it wraps (functools.wraps keeps it as `__wrapped__`)."""
    from apache_beam.io.aws import s3io
    from apache_beam.io.aws.clients.s3 import boto3_client
    from apache_beam.utils import retry

    if getattr(retry, "_answer_required", False):
        return

    def unless_answerless(original):
        def retry_filter(error: BaseException) -> bool:
            if unreachable(error) or not original(error):
                return False
            from components.base import console  # here: storage stays importable on its own

            answer = f"{getattr(error, 'code', '')} {getattr(error, 'message', error)}".strip()
            console.say(f"  the object store answered {answer}: retrying with Beam's backoff "
                        "(5 s, doubling; 7 tries)")  # fmt: skip
            return True

        return retry_filter

    timeout_filter = retry.retry_on_server_errors_and_timeout_filter
    retry.retry_on_server_errors_and_timeout_filter = unless_answerless(timeout_filter)  # listing
    decorated = [
        (s3io.S3IO, ("copy", "delete", "_delete_minibatch", "_s3_object"), timeout_filter),
        (s3io.S3Downloader, ("_get_object_metadata",), timeout_filter),
        (boto3_client.Client, ("get_range",), retry.retry_on_server_errors_filter),
    ]
    for owner, names, original in decorated:
        for name in names:
            function = getattr(getattr(owner, name, None), "__wrapped__", None)
            if function is not None:
                redecorate = retry.with_exponential_backoff(
                    retry_filter=unless_answerless(original)
                )
                setattr(owner, name, redecorate(function))
    retry._answer_required = True


def _anonymous_towards_a_gcs_emulator() -> None:
    """With `STORAGE_EMULATOR_HOST` set (a GCS emulator: gcp-storage-emulator, fake-gcs-server),
    Beam's `gs://` client connects anonymously, as google-cloud-storage does on its own there.
    Beam would otherwise look for Google's default credentials first: without any it retries for
    about 24 s in every process (4 tries from 2 s, doubling), and with some it would send a real
    Google token to the emulator's endpoint. Beam keeps the credentials it found once per process;
    this records "none" in that place before the first `gs://` call."""
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return
    try:
        from apache_beam.internal.gcp import auth
    except ImportError:  # Beam without its gcp extra: no gs:// at all
        return
    with auth._Credentials._credentials_lock:
        auth._Credentials._credentials = None
        auth._Credentials._credentials_init = True


_MiB = 1024 * 1024
# copy_tree streams every file: nothing holds a whole file in memory, and no object goes up in one
# PUT (S3 caps a single PUT at 5 GB). Through boto3's managed transfer, a file of at least
# _COPY_CHUNK_BYTES goes up as a multipart upload of parts that size (S3's minimum part is 5 MiB);
# a smaller one, an empty file included, in a single PUT (Beam's multipart upload cannot write an
# empty object to SeaweedFS). s3transfer reads each part into memory before it sends it, up to
# max_in_memory_upload_chunks parts at a time plus the one being read, so a copy holds about
# 8 MiB x (2 + 1) = 24 MiB whatever the file's size; its defaults (10 threads, 10 parts in memory)
# would hold 88 MiB. "classic" keeps the CRT transfer client, which ignores these limits, out even
# where awscrt is installed.
_COPY_CHUNK_BYTES = 8 * _MiB
_COPY_BUFFER_BYTES = _MiB  # read and write size of a copy to a non-S3 destination
_TRANSFER_CONFIG = TransferConfig(
    multipart_threshold=_COPY_CHUNK_BYTES,
    multipart_chunksize=_COPY_CHUNK_BYTES,
    max_concurrency=2,
    use_threads=True,
    preferred_transfer_client="classic",
)
_TRANSFER_CONFIG.max_in_memory_upload_chunks = 2  # s3transfer's option; boto3's __init__ lacks it


def answered_retries(call, tries: int = 4):
    """`call()`, again after 0.5, 1 and 2 s while the store answers with an error that asks for
    a retry (5xx, 408, 429, SlowDown), as Beam's S3 client did for the reads and listings that
    now go through boto3 (it waited from 5 s, doubling); no answer at all fails at once (boto3
    has retried that already)."""
    for attempt in range(tries):
        try:
            return call()
        except Exception as e:
            response = getattr(e, "response", None) or {}
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            code = response.get("Error", {}).get("Code")
            if attempt == tries - 1 or not (status >= 500 or status in (408, 429)
                                            or code == "SlowDown"):  # fmt: skip
                raise
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def join(*parts: str) -> str:
    return posixpath.join(*parts) if "://" in parts[0] else os.path.join(*parts)


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
        if pattern.startswith("s3://"):
            from components.base.object_store import s3_client

            found = answered_retries(lambda: path_globs.match_s3(s3_client(), pattern))
            return [FileInfo(*info) for info in found]
        if "://" not in pattern:
            return [FileInfo(*found) for found in path_globs.match_local(pattern)]
        result = beam_filesystems().match([pattern])[0]
    except Exception as e:  # Beam wraps boto3 errors in several exception types
        raise store_error(
            f"cannot list {pattern}",
            e,
            ". Check that the object store is running and that "
            "AWS_ENDPOINT_URL_S3 / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are set.",
        ) from e
    infos = (
        FileInfo(m.path, m.size_in_bytes, m.last_updated_in_seconds) for m in result.metadata_list
    )
    return sorted(infos)


def list_files(pattern: str) -> list[str]:
    return [info.path for info in list_file_infos(pattern)]


def content_tags(folder: str) -> dict[str, str]:
    """A tag per file under `folder` that changes when its content does: the object's ETag on S3
    (an MD5 of the content, or of its parts for a multipart upload), a SHA-256 of the content
    elsewhere. Unlike sizes and times, tags stay the same when identical data is uploaded again."""
    folder = folder.rstrip("/") + "/"
    if not folder.startswith("s3://"):
        tags = {}
        for path in list_files(folder + "**"):
            digest = hashlib.sha256()
            with (
                open(path, "rb")
                if "://" not in path
                else beam_filesystems().open(path, compression_type=_uncompressed()) as f
            ):
                for block in iter(lambda: f.read(_MiB), b""):
                    digest.update(block)
            tags[path] = digest.hexdigest()
        return tags
    from components.base.object_store import s3_client

    bucket, prefix = split_s3(folder)
    tags = {}
    try:
        for page in (
            s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        ):
            for item in page.get("Contents", []):
                tags[f"s3://{bucket}/{item['Key']}"] = item["ETag"].strip('"')
    except Exception as e:
        raise store_error(f"cannot list {folder}", e) from e
    return tags


def check_reachable(path: str) -> None:
    """Fails within seconds, naming endpoint and bucket, when an `s3://` path's store does not
    answer: Beam's own client retries with backoff for minutes before it gives up."""
    if not path.startswith("s3://"):
        return
    from components.base.object_store import s3_client

    bucket, key = split_s3(path)
    prefix = key.strip("/") + "/" if key.strip("/") else ""
    client = s3_client()
    try:
        # A list inside the path, not HeadBucket: credentials limited to a namespace's prefix
        # (kubeflow/object-store-policy.json) may list that prefix but not the bucket's head.
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except Exception as e:
        code = getattr(e, "response", {}).get("Error", {}).get("Code")
        if code == "AccessDenied":
            raise StorageError(
                f"cannot reach bucket {bucket!r} of {path} at {client.meta.endpoint_url}: the "
                f"credentials in AWS_ACCESS_KEY_ID may not list s3://{bucket}/{prefix}; the "
                "store's policy for them must allow that prefix (kubeflow/object-store-policy.json)"
            ) from e
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


def open_stream(path: str):
    """`path` opened for reading as a stream, decompressed when its name says so (`.gz`, and on
    other than local paths Beam's other compressions)."""
    name = path.lower()  # Beam's CompressionTypes.detect_compression_type lowercases too
    if "://" not in path and not re.search(r"\.(bz2|deflate|zst|zstd|lzma|xz)$", name):
        import gzip

        return gzip.open(path, "rb") if name.endswith(".gz") else open(path, "rb")  # noqa: SIM115
    from apache_beam.io.filesystem import CompressionTypes

    try:
        return beam_filesystems().open(path, compression_type=CompressionTypes.AUTO)
    except Exception as e:  # Beam wraps boto3 errors in several exception types
        raise store_error(f"cannot read {path}", e) from e


def read_bytes(path: str) -> bytes:
    """The object's bytes. A missing object raises an OSError (FileNotFoundError on S3, Beam's
    elsewhere); a store that does not answer, a StorageError naming its endpoint."""
    if path.startswith("s3://"):
        return read_object(path)
    if "://" not in path:
        with open(path, "rb") as f:
            return f.read()
    try:
        with beam_filesystems().open(path, compression_type=_uncompressed()) as f:
            return f.read()
    except Exception as e:
        if unreachable(e):
            raise store_error(f"cannot read {path}", e) from e
        raise


def read_object(path: str) -> bytes:
    """A whole object in one request, for many small ones (ExampleGen's images): on S3 one GET,
    where Beam makes a HEAD and ranged GETs. FileNotFoundError when the object does not exist; a
    StorageError naming the endpoint when the store does not answer."""
    if not path.startswith("s3://"):
        return read_bytes(path)
    from components.base.object_store import s3_client

    bucket, key = split_s3(path)
    try:
        return answered_retries(
            lambda: s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
        )
    except Exception as e:
        code = getattr(e, "response", {}).get("Error", {}).get("Code")
        if code in ("NoSuchKey", "404"):
            raise FileNotFoundError(f"no object {path}") from e
        raise store_error(f"cannot read {path}", e) from e


def write_bytes(path: str, data: bytes) -> None:
    """Writes one object. S3 objects go up in a single PUT: Beam's multipart upload cannot
    write an empty object to SeaweedFS, and a single PUT never leaves a partial object behind.
    A local file is written beside its place and renamed over it, for the same reason (a reader
    such as TF Serving polling a config file never sees it half-written)."""
    if path.startswith("s3://"):
        from components.base.object_store import s3_client

        bucket, key = split_s3(path)
        try:
            s3_client().put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as e:
            raise store_error(f"cannot write {path}", e) from e
        return
    if "://" not in path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)
        return
    with beam_filesystems().create(path, compression_type=_uncompressed()) as f:
        f.write(data)


def create_exclusive(path: str, data: bytes) -> bool:
    """Writes one object only if none exists at `path`, in one step no other writer can
    interleave with: True when this call created it, False when it was already there (written by
    another writer, whatever its content). S3 and SeaweedFS: a PUT with `If-None-Match: *`
    (refused with 412 PreconditionFailed, AWS S3 since 2024-08, SeaweedFS 4.48 checked); GCS: an
    upload with `ifGenerationMatch=0`; local disk: a complete temporary file hard-linked into
    place (link(2) fails when the name exists). Beam's file systems have no conditional write."""
    if path.startswith("s3://"):
        from components.base.object_store import s3_client

        bucket, key = split_s3(path)
        for attempt in range(3):
            try:
                s3_client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
                return True
            except Exception as e:
                code = getattr(e, "response", {}).get("Error", {}).get("Code")
                if code in ("PreconditionFailed", "412"):
                    return False
                # AWS: another conditional write to the key was under way; it asks for a retry.
                if code == "ConditionalRequestConflict" and attempt < 2:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                raise store_error(f"cannot write {path}", e) from e
    if path.startswith("gs://"):
        return _gcs_create_exclusive(path, data)
    if "://" in path:
        raise StorageError(f"cannot write {path} conditionally: only s3://, gs:// and local "
                           "paths are supported")  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.partial"
    with open(partial, "wb") as f:
        f.write(data)
    try:
        os.link(partial, path)
    except FileExistsError:
        return False
    except OSError as e:  # a file system without hard links
        raise StorageError(
            f"cannot create {path} exclusively ({e}): the serving root needs a "
            "file system with hard links, or an object store"
        ) from e
    finally:
        os.unlink(partial)
    return True


def _gcs_create_exclusive(path: str, data: bytes) -> bool:
    from google.api_core import exceptions
    from google.cloud import storage as gcs

    if os.environ.get("STORAGE_EMULATOR_HOST"):  # anonymous there, as Beam is (above)
        from google.auth.credentials import AnonymousCredentials

        client = gcs.Client(project="emulator", credentials=AnonymousCredentials())
    else:
        client = gcs.Client()
    bucket, _, name = path[len("gs://") :].partition("/")
    try:
        client.bucket(bucket).blob(name).upload_from_string(data, if_generation_match=0)
    except exceptions.PreconditionFailed:
        return False
    except Exception as e:
        raise store_error(f"cannot write {path}", e) from e
    return True


def delete_files(paths: list[str]) -> None:
    """Deletes the given files (objects); a missing one is not an error."""
    if not paths:
        return
    local = [path for path in paths if "://" not in path]
    for path in local:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError(f"cannot delete {path}: {e}") from e
    paths = [path for path in paths if "://" in path]
    if not paths:
        return
    try:
        beam_filesystems().delete(paths)
    except Exception as e:  # Beam raises BeamIOError listing each path it could not delete
        if "Not found" in str(e) or "NoSuchKey" in str(e) or "404" in str(e):
            return
        raise StorageError(f"cannot delete {paths[0]} (and {len(paths) - 1} more): {e}") from e


def delete_tree(folder: str) -> int:
    """Deletes every file under `folder` (and, on local disk, the emptied folders); returns how
    many files."""
    files = list_files(folder.rstrip("/") + "/**")
    delete_files(files)
    if "://" not in folder and os.path.isdir(folder):
        shutil.rmtree(folder, ignore_errors=True)
    return len(files)


def _open_source(path: str, client):
    """`path` opened for streaming reads: an `s3://` object as boto3's response body (one GET,
    read as it arrives), anything else through Beam."""
    if path.startswith("s3://"):
        bucket, key = split_s3(path)
        return client.get_object(Bucket=bucket, Key=key)["Body"]
    if "://" not in path:
        return open(path, "rb")  # noqa: SIM115 (the caller's with-block closes it)
    return beam_filesystems().open(path, compression_type=_uncompressed())


def _copy_file(source: str, destination: str, client) -> None:
    """Streams one file; `client` is a boto3 S3 client, or None when neither path is `s3://`.
    Raises StorageError naming both paths."""
    try:
        with _open_source(source, client) as stream:
            if destination.startswith("s3://"):
                bucket, key = split_s3(destination)
                client.upload_fileobj(stream, bucket, key, Config=_TRANSFER_CONFIG)
            elif "://" not in destination:
                os.makedirs(os.path.dirname(os.path.abspath(destination)), exist_ok=True)
                with open(destination, "wb") as out:
                    shutil.copyfileobj(stream, out, _COPY_BUFFER_BYTES)
            else:
                create = beam_filesystems().create
                with create(destination, compression_type=_uncompressed()) as out:
                    shutil.copyfileobj(stream, out, _COPY_BUFFER_BYTES)
    except Exception as e:  # boto3, s3transfer and Beam raise several exception types
        hint = (
            ". Check that the object store is running and that AWS_ENDPOINT_URL_S3 / "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are set."
            if client is not None
            else ""
        )
        raise store_error(f"cannot copy {source} to {destination}", e, hint) from e


def copy_tree(source_dir: str, destination_dir: str, last: str | None = None) -> int:
    """Copies every file under source_dir to destination_dir; returns the number of files.

    Files are streamed one after another (see _TRANSFER_CONFIG), so memory stays bounded whatever
    their size. `last` names a file (relative path) written after all others have completely
    finished, so that a reader that waits for it (TF Serving waits for saved_model.pb) never sees
    a half-copied directory.
    """
    source_dir = source_dir.rstrip("/") + "/"
    files = list_files(source_dir + "**")
    files.sort(key=lambda p: p[len(source_dir) :] == last)
    client = None
    if source_dir.startswith("s3://") or destination_dir.startswith("s3://"):
        from components.base.object_store import s3_client

        client = s3_client()
    for path in files:
        relative = path[len(source_dir) :]
        _copy_file(path, join(destination_dir, relative), client)
    return len(files)


if "apache_beam" in sys.modules:  # a Beam worker, or a process that imported Beam first
    beam_filesystems()
