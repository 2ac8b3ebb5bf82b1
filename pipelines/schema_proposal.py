"""`tkp schema propose --span N [--write]`: a schema proposed from a span's data.

A new use case (no schema file yet) gets what TFDV infers. A curated schema changes only where
span N contradicts it: ranges widen, string domains gain values, requirements relax, new columns
are added; comparators, distribution constraints, annotations and deprecations stay, and columns
the span lacks are flagged, never dropped. Every change is printed; `write` puts the result in
the use case's schema file for a person to review and commit.

The statistics are the pipeline's own: the span read by ExampleGen's transform (csv_input's reader,
tfx's type inference, tf.Examples), summarised as StatisticsGen does, checked as the
ExampleValidator checks (tfdv.validate_statistics, no environment).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apache_beam as beam
import tensorflow_data_validation as tfdv
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2
from tfx_bsl.coders import example_coder

from components.base import spans
from components.base.use_case import UseCase, load
from components.steps import csv_input
from components.steps.example_gen import CsvFilesToExample

Statistics = statistics_pb2.DatasetFeatureStatisticsList
Schema = schema_pb2.Schema
# Statistics' type -> schema type (STRING and BYTES are both BYTES in a schema).
_TYPES = {0: schema_pb2.INT, 1: schema_pb2.FLOAT, 2: schema_pb2.BYTES, 3: schema_pb2.BYTES}
_NUMERIC = ("int_domain", "float_domain")
# The validator checks each split, and the next span varies: a requirement lowered to exactly the
# share seen in this span would fail about half of them, so it goes at least half a point lower.
_PRESENCE_MARGIN = 0.005


def span_files(config: Any, span: int) -> tuple[int, list[str]]:
    """(span number, its CSV files): the files ExampleGen reads, chosen as SpanSelection chooses
    them (span -1 is the newest complete one), with its errors for a missing or incomplete span."""
    selection = spans.select(config.data_root, span, 1, config.success_marker)
    return selection["span"], selection["spans"][selection["span"]]["files"]


def span_statistics(files: list[str], encoding: str = "utf-8") -> Statistics:
    """Statistics of the files as StatisticsGen computes them from ExampleGen's examples."""
    columns = csv_input.check_csv_files(files, encoding)  # a bad file stops with name and line
    read = {"_resolved_files": files, "_resolved_columns": columns, "_input_encoding": encoding}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "stats.pb")
        with beam.Pipeline() as pipeline:
            _ = (
                pipeline
                | "ExampleGen" >> CsvFilesToExample(read, "*")
                | "Serialize" >> beam.Map(lambda example: example.SerializeToString())
                | "Batch" >> beam.BatchElements()
                | "Decode"
                >> beam.Map(
                    lambda b: example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(b)
                )  # fmt: skip
                | "Statistics" >> tfdv.GenerateStatistics(tfdv.StatsOptions())
                | "Write" >> tfdv.WriteStatisticsToBinaryFile(path)
            )
        return tfdv.load_stats_binary(path)


def propose(
    config: Any,
    span: int,
    write: bool = False,
    out: Callable[[str], Any] = print,
    use_case: UseCase | None = None,
) -> int:
    """Prints the proposal from span `span` (-1: the newest) and, with `write`, writes it to the
    use case's schema file. Returns 0 when the span passes the proposal's validation, 1 when
    something is left for a person (a column the span lacks, an anomaly no rule here resolves)."""
    use_case = use_case or load(config.use_case)
    path = Path(use_case.schema_path)
    span, files = span_files(config, span)
    statistics = span_statistics(files, config.input_encoding)
    out(f"span {span} of {config.data_root}: {statistics.datasets[0].num_examples} rows")
    if path.is_file():
        proposal, changes, notes = merge(tfdv.load_schema_text(str(path)), statistics)
        header = "".join(_leading_comments(path.read_text()))  # the file's own documentation
        out(f"changes to {path}:" if changes else f"{path}: nothing to change")
    else:
        proposal, header = _inferred(statistics, use_case.label_key), ""
        out(f"no schema for use case {use_case.name!r} yet ({path}); inferred from the data:")
        changes = [f"{f.name}: {_describe(f, proposal)}" for f in proposal.feature]
        notes = ["no drift_comparator: add them to have each span compared with the one before"]
        if use_case.label_key not in {f.name for f in proposal.feature}:
            notes.append(f"the label {use_case.label_key!r} is not a column of span {span}")
    for line in changes + notes:
        out(f"  {line}")
    left = tfdv.validate_statistics(statistics, proposal).anomaly_info
    common = {_name(f): _common(f) for f in statistics.datasets[0].features}
    for name, info in sorted(left.items()):
        # A column gone or emptied is more likely a broken upload than a new schema: flagged.
        if name not in common or not common[name].num_non_missing:
            what = "not in" if name not in common else "has no value (every cell empty) in"
            out(f"  {name}: {what} span {span}, kept: drop it from the schema if that is meant "
                "to be, else fix the upload")  # fmt: skip
        else:
            out(f"  {name}: still an anomaly, edit the schema by hand: {info.description}")
    if changes and write:
        _write_atomically(path, header + text_format.MessageToString(proposal))
        out(f"wrote {path}: review it and commit it (comments below the file's head are not kept)")
    elif changes:
        out(f"rerun with --write to write it to {path}")
    return 1 if left else 0


def merge(curated: Schema, statistics: Statistics) -> tuple[Schema, list[str], list[str]]:
    """(proposal, changes, notes): `curated` changed where the statistics contradict it, a line
    per change, and a line per feature whose unseen values the schema tolerates."""
    proposal, changes, notes = Schema(), [], []
    proposal.CopyFrom(curated)
    seen = {_name(f): f for f in statistics.datasets[0].features}
    rows = statistics.datasets[0].num_examples
    for feature in proposal.feature:
        stats = seen.get(feature.name)
        if stats is not None and _common(stats).num_non_missing:  # else flagged by propose
            retyped = _retype(feature, stats)
            if retyped:
                notes.append(f"{feature.name}: models trained before read it as another type; "
                             "the next run cannot compare its model with the served one and "
                             "judges it on the thresholds alone")  # fmt: skip
            found = retyped + _widen(feature, stats) + _grow(feature, stats, proposal, notes)
            required = feature.HasField("shape")  # FixedLen where Transform reads it
            relaxed = _relax(feature, stats, rows)
            if required and not feature.HasField("shape"):
                notes.append(f"{feature.name}: models trained before require it; a run whose "
                             "eval rows lack it cannot compare its model with the served one "
                             "and judges it on the thresholds alone")  # fmt: skip
            changes += [f"{feature.name}: {line}" for line in found + relaxed]
    inferred = tfdv.infer_schema(statistics)
    for new in inferred.feature:
        if new.name in {f.name for f in curated.feature}:
            continue
        if new.HasField("domain"):  # its inferred string domain comes along, under a free name
            domain = proposal.string_domain.add()
            domain.CopyFrom(next(d for d in inferred.string_domain if d.name == new.domain))
            while [d.name for d in proposal.string_domain].count(domain.name) > 1:
                domain.name += "_"
            new.domain = domain.name
        proposal.feature.add().CopyFrom(new)
        changes.append(f"{new.name}: new column, added: {_describe(new, proposal)}")
    return proposal, changes, notes


def _retype(feature: schema_pb2.Feature, stats) -> list[str]:
    """The type ExampleGen inferred; a numeric range carries over between INT and FLOAT."""
    want = _TYPES.get(stats.type)
    if want is None or want == feature.type:
        return []
    old, line = feature.WhichOneof("domain_info"), f"type {_type(feature.type)} -> {_type(want)}"
    domain = getattr(feature, old) if old in _NUMERIC else None
    bounds = {b: getattr(domain, b) for b in ("min", "max") if domain and domain.HasField(b)}
    feature.type = want
    feature.ClearField("domain_info")
    if bounds and want in (schema_pb2.INT, schema_pb2.FLOAT):
        target = feature.int_domain if want == schema_pb2.INT else feature.float_domain
        for bound, value in bounds.items():
            setattr(target, bound, _rounded(bound, value) if want == schema_pb2.INT else value)
    elif old:
        line += f" (its {old} is dropped)"
    return [line + " (ExampleGen types the span's column so)"]


def _widen(feature: schema_pb2.Feature, stats) -> list[str]:
    """Numeric ranges grow to the span's smallest and largest values; absent bounds stay absent."""
    kind = feature.WhichOneof("domain_info")
    if stats.WhichOneof("stats") != "num_stats" or kind not in _NUMERIC:
        return []
    domain, found = getattr(feature, kind), []
    for bound, value in (("min", stats.num_stats.min), ("max", stats.num_stats.max)):
        old = getattr(domain, bound)
        if domain.HasField(bound) and (value < old if bound == "min" else value > old):
            setattr(domain, bound, _rounded(bound, value) if kind == "int_domain" else value)
            found.append(f"{bound} {_num(old)} -> {_num(getattr(domain, bound))} (range widened)")
    return found


def _grow(feature: schema_pb2.Feature, stats, schema: Schema, notes: list[str]) -> list[str]:
    """Values outside a string domain join it, unless distribution_constraints tolerate them:
    the validator accepts a share of other values up to 1 - min_domain_mass."""
    values = feature.string_domain if feature.HasField("string_domain") else None
    if feature.HasField("domain"):
        values = next((d for d in schema.string_domain if d.name == feature.domain), None)
    if values is None or stats.WhichOneof("stats") != "string_stats":
        return []
    # The rank histogram (the 1000 most common values) is what the validator checks too.
    counts = {b.label: b.sample_count for b in stats.string_stats.rank_histogram.buckets}
    unseen = sorted(set(counts) - set(values.value))
    if not unseen:
        return []
    total = max(stats.string_stats.common_stats.tot_num_values, 1)
    share, listed = sum(counts[v] for v in unseen) / total, ", ".join(map(repr, unseen))
    constrained = feature.HasField("distribution_constraints")
    mass = feature.distribution_constraints.min_domain_mass  # 1.0 when not set: no tolerance
    if constrained and share <= 1 - mass + 1e-9:
        notes.append(f"{feature.name}: {listed} tolerated (min_domain_mass {mass:g}: {share:.2%} "
                     "of the values are outside the domain)")  # fmt: skip
        return []
    values.value.extend(unseen)
    why = f" ({share:.2%} of the values, over the {1 - mass:.2%} min_domain_mass {mass:g} allows)"
    return [f"domain gains {listed}" + why * constrained]


def _relax(feature: schema_pb2.Feature, stats, rows: int) -> list[str]:
    """Presence and value counts relaxed to what the span shows. An empty CSV cell gives an empty
    value list, not a missing feature: it shows in the value counts, not in presence."""
    common, found = _common(stats), []
    present, low, high = common.num_non_missing, common.min_num_values, common.max_num_values
    share, presence = present / max(rows, 1), feature.presence
    empty = f"now optional: {rows - common.tot_num_values} of {rows} rows have no value"
    if feature.HasField("presence") and presence.min_fraction > share:
        old = presence.min_fraction
        presence.min_fraction = max(0.0, math.floor((share - _PRESENCE_MARGIN) * 100) / 100)
        found.append(f"presence min_fraction {old:g} -> {presence.min_fraction:g} "
                     f"(now optional: {share:.4g} of the rows have it)")  # fmt: skip
    if feature.HasField("presence") and presence.min_count > present:
        found.append(f"presence min_count {presence.min_count} -> {present}")
        presence.min_count = present
    if feature.HasField("shape") and present:
        size = math.prod(d.size for d in feature.shape.dim)
        if present < rows or low != size or high != size:
            old = [d.size for d in feature.shape.dim]
            feature.value_count.min, feature.value_count.max = min(low, size), max(high, size)
            why = empty if low == 0 and high <= 1 else f"rows hold {low} to {high} values"
            found.append(f"shape {old} -> value_count {feature.value_count.min}.."
                         f"{feature.value_count.max} ({why})")  # fmt: skip
    elif feature.HasField("value_count") and present:
        count = feature.value_count
        if low < count.min:
            found.append(f"value_count min {count.min} -> {low}" + f" ({empty})" * (high <= 1))
            count.min = low
        if count.HasField("max") and high > count.max:
            found.append(f"value_count max {count.max} -> {high}")
            count.max = high
    return found


def _inferred(statistics: Statistics, label_key: str) -> Schema:
    """TFDV's schema, the label kept out of the SERVING environment as in the curated schemas
    (the serving signature takes the raw features without it)."""
    schema = tfdv.infer_schema(statistics)
    for feature in schema.feature:
        if feature.name == label_key:
            schema.default_environment.extend(["TRAINING", "SERVING"])
            feature.not_in_environment.append("SERVING")
    return schema


def _describe(feature: schema_pb2.Feature, schema: Schema) -> str:
    parts = [_type(feature.type)] + ["in every row"] * (feature.presence.min_fraction == 1)
    if feature.HasField("shape"):
        parts.append(f"shape {[d.size for d in feature.shape.dim]}")
    if feature.HasField("value_count"):
        parts.append(f"value_count {feature.value_count.min}..{feature.value_count.max}")
    domain = next((d for d in schema.string_domain if d.name == feature.domain), None)
    if feature.HasField("domain") and domain is not None:
        more = f", ... ({len(domain.value)} values)" if len(domain.value) > 8 else ""
        parts.append(f"domain {', '.join(map(repr, domain.value[:8]))}{more}")
    parts += ["0 or 1"] * feature.HasField("bool_domain")
    parts += ["not in the SERVING environment"] * ("SERVING" in feature.not_in_environment)
    return ", ".join(parts)


def _write_atomically(path: Path, text: str) -> None:
    """A temporary file renamed over `path`: no reader ever sees half a schema."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.chmod(temporary, path.stat().st_mode if path.exists() else 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _leading_comments(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    return lines[: next((i for i, s in enumerate(lines) if s.strip()[:1] not in ("#", "")), 0)]


def _common(stats: statistics_pb2.FeatureNameStatistics) -> statistics_pb2.CommonStatistics:
    kind = stats.WhichOneof("stats")
    return getattr(stats, kind).common_stats if kind else statistics_pb2.CommonStatistics()


def _name(stats: statistics_pb2.FeatureNameStatistics) -> str:
    return ".".join(stats.path.step) or stats.name


def _type(value: int) -> str:
    return schema_pb2.FeatureType.Name(value)


def _rounded(bound: str, value: float) -> int:
    return (math.floor if bound == "min" else math.ceil)(value)


def _num(value: float) -> str:
    return repr(float(f"{value:.7g}")) if isinstance(value, float) else str(value)
