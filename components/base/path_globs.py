"""Globs over `s3://` (through boto3) and local paths without Beam, with the semantics of Beam's
FileSystems.match that storage.list_file_infos had when it went through Beam.

Importing Apache Beam costs about 2 s (it pulls in pandas, BigQuery's client and IPython): a run
with nothing new, and a Kubeflow step that only reads and writes its local artifact copies, would
spend much of their time there. Beam's rules (apache_beam/io/filesystem.py, FileSystem.match,
2.59): a pattern ending in "/" gets "*"; without a glob character it is one file (none when
missing); otherwise every file under the pattern's part before its first glob character (on S3
that key prefix; on disk the folder that part names or lies in, walked recursively) is listed and
kept when its whole path matches the pattern (`translate_pattern`: `*` within a folder, `**`
across folders, `?`, `[...]`).
"""

from __future__ import annotations

import os
import re

GLOB_START = re.compile(r"^[^[*?]*")


def translate_pattern(pattern: str) -> str:
    """Beam's FileSystem.translate_pattern (2.59), itself Python 2.7's fnmatch.translate with
    `*` not crossing "/" (PSF license): the regular expression a path must match whole."""
    i, n, res = 0, len(pattern), ""
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if i < n and pattern[i] == "*":
                res, i = res + ".*", i + 1
            else:
                res += r"[^/\\]*"
        elif c == "?":
            res += "."
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                res += r"\["
            else:
                stuff = pattern[i:j].replace("\\", "\\\\")
                i = j + 1
                if stuff[0] == "!":
                    stuff = "^" + stuff[1:]
                elif stuff[0] == "^":
                    stuff = "\\" + stuff
                res = f"{res}[{stuff}]"
        else:
            res += re.escape(c)
    return r"(?ms)" + res + r"\Z"


def match_s3(client, pattern: str) -> list[tuple[str, int, float]]:
    """(path, size in bytes, last modified in seconds) of each object `pattern` matches, sorted;
    boto3's errors (no such bucket, no answer) propagate for the caller to name."""
    if pattern.endswith("/"):
        pattern += "*"
    prefix = GLOB_START.match(pattern).group(0)
    bucket, _, key = prefix[len("s3://") :].partition("/")
    if prefix == pattern:
        try:
            head = client.head_object(Bucket=bucket, Key=key)
        except Exception as e:
            if getattr(e, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return []
            raise
        return [(pattern, head["ContentLength"], head["LastModified"].timestamp())]
    whole = re.compile(translate_pattern(pattern)).match
    found = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            for item in page.get("Contents", []):
                path = f"s3://{bucket}/{item['Key']}"
                if whole(path):
                    found.append((path, item["Size"], item["LastModified"].timestamp()))
    except Exception as e:  # no such bucket: no files, as Beam's s3io.list_files has it (a 404)
        if _status(e) != 404:
            raise
    return sorted(found)


def _status(error: Exception) -> int | None:
    return getattr(error, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")


def match_local(pattern: str) -> list[tuple[str, int, float]]:
    """The same for a local path (Beam's LocalFileSystem: os.walk below the folder, sizes and
    modification times from os.stat); a folder named without a glob matches nothing."""
    if pattern.endswith("/"):
        pattern += "*"
    prefix = GLOB_START.match(pattern).group(0)
    if prefix == pattern:
        if not os.path.isfile(pattern):
            return []
        stat = os.stat(pattern)
        return [(pattern, stat.st_size, stat.st_mtime)]
    folder = prefix if prefix.endswith("/") else os.path.dirname(prefix)
    whole = re.compile(translate_pattern(pattern)).match
    found = []
    for dirpath, _, files in os.walk(folder or "."):
        for name in files:
            path = os.path.join(dirpath, name)
            if whole(path):
                try:
                    stat = os.stat(path)
                except FileNotFoundError:  # renamed or removed while listed (Beam skips it too)
                    continue
                found.append((path, stat.st_size, stat.st_mtime))
    return sorted(found)
