"""CSV input as uploads really come (components/steps/csv_input.py), on a real SeaweedFS server and
on
local disk.

Accepted: a UTF-8 file with a byte-order mark and CRLF line endings, a file with its columns in
another order, a gzip-compressed `.csv.gz` file and a declared latin-1 file all give, read by
`ReadCsvRecords` on Beam's DirectRunner, the same rows as the plain file, quoted commas and
newlines included, and `CsvFilesToExample` turns them into the same tf.Examples as tfx's stock
decoding of the plain rows. Refused, each with a message naming the file, the line where it is
known, the problem and the fix: undecodable text, a cut-off last row, binary or compressed data
under a `.csv` name, a repeated header, an empty file, a header without rows, differing column
sets, and a file that changed between the check and the Beam read.

The one-pass read typed by the schema (components/steps/csv_examples.py, ExampleGen's path for a
span the curated schema covers) writes the same examples as the stock conversion, split by row
whatever the column order, refuses every file above with the same message, and stops with
SchemaTypeMismatch, naming the line and column, where a cell does not fit the schema's type.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import zipfile

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx.components.example_gen.csv_example_gen import executor as csv_executor
from tfx_bsl.coders import csv_decoder

from components.base import storage
from components.base.config import REPO_ROOT
from components.base.errors import ActionableError, actionable_cause
from components.steps import csv_examples
from components.steps.csv_input import CsvInputError, ReadCsvRecords, check_csv_files
from components.steps.example_gen import CsvFilesToExample, cause_of
from components.use_cases.taxi import data as taxi_data
from components.use_cases.taxi.features import RAW_COLUMNS

ENCODING_HINT = ("input_encoding", "--set input_encoding=latin-1", "PIPELINE_INPUT_ENCODING")
CUT_OFF = ("the last row is cut off", "upload the file again")
# A value with a quote, a comma and a newline: row 0 spans lines 2 and 3 of a written file.
AWKWARD = 'Taxi "Nord", Köln\nZweigstelle'


@pytest.fixture(params=["s3", "local"])
def root(request, tmp_path) -> str:
    """A fresh data root: a bucket on the SeaweedFS server, or a local folder."""
    if request.param == "local":
        return str(tmp_path / "data")
    store = request.getfixturevalue("object_store")
    return f"s3://{store.new_bucket('csv-input')}/data"


def _frame(rows: int = 12, ascii_only: bool = False):
    """Generated trips whose row 0 holds AWKWARD and row 1 "Café Cab" (ö, é -> o, e: ascii_only)."""
    frame = taxi_data.generate_span(rows, span=0)
    frame.loc[0, "company"], frame.loc[1, "company"] = AWKWARD, "Café Cab"
    if ascii_only:
        frame["company"] = frame["company"].str.replace("ö", "o").str.replace("é", "e")
    return frame


def _csv(frame, columns=RAW_COLUMNS, newline: str = "\n") -> str:
    return frame[list(columns)].to_csv(index=False, na_rep="", lineterminator=newline)


def _rows(text: str) -> list[list[bytes]]:
    """The data rows of `text` as tfx_bsl's ParseCSVLine gives them: UTF-8 cells."""
    return [[cell.encode() for cell in row] for row in csv.reader(io.StringIO(text))][1:]


def _write(root: str, name: str, content: bytes) -> str:
    path = storage.join(root, "span-0", name)
    storage.write_bytes(path, content)
    return path


def _example_key(example) -> tuple:
    """A tf.Example as a comparable value (the order of map entries in serialized protos is not
    fixed)."""
    return tuple(sorted((name, str(f)) for name, f in example.features.feature.items()))


def _stock_examples(rows: list[list[bytes]]) -> list:
    """What tfx's CsvExampleGen makes of `rows`: ColumnTypeInferrer, then _ParsedCsvToTfExample."""
    inferrer = csv_decoder.ColumnTypeInferrer(RAW_COLUMNS, skip_blank_lines=True)
    accumulator = inferrer.create_accumulator()
    for row in rows:
        accumulator = inferrer.add_input(accumulator, row)
    infos = inferrer.extract_output(accumulator)
    to_example = csv_executor._ParsedCsvToTfExample()
    return [example for row in rows for example in to_example.process(row, infos)]


# --------------------------------------------------------------------------------------------
# Accepted
# --------------------------------------------------------------------------------------------


def test_bom_crlf_reordered_gzip_and_latin1_files_read_as_the_plain_file(root):
    frame = _frame()
    plain_text = _csv(frame)
    expected = _rows(plain_text)
    assert expected[0][RAW_COLUMNS.index("company")] == AWKWARD.encode()
    reordered_columns = list(reversed(RAW_COLUMNS))
    files = {
        "plain": _write(root, "a-plain.csv", plain_text.encode()),
        "bom-crlf": _write(
            root, "b-bom.csv", b"\xef\xbb\xbf" + _csv(frame, newline="\r\n").encode()
        ),
        "reordered": _write(root, "c-reordered.csv", _csv(frame, reordered_columns).encode()),
        "gzip": _write(root, "d-gzip.csv.gz", gzip.compress(plain_text.encode())),
    }
    latin1 = _write(root, "e-latin1.csv", plain_text.encode("latin-1"))

    assert check_csv_files(list(files.values())) == RAW_COLUMNS
    assert check_csv_files([files["reordered"], files["plain"]]) == reordered_columns
    assert check_csv_files([latin1], encoding="latin-1") == RAW_COLUMNS
    with beam.Pipeline() as pipeline:
        for name, path in files.items():
            rows = pipeline | f"Read {name}" >> ReadCsvRecords([path], RAW_COLUMNS)
            assert_that(rows, equal_to(expected), label=f"Rows of {name}")
        rows = pipeline | "Read latin-1" >> ReadCsvRecords([latin1], RAW_COLUMNS, "latin-1")
        assert_that(rows, equal_to(expected), label="Rows of latin-1")
        rows = pipeline | "Read all" >> ReadCsvRecords(list(files.values()), RAW_COLUMNS)
        assert_that(rows, equal_to(expected * len(files)), label="Rows of all")


def test_example_gen_transform_gives_the_stock_examples_of_the_plain_rows(root):
    frame = _frame()
    plain_text = _csv(frame)
    files = [
        _write(root, "a-plain.csv", plain_text.encode()),
        _write(root, "b-bom.csv", b"\xef\xbb\xbf" + _csv(frame, newline="\r\n").encode()),
        _write(root, "c-reordered.csv", _csv(frame, sorted(RAW_COLUMNS)).encode()),
        _write(root, "d-gzip.csv.gz", gzip.compress(plain_text.encode("utf-8"))),
    ]
    exec_properties = {
        "_resolved_files": files,
        "_resolved_columns": check_csv_files(files, "utf-8"),
        "_input_encoding": "utf-8",
    }
    expected = [_example_key(e) for e in _stock_examples(_rows(plain_text))] * len(files)

    with beam.Pipeline() as pipeline:
        examples = pipeline | CsvFilesToExample(exec_properties, "*")
        assert_that(examples | beam.Map(_example_key), equal_to(expected))


# --------------------------------------------------------------------------------------------
# Refused
# --------------------------------------------------------------------------------------------

# Written files have the header on line 1, row 0 on lines 2-3, and row i on line i + 3.
GOOD = _csv(_frame(5, ascii_only=True))
GOOD_LINES = GOOD.splitlines(keepends=True)
LAST = len(GOOD_LINES)  # 7
LAST_ROW_CUT = GOOD[:-20]  # in the middle of the payment type: fewer fields, no newline
LAST_ROW_SHORT = "".join(GOOD_LINES[:-1]) + ",".join(GOOD_LINES[-1].split(",")[:6]) + "\n"
WITH_NUL = "".join(GOOD_LINES[:5]) + GOOD_LINES[5].replace(",", ",\x00", 1) + GOOD_LINES[6]
UNQUOTED_COMMA = "".join(GOOD_LINES[:3]) + GOOD_LINES[3].replace(",", ",1,", 1) + GOOD_LINES[4]


def _zip(content: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("part.csv", content)
    return buffer.getvalue()


REFUSED = {
    "undecodable": (
        "part.csv",
        GOOD.replace("Cafe Cab", "Café Cab", 1).encode("latin-1"),
        ("line 4: is not utf-8 text", *ENCODING_HINT),
    ),
    "cut-mid-row": (
        "part.csv",
        LAST_ROW_CUT.encode(),
        (
            f"line {LAST}:",
            *CUT_OFF,
            "it has 5 of the header's 8 fields",
            "does not end with a newline",
        ),
    ),
    "no-final-newline": (
        "part.csv",
        GOOD[:-1].encode(),
        (f"line {LAST}:", *CUT_OFF, "does not end with a newline", "end the file with a newline"),
    ),
    "short-last-row": (
        "part.csv",
        LAST_ROW_SHORT.encode(),
        (f"line {LAST}:", *CUT_OFF, "it has 6 of the header's 8 fields"),
    ),
    "gzip-named-csv": (
        "part.csv",
        gzip.compress(GOOD.encode()),
        ("part.csv: is gzip-compressed, not CSV text", "Rename it to .csv.gz"),
    ),
    "zip-named-csv": (
        "part.csv",
        _zip(GOOD.encode()),
        ("part.csv: is a zip archive", "Upload the data as CSV text"),
    ),
    "nul-bytes": (
        "part.csv",
        WITH_NUL.encode(),
        ("line 6: holds NUL bytes: it is binary, not CSV text", "Upload the data as CSV text"),
    ),
    "repeated-header": (
        "part.csv",
        (GOOD + GOOD).encode(),
        (f"line {LAST + 1}: repeats the header inside the file", "Remove that line"),
    ),
    "empty": ("part.csv", b"", ("part.csv: is empty (0 bytes)", "Remove it, or upload it again")),
    "header-only": (
        "part.csv",
        GOOD_LINES[0].encode(),
        ("part.csv: has a header but no data rows", "upload it again with its header and rows"),
    ),
    "gz-not-gzip": (
        "part.csv.gz",
        GOOD.encode(),
        ("part.csv.gz: is named .gz but is not gzip-compressed", "Rename it to .csv"),
    ),
    "unclosed-quote": (
        "part.csv",
        (GOOD + '1704121178,"Company\n').encode(),
        (f"line {LAST + 1}: ends inside a quoted field", 'close the quote or double it ("")'),
    ),
    "utf-16": (
        "part.csv",
        GOOD.encode("utf-16"),
        ("part.csv: is UTF-16 text", "--set input_encoding=utf-16"),
    ),
    "unquoted-comma": (
        "part.csv",
        UNQUOTED_COMMA.encode(),
        ("line 4: the row has 9 fields but the header has 8", "Quote values that hold commas"),
    ),
    "pandas-index": (
        "part.csv",
        _frame(5, ascii_only=True).to_csv().encode(),
        ("line 1: a column has no name", "index=False"),
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_file_names_the_file_the_line_the_problem_and_the_fix(root, case):
    name, content, pieces = REFUSED[case]
    path = _write(root, name, content)

    with pytest.raises(CsvInputError) as raised:
        check_csv_files([path])

    message = str(raised.value)
    assert message.startswith(f"{path}"), message
    for piece in pieces:
        assert piece in message, message
    assert isinstance(raised.value, ActionableError) and isinstance(raised.value, ValueError)


def test_a_cut_off_gzip_file_names_the_lines_read_before_the_cut(root):
    text = _csv(taxi_data.generate_span(20_000, span=0))
    compressed = gzip.compress(text.encode())
    path = _write(root, "part.csv.gz", compressed[: len(compressed) // 2])

    with pytest.raises(CsvInputError) as raised:
        check_csv_files([path])

    message = str(raised.value)
    assert message.startswith(f"{path}: its gzip data is cut off or corrupt after line "), message
    assert "upload the file again" in message
    after = int(re.search(r"after line (\d+)", message).group(1))
    assert 0 < after < text.count("\n")


def test_files_with_different_column_sets_name_both_files_and_the_columns(root):
    frame = _frame(5)
    first = _write(root, "part-00000.csv", _csv(frame).encode())
    renamed = _csv(frame).replace(",fare,", ",fare_usd,", 1)
    second = _write(root, "part-00001.csv", renamed.encode())

    with pytest.raises(CsvInputError) as raised:
        check_csv_files([first, second])

    message = str(raised.value)
    assert message.startswith(f"{second} has other columns than {first}: "), message
    assert "it lacks ['fare'] and has ['fare_usd'] besides" in message
    assert "must share one header (in any order)" in message


def test_an_unknown_encoding_is_refused_before_any_read(root):
    path = _write(root, "part.csv", GOOD.encode())

    with pytest.raises(CsvInputError, match=r"unknown encoding 'latin-9x': set input_encoding"):
        check_csv_files([path], encoding="latin-9x")


def test_a_file_cut_off_after_the_check_stops_the_beam_read_with_the_same_message(root):
    path = _write(root, "part.csv", GOOD.encode())
    columns = check_csv_files([path])
    storage.write_bytes(path, LAST_ROW_CUT.encode())  # replaced by an interrupted upload

    with pytest.raises(Exception) as raised:
        with beam.Pipeline() as pipeline:
            _ = pipeline | ReadCsvRecords([path], columns)

    cause = actionable_cause(raised.value)
    assert isinstance(cause, CsvInputError), repr(raised.value)
    assert str(cause).startswith(f"{path}, line {LAST}: the last row is cut off")


# --------------------------------------------------------------------------------------------
# The one-pass read typed by the schema
# --------------------------------------------------------------------------------------------

TAXI_SCHEMA = text_format.Parse(
    (REPO_ROOT / "schemas" / "taxi" / "schema.pbtxt").read_text(), schema_pb2.Schema()
)
SPLITS = [("train", 4), ("eval", 1)]  # SpanExampleGen's


def _write_examples(files: list[tuple[str, bool]], out: str, encoding: str = "utf-8") -> None:
    columns = check_csv_files([path for path, _ in files], encoding, rows=False)
    types = csv_examples.schema_types(TAXI_SCHEMA, columns)
    with beam.Pipeline() as pipeline:
        _ = pipeline | csv_examples.WriteCsvExamples(files, columns, types, encoding, SPLITS, out)


def _written(out: str, tmp_path) -> dict[str, list]:
    """Each split's examples, read back from its gzip TFRecord shards."""
    import tensorflow as tf

    local = tmp_path / "written"
    storage.copy_tree(out, str(local))
    return {
        split: [tf.train.Example.FromString(record.numpy()) for record in tf.data.TFRecordDataset(
            sorted(str(p) for p in (local / f"Split-{split}").iterdir()), "GZIP")]
        for split, _ in SPLITS
    }  # fmt: skip


def test_the_one_pass_read_writes_the_stock_examples_split_by_row_in_any_column_order(
    root, tmp_path
):
    frame = _frame(400)
    frame.loc[2, "fare"] = None  # an empty cell: an empty list, as stock writes it
    frame["trip_seconds"] = frame["trip_seconds"].astype(str)
    frame.loc[3, "trip_seconds"] = " 301 "  # Arrow refuses the spaces; int() takes them
    plain_text = _csv(frame)
    files = [
        _write(root, "a-plain.csv", plain_text.encode()),
        _write(root, "b-bom.csv", b"\xef\xbb\xbf" + _csv(frame, newline="\r\n").encode()),
        _write(root, "c-reordered.csv", _csv(frame, sorted(RAW_COLUMNS)).encode()),
        _write(root, "d-gzip.csv.gz", gzip.compress(plain_text.encode())),
    ]
    out = storage.join(root, "examples")
    _write_examples([(path, True) for path in files], out)

    written = _written(out, tmp_path)
    expected = sorted(_example_key(e) for e in _stock_examples(_rows(plain_text)))
    both = written["train"] + written["eval"]
    assert sorted(_example_key(e) for e in both) == sorted(expected * len(files))
    # Every file splits each row as the first does, whatever its column order or encoding.
    eval_keys = [_example_key(e) for e in written["eval"]]
    assert all(eval_keys.count(key) == len(files) for key in eval_keys)
    assert 0.1 < len(written["eval"]) / len(both) < 0.3  # one bucket of five


def test_older_spans_go_to_train_whole(root, tmp_path):
    newest = _write(root, "new.csv", _csv(_frame(200)).encode())
    older = _write(root, "old.csv", _csv(taxi_data.generate_span(100, span=1)).encode())
    out = storage.join(root, "examples")
    _write_examples([(newest, True), (older, False)], out)

    written = _written(out, tmp_path)
    assert len(written["train"]) + len(written["eval"]) == 300
    assert len(written["train"]) >= 100 + 120 and written["eval"]


def test_a_cell_of_another_type_stops_the_one_pass_read_naming_its_line_and_column(root):
    frame = _frame(20)
    frame["trip_seconds"] = frame["trip_seconds"].astype(str)
    frame.loc[5, "trip_seconds"] = "about ten minutes"  # row 5 is on line 8 (row 0 spans two)
    path = _write(root, "part.csv", _csv(frame).encode())

    with pytest.raises(Exception) as raised:
        _write_examples([(path, True)], storage.join(root, "examples"))

    mismatch = cause_of(raised.value, csv_examples.SchemaTypeMismatch)
    assert mismatch is not None, repr(raised.value)
    assert (mismatch.path, mismatch.line, mismatch.column) == (path, 8, "trip_seconds")
    assert str(mismatch).endswith("holds 'about ten minutes', not the schema's INT")


def test_a_column_the_schema_lacks_leaves_the_types_to_inference():
    assert csv_examples.schema_types(TAXI_SCHEMA, [*RAW_COLUMNS, "tip_note"]) is None
    assert set(csv_examples.schema_types(TAXI_SCHEMA, RAW_COLUMNS)) == set(RAW_COLUMNS)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_one_pass_read_refuses_each_bad_file_with_the_same_message(root, case):
    name, content, pieces = REFUSED[case]
    path = _write(root, name, content)
    columns = RAW_COLUMNS
    types = csv_examples.schema_types(TAXI_SCHEMA, columns)

    with pytest.raises(Exception) as raised:
        with beam.Pipeline() as pipeline:
            _ = pipeline | csv_examples.WriteCsvExamples(
                [(path, True)], columns, types, "utf-8", SPLITS, storage.join(root, "examples")
            )

    cause = actionable_cause(raised.value)
    assert isinstance(cause, CsvInputError), repr(raised.value)
    with pytest.raises(CsvInputError) as checked:
        check_csv_files([path])
    # Beam re-raises a DoFn's error as its type with the step's name appended.
    assert str(cause).startswith(str(checked.value)), (str(cause), str(checked.value))
    for piece in pieces:
        assert piece in str(cause)
