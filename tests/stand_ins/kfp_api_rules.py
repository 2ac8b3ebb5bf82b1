"""The rules the Kubeflow Pipelines API server (backend/src/apiserver, tags 2.5.0, 2.16.1 and
2.17.0: the same text at all three unless named) applies to what this project sends, for the
API stand-in (kfp_api_stand_in.py). Each function cites the source it plays."""

from __future__ import annotations

import re

from google.protobuf import json_format, struct_pb2
from kfp.pipeline_spec import pipeline_spec_pb2

# common/utils.go ValidatePipelineName
_PIPELINE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
_GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$")
_DESCRIPTORS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}
_DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
_CRON_BOUNDS = [(0, 59, {}), (0, 59, {}), (0, 23, {}), (1, 31, {}), (1, 12, _MONTHS), (0, 6, _DAYS)]


def at_least(version: str, than: str) -> bool:
    """Whether a backend tag (2.5.0, 2.16.1, 2.17.0) is `than` or newer."""
    return tuple(map(int, version.split("."))) >= tuple(map(int, than.split(".")))


class InvalidInput(ValueError):
    """util.NewInvalidInputError: HTTP 400, gRPC code 3."""


def validate_spec(documents: list) -> dict:
    """template.New and NewV2SpecTemplate (template/template.go, template/v2_template.go) and
    common.ValidatePipelineName: the spec must parse as a PipelineSpec with no unknown field
    (protojson), have schemaVersion 2.1.0, a valid pipelineInfo.name and a root; a second
    document must parse as a PlatformSpec. Returns the spec."""
    specs = [d for d in documents if isinstance(d, dict) and "pipelineInfo" in d]
    platforms = [d for d in documents if isinstance(d, dict) and "platforms" in d]
    if not specs:
        raise InvalidInput("unknown template format: pipeline spec is invalid")
    if len(specs) > 1:
        raise InvalidInput("multiple pipeline specs provided")
    if len(platforms) > 1:
        raise InvalidInput("multiple platform specs provided")
    (spec,) = specs
    try:
        json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    except json_format.ParseError as error:
        raise InvalidInput(f"invalid v2 pipeline spec: {error}") from None
    for platform in platforms:
        try:
            json_format.ParseDict(platform, pipeline_spec_pb2.PlatformSpec())
        except json_format.ParseError as error:
            raise InvalidInput(f"cannot unmarshal platform specific configs: {error}") from None
    if spec.get("schemaVersion") != "2.1.0":
        raise InvalidInput("KFP only supports schema version 2.1.0, but the pipeline spec has "
                           f"version {spec.get('schemaVersion')}")  # fmt: skip
    name = spec["pipelineInfo"].get("name", "")
    if not name:
        raise InvalidInput("invalid v2 pipeline spec: name is empty")
    if not _PIPELINE_NAME.match(name):
        raise InvalidInput("pipeline's name must contain only lowercase alphanumeric characters "
                           "or '-' and must start with alphanumeric characters")  # fmt: skip
    if not spec.get("root"):
        raise InvalidInput("invalid v2 pipeline spec: root component is empty")
    return spec


def validate_job_inputs(spec: dict, parameters: dict, version: str) -> None:
    """template/v2_template.go validatePipelineJobInputs: every declared root parameter either
    given with a value of its type or optional / defaulted, and nothing undeclared. JSON numbers
    are numbers for NUMBER_INTEGER too (no integrality check at any tag); 2.16.1+ also checks
    `literals`. The server reports the first fault in Go's random map order; the stand-in
    reports them in declaration order."""
    declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    number = ("number_value", "double or integer", "the parameter value is not of number")
    kinds = {
        "NUMBER_DOUBLE": number,
        "NUMBER_INTEGER": number,
        "STRING": ("string_value", "string", "the input parameter is not of string"),
        "BOOLEAN": ("bool_value", "bool", "the input parameter is not of bool"),
        "LIST": ("list_value", "list", "the input parameter is not of list"),
        "STRUCT": ("struct_value", "struct", "the input parameter is not of struct"),
    }  # fmt: skip
    for name, definition in declared.items():
        if name not in parameters:
            if not definition.get("isOptional") and "defaultValue" not in definition:
                raise InvalidInput(f"parameter {name} is not optional, yet has neither default "
                                   "value nor user provided value")  # fmt: skip
            continue
        value = json_format.ParseDict(parameters[name], struct_pb2.Value())
        kind = definition.get("parameterType", "PARAMETER_TYPE_ENUM_UNSPECIFIED")
        if kind == "PARAMETER_TYPE_ENUM_UNSPECIFIED":
            raise InvalidInput(f"input parameter {name} has unspecified type")
        if kind not in kinds:
            raise InvalidInput(f"input parameter {name} requires type unknown")
        field, what, why = kinds[kind]
        if value.WhichOneof("kind") != field:
            raise InvalidInput(f"input parameter {name} requires type {what}, but {why} value type")
        literals = definition.get("literals")
        if literals and at_least(version, "2.16.0") and parameters[name] not in literals:
            raise InvalidInput(f'input parameter "{name}" value {parameters[name]} does not '
                               f"match any of the allowed literal values: {literals}")  # fmt: skip
    unknown = [name for name in parameters if name not in declared]
    if unknown:
        raise InvalidInput("parameter(s) provided are not required by pipeline: "
                           + ", ".join(unknown))  # fmt: skip


def parse_cron(spec: str) -> None:
    """github.com/robfig/cron v1.2.0 `Parse` (the API server's server/api_converter.go toModelJob
    and the ScheduledWorkflow controller both use it): 5 or 6 fields, seconds first (5 fields:
    the day of week defaults to *), descriptors (@daily, @every <duration>), `?` as `*` in any
    field, empty list items dropped. Raises InvalidInput with robfig's message."""
    if not spec:
        raise InvalidInput("Empty spec string")
    if spec.startswith("@"):
        if spec in _DESCRIPTORS:
            return
        if spec.startswith("@every "):
            duration = spec[len("@every ") :]
            if not _GO_DURATION.match(duration):
                raise InvalidInput(f"Failed to parse duration {spec}: time: invalid duration "
                                   f'"{duration}"')  # fmt: skip
            return
        raise InvalidInput(f"Unrecognized descriptor: {spec}")
    fields = spec.split()
    if len(fields) not in (5, 6):
        raise InvalidInput(f"Expected 5 to 6 fields, found {len(fields)}: {spec}")
    if len(fields) == 5:
        fields.append("*")  # DowOptional
    for field, (low, high, names) in zip(fields, _CRON_BOUNDS, strict=True):
        for expr in [e for e in field.split(",") if e]:  # strings.FieldsFunc drops empty items
            _cron_range(expr, low, high, names)


def _cron_range(expr: str, low: int, high: int, names: dict) -> None:
    """robfig/cron v1.2.0 parser.go getRange."""
    range_and_step = expr.split("/")
    low_and_high = range_and_step[0].split("-")
    single = len(low_and_high) == 1
    if low_and_high[0] in ("*", "?"):
        start, end = low, high
    else:
        start = _int_or_name(low_and_high[0], names)
        if len(low_and_high) == 1:
            end = start
        elif len(low_and_high) == 2:
            end = _int_or_name(low_and_high[1], names)
        else:
            raise InvalidInput(f"Too many hyphens: {expr}")
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _int(range_and_step[1])
        if single:  # "N/step" means "N-max/step"
            end = high
    else:
        raise InvalidInput(f"Too many slashes: {expr}")
    if start < low:
        raise InvalidInput(f"Beginning of range ({start}) below minimum ({low}): {expr}")
    if end > high:
        raise InvalidInput(f"End of range ({end}) above maximum ({high}): {expr}")
    if start > end:
        raise InvalidInput(f"Beginning of range ({start}) beyond end of range ({end}): {expr}")
    if step == 0:
        raise InvalidInput(f"Step of range should be a positive number: {expr}")


def _int_or_name(expr: str, names: dict) -> int:
    if names and expr.lower() in names:
        return names[expr.lower()]
    return _int(expr)


def _int(expr: str) -> int:
    """strconv.Atoi, then robfig's own rule against negatives."""
    if not re.fullmatch(r"[+-]?[0-9]+", expr):
        raise InvalidInput(f'Failed to parse int from {expr}: strconv.Atoi: parsing "{expr}": '
                           "invalid syntax")  # fmt: skip
    number = int(expr)
    if number < 0:
        raise InvalidInput(f"Negative number ({number}) not allowed: {expr}")
    return number


def check_recurring_run(body: dict) -> None:
    """server/api_converter.go toModelJob, in its order, for what a client can get wrong: max
    concurrency 1-10, a cron robfig parses, an interval of at least 1 s."""
    concurrency = int(body.get("max_concurrency") or 0)
    if concurrency > 10 or concurrency < 1:
        raise InvalidInput("Max concurrency of a recurring run must be at least 1 and at most 10. "
                           f"Received {concurrency}")  # fmt: skip
    trigger = body.get("trigger") or {}
    if "cron_schedule" in trigger:
        try:
            parse_cron(trigger["cron_schedule"].get("cron", ""))
        except InvalidInput as error:
            raise InvalidInput("Schedule cron is not a supported format(https://godoc.org/github"
                               f".com/robfig/cron). Error: {error}") from None  # fmt: skip
    if "periodic_schedule" in trigger:
        interval = int(trigger["periodic_schedule"].get("interval_second") or 0)
        if interval < 1:
            raise InvalidInput(f"Found invalid period schedule interval {interval}. Set at "
                               "interval to least 1 second")  # fmt: skip


def error_body(version: str, code: int, message: str, detail: str) -> dict:
    """A gRPC-gateway error (backend/src/common/util/error.go UserError.GRPCStatus): 2.5.0's
    gateway v1 DefaultHTTPError adds `error`; 2.16.1+ (gateway v2) writes the google.rpc.Status
    alone."""
    details = [{"@type": "type.googleapis.com/google.rpc.Status", "code": code, "message": detail}]
    body = {"code": code, "message": message, "details": details}
    return body if at_least(version, "2.16.0") else {"error": message, **body}


def upload_error(message: str) -> dict:
    """server/pipeline_upload_server.go writeErrorToResponse: a v1beta1 Error."""
    return {"error_message": message, "error_details": message}
