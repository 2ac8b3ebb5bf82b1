"""TF Serving's config messages that its pip package (tensorflow-serving-api) does not ship,
declared as at tag 2.16.1 so that protobuf's own text parser reads a file as TF Serving's
`ParseProtoTextFile` does (an unknown field or a wrong type is refused, not skipped):
`BatchingParameters` (servables/tensorflow/session_bundle_config.proto) and `MonitoringConfig`
(config/monitoring_config.proto)."""

from __future__ import annotations

import functools

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    wrappers_pb2,
)

_FIELD = descriptor_pb2.FieldDescriptorProto
_WRAPPERS = "google/protobuf/wrappers.proto"


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="tkp/tf_serving_config.proto", package="tensorflow.serving", syntax="proto3",
        dependency=[_WRAPPERS],
    )  # fmt: skip
    batching = proto.message_type.add(name="BatchingParameters")
    wrapped = {"max_batch_size": (1, "Int64Value"), "batch_timeout_micros": (2, "Int64Value"),
               "max_enqueued_batches": (3, "Int64Value"), "num_batch_threads": (4, "Int64Value"),
               "thread_pool_name": (5, "StringValue"),
               "enable_large_batch_splitting": (8, "BoolValue"),
               "max_execution_batch_size": (9, "Int64Value")}  # fmt: skip
    for name, (number, kind) in wrapped.items():
        batching.field.add(name=name, number=number, type=_FIELD.TYPE_MESSAGE,
                           type_name=f".google.protobuf.{kind}")  # fmt: skip
    batching.field.add(name="allowed_batch_sizes", number=6, type=_FIELD.TYPE_INT64,
                       label=_FIELD.LABEL_REPEATED)  # fmt: skip
    batching.field.add(name="pad_variable_length_inputs", number=7, type=_FIELD.TYPE_BOOL)
    prometheus = proto.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, type=_FIELD.TYPE_BOOL)
    prometheus.field.add(name="path", number=2, type=_FIELD.TYPE_STRING)
    monitoring = proto.message_type.add(name="MonitoringConfig")
    monitoring.field.add(name="prometheus_config", number=1, type=_FIELD.TYPE_MESSAGE,
                         type_name=".tensorflow.serving.PrometheusConfig")  # fmt: skip
    for message in proto.message_type:
        for field in message.field:
            if not field.label:
                field.label = _FIELD.LABEL_OPTIONAL
    pool.Add(proto)
    return pool


def message(name: str):
    """A new, empty `tensorflow.serving.<name>` message."""
    descriptor = _pool().FindMessageTypeByName(f"tensorflow.serving.{name}")
    return message_factory.MessageFactory(_pool()).GetPrototype(descriptor)()
