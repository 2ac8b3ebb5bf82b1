"""A span's CSV files as uploads really come, checked so that what is ambiguous stops clearly.

Accepted: UTF-8 with or without a byte-order mark (or any declared Python codec), CRLF line
endings, quoted fields holding commas and newlines, gzip-compressed `.csv.gz` files, and columns
in another order than the first file's. Refused with a CsvInputError naming the file, the line
and the fix: undecodable text, a cut-off last row, a binary or compressed file under a `.csv`
name, a repeated header, an empty file, a header without rows, and differing column sets.
Files are read streaming, a chunk at a time, both by the check and by the Beam read.
"""

from __future__ import annotations

import codecs
import collections
import csv
import gzip
import itertools
import zlib
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes

from components.base import storage
from components.base.spans import ExampleGenInputError

_CHUNK = 1 << 20  # bytes read at a time: a file's reader holds a few MiB, whatever its size
_MAX_LINE = 1 << 24  # characters; a longer "line" is no CSV text and must not fill the memory
_GZIP = b"\x1f\x8b"
# Leading bytes of files that are not text, so that they are named rather than failing to decode.
_MAGIC = {
    _GZIP: "gzip-compressed",
    b"PK\x03\x04": "a zip archive (or an .xlsx workbook)",
    b"BZh": "bzip2-compressed",
    b"\xfd7zXZ\x00": "xz-compressed",
    b"\x28\xb5\x2f\xfd": "zstd-compressed",
    b"PAR1": "a Parquet file",
}
_AS_TEXT = "Upload the data as CSV text (.csv, or .csv.gz compressed with gzip)"
_AGAIN = "The upload was probably cut short: upload the file again"
_REUPLOAD = "Remove it, or upload it again with its header and rows"
_ENCODING_HINT = (
    "If the file is written in another encoding, declare it with the config field "
    "input_encoding (any Python codec name), e.g. `--set input_encoding=latin-1` or "
    "PIPELINE_INPUT_ENCODING=latin-1"
)


class CsvInputError(ExampleGenInputError):
    """A CSV file cannot be read unambiguously; the message names the file, line and fix."""


def _error(path: str, line: int, problem: str, fix: str) -> CsvInputError:
    return CsvInputError(f"{path}{f', line {line}' if line else ''}: {problem}. {fix}.")


class _Lines:
    """A file's decoded text lines, each with its line ending. Iterating reads it once more;
    `number` counts the lines handed out, for messages."""

    def __init__(self, path: str, encoding: str):
        self.path, self.encoding = path, encoding
        self.number, self.ends_with_newline = 0, True

    def __iter__(self) -> Iterator[str]:
        self.number = 0
        # Through storage: Beam's file systems with its fixes (components/base/storage.py).
        files = storage.beam_filesystems()
        with files.open(self.path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
            stream = self._uncompressed(raw)
            decoder = codecs.getincrementaldecoder(self.encoding)("strict")
            pending, first = "", True
            while True:
                chunk = self._read(stream)
                try:
                    text = decoder.decode(chunk, final=not chunk)
                except UnicodeDecodeError as e:
                    before = pending + e.object[: e.start].decode(self.encoding, "replace")
                    bad = e.object[e.start : e.end]
                    problem = f"is not {self.encoding} text ({e.reason}: {bad!r})"
                    raise _error(self.path, self._line(before), problem, _ENCODING_HINT) from e
                if first and text:  # a byte-order mark is no part of the first column's name
                    text, first = text.removeprefix("\ufeff"), False
                # Text never holds NUL; binary files (and UTF-16 read as UTF-8) do.
                if "\x00" in text:
                    line = self._line(pending + text[: text.index("\x00")])
                    problem = "holds NUL bytes: it is binary, not CSV text"
                    raise _error(self.path, line, problem, f"{_AS_TEXT}. {_ENCODING_HINT}")
                *lines, pending = (pending + text).split("\n")
                for line in lines:
                    self.number += 1
                    yield line + "\n"
                if len(pending) > _MAX_LINE:
                    problem = f"holds a line longer than {_MAX_LINE} characters"
                    raise _error(self.path, self.number + 1, problem, _AS_TEXT)
                if not chunk:
                    break
        self.ends_with_newline = not pending
        if pending:
            self.number += 1
            yield pending

    def _line(self, text_before: str) -> int:
        return self.number + text_before.count("\n") + 1

    def _uncompressed(self, raw):
        """`raw`, gzip-decompressed for a `.gz` name, once its leading bytes show that it is
        what its name says."""
        head = raw.read(8)
        raw.seek(0)
        if not head:
            raise _error(self.path, 0, "is empty (0 bytes)", _REUPLOAD)
        stream, fix = raw, "Rename it to .csv.gz (those are decompressed), or upload plain CSV"
        if self.path.endswith(".gz"):
            if not head.startswith(_GZIP):
                fix = "Rename it to .csv if it is plain CSV text, or compress it with gzip"
                raise _error(self.path, 0, "is named .gz but is not gzip-compressed", fix)
            stream, fix = gzip.GzipFile(fileobj=raw, mode="rb"), "Compress the CSV text itself"
            head = self._read(stream, peek=True)
            if not head:
                raise _error(self.path, 0, "holds nothing once decompressed", _REUPLOAD)
        if head[:2] in (b"\xff\xfe", b"\xfe\xff") and "16" not in codecs.lookup(self.encoding).name:
            fix = "Declare it with input_encoding, e.g. `--set input_encoding=utf-16`"
            raise _error(
                self.path, 0, "is UTF-16 text (it starts with a UTF-16 byte-order mark)", fix
            )
        for magic, kind in _MAGIC.items():
            if head.startswith(magic):
                fix = fix if magic == _GZIP else _AS_TEXT
                raise _error(self.path, 0, f"is {kind}, not CSV text", fix)
        return stream

    def _read(self, stream, peek: bool = False) -> bytes:
        try:
            # read1: what one compressed block holds, so that a cut names the lines before it.
            if isinstance(stream, gzip.GzipFile):
                return stream.peek(8)[:8] if peek else stream.read1(_CHUNK)
            return stream.read(_CHUNK)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            problem = f"its gzip data is cut off or corrupt after line {self.number} ({e})"
            raise _error(self.path, 0, problem, _AGAIN) from e


def _records(path: str, encoding: str) -> Iterator:
    """The file's header (names stripped of spaces), then its data rows as (line, row), checked
    as they stream by. Each row is handed out once the next one is read, so that the last is
    checked apart."""
    lines = _Lines(path, encoding)
    reader = csv.reader(lines, strict=True)  # strict: a quote still open at the end is an error
    header: list[str] = []
    last: list[str] | None = None
    read = last_line = 0
    try:
        for row in reader:
            line, read = read + 1, reader.line_num  # the row spans lines `line`..`read`
            if not row:  # blank lines carry nothing; tfx skips them too
                continue
            if not header:
                header = _checked_header(path, line, row)
                yield header
            elif row[0].strip() in header and sorted(c.strip() for c in row) == sorted(header):
                problem = "repeats the header inside the file"
                raise _error(path, line, problem, "Were files concatenated? Remove that line")
            else:
                if last is not None:
                    _check_width(path, last_line, last, header)
                    yield last_line, last
                last, last_line = row, line
    except csv.Error as e:
        problem = "ends inside a quoted field" if "end of data" in str(e) else "is not valid CSV"
        fix = f'{_AGAIN}; if it is complete, close the quote or double it ("") inside a value'
        raise _error(path, read + 1, f"{problem} ({e})", fix) from e
    if not header or last is None:
        raise _error(path, 0, "has a header but no data rows" if header else "is blank", _REUPLOAD)
    cut = [f"it has {len(last)} of the header's {len(header)} fields"] * (len(last) < len(header))
    cut += ["the file does not end with a newline"] * (not lines.ends_with_newline)
    if cut:
        fix = f"{_AGAIN}; if the row is complete, end the file with a newline"
        raise _error(path, last_line, f"the last row is cut off: {' and '.join(cut)}", fix)
    _check_width(path, last_line, last, header)
    yield last_line, last


def _checked_header(path: str, line: int, row: list[str]) -> list[str]:
    header = [name.strip() for name in row]
    repeated = sorted(name for name, n in collections.Counter(header).items() if n > 1)
    if "" in header or repeated:
        problem = f"the header repeats {repeated}" if repeated else "a column has no name"
        fix = "Give every column one unique name (a pandas export needs index=False)"
        raise _error(path, line, problem, fix)
    return header


def _check_width(path: str, line: int, row: list[str], header: list[str]) -> None:
    if len(row) != len(header):
        problem = f"the row has {len(row)} fields but the header has {len(header)}"
        raise _error(path, line, problem, "Quote values that hold commas, or fix the row")


def _check_same_columns(first: str, columns: list[str], path: str, header: list[str]) -> None:
    missing, extra = sorted(set(columns) - set(header)), sorted(set(header) - set(columns))
    if missing or extra:
        raise CsvInputError(
            f"{path} has other columns than {first}: it lacks {missing} and has {extra} "
            "besides. All files of a span must share one header (in any order): write them "
            "with the same columns, or put the odd file in a span of its own."
        )


def check_csv_files(paths: list[str], encoding: str = "utf-8", rows: bool = True) -> list[str]:
    """Reads every file once, start to end, and returns the first file's header: the column
    order the examples get. Raises CsvInputError on the first problem found. `rows=False`
    checks only up to each file's header (its rows are checked as they are read)."""
    try:
        codecs.lookup(encoding)
    except LookupError as e:
        hint = "set input_encoding to a Python codec name (utf-8, latin-1, cp1252, utf-16, ...)"
        raise CsvInputError(f"unknown encoding {encoding!r}: {hint}.") from e
    if not paths:
        raise CsvInputError("no CSV files to check: write the span's .csv or .csv.gz files.")
    columns: list[str] = []
    for path in paths:
        records = _records(path, encoding)
        try:
            header = next(records)
            columns = columns or header
            _check_same_columns(paths[0], columns, path, header)
            if rows:
                collections.deque(records, maxlen=0)  # every row, for the checks; none kept
        finally:
            records.close()
    return columns


def first_rows(path: str, limit: int, encoding: str = "utf-8") -> list[dict[str, str]]:
    """The first `limit` data rows of a span's file as ExampleGen reads them (gzip, encoding, a
    byte-order mark, quoting), by column name: what the sample predictions and warm-up use, so
    that what a run trained on is what it is shown on."""
    records = _records(path, encoding)
    try:
        header = next(records)
        return [dict(zip(header, row, strict=True))
                for _, row in itertools.islice(records, limit)]  # fmt: skip
    finally:
        records.close()


def numbered_rows(path: str, columns: list[str], encoding: str = "utf-8") -> Iterator:
    """Every data row of the file as (line, cells in `columns`' order), checked as
    check_csv_files checks, so that a file replaced since that check still fails clearly."""
    records = _records(path, encoding)
    header = next(records)
    checked = "the files checked before reading (was it replaced since?)"
    _check_same_columns(checked, columns, path, header)
    order = [header.index(name) for name in columns]
    if order == list(range(len(columns))):
        yield from records
    else:
        for line, row in records:
            yield line, [row[i] for i in order]


@beam.typehints.with_input_types(str)
@beam.typehints.with_output_types(list[bytes])
class _ReadRows(beam.DoFn):
    def __init__(self, columns: list[str], encoding: str):
        self._columns, self._encoding = columns, encoding

    def process(self, path: str) -> Iterator[list[bytes]]:
        for _, row in numbered_rows(path, self._columns, self._encoding):
            yield [cell.encode() for cell in row]  # as tfx_bsl's ParseCSVLine makes them


class ReadCsvRecords(beam.PTransform):
    """Every data row of `files` as a list of UTF-8 cells in `columns`' order: what tfx's
    ReadFromText + ParseCSVLine + Keys feed ColumnTypeInferrer (without blank lines). It checks
    as check_csv_files does, so that a file replaced since that check still fails clearly."""

    def __init__(self, files: list[str], columns: list[str], encoding: str = "utf-8"):
        super().__init__()
        self._files, self._columns, self._encoding = list(files), list(columns), encoding

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        reader = _ReadRows(self._columns, self._encoding)
        return pbegin | "Files" >> beam.Create(self._files) | "ReadRows" >> beam.ParDo(reader)
