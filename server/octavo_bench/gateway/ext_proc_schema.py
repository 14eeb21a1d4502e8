"""The part of Envoy's external-processing protocol a gateway speaks to an endpoint picker.

The endpoint picker (GIE's EPP, the llm-d router) implements Envoy's ext_proc service
(`envoy.service.ext_proc.v3.ExternalProcessor/Process`, a bidirectional gRPC stream). The
messages are declared here from descriptors, with Envoy's package names and field numbers
(envoy/service/ext_proc/v3/external_processor.proto, envoy/config/core/v3/base.proto), so
no protoc step or generated code is needed. Only the fields a gateway sets or reads are
declared: protobuf skips the others on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2

PROCESS_METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"

FieldType = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED = FieldType.LABEL_OPTIONAL, FieldType.LABEL_REPEATED


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    kind: int  # FieldDescriptorProto.TYPE_*
    type_name: str = ""  # fully qualified, for messages and enums
    repeated: bool = False


def message_field(name: str, number: int, type_name: str, repeated: bool = False) -> Field:
    return Field(name, number, FieldType.TYPE_MESSAGE, f".{type_name}", repeated)


def scalar(name: str, number: int, kind: int, repeated: bool = False) -> Field:
    return Field(name, number, kind, repeated=repeated)


STRING, BYTES, BOOL, UINT32 = (
    FieldType.TYPE_STRING,
    FieldType.TYPE_BYTES,
    FieldType.TYPE_BOOL,
    FieldType.TYPE_UINT32,
)
CORE, EXT_PROC = "envoy.config.core.v3", "envoy.service.ext_proc.v3"

CORE_MESSAGES = {
    "HeaderValue": [
        scalar("key", 1, STRING),
        scalar("value", 2, STRING),
        scalar("raw_value", 3, BYTES),
    ],
    "HeaderMap": [message_field("headers", 1, f"{CORE}.HeaderValue", repeated=True)],
    "HeaderValueOption": [message_field("header", 1, f"{CORE}.HeaderValue")],
    "Metadata": [],  # filter_metadata (a map) is not declared: a gateway here sends none
}
EXT_PROC_MESSAGES = {
    "HttpHeaders": [
        message_field("headers", 1, f"{CORE}.HeaderMap"),
        scalar("end_of_stream", 3, BOOL),
    ],
    "HttpBody": [scalar("body", 1, BYTES), scalar("end_of_stream", 2, BOOL)],
    "ProcessingRequest": [
        message_field("request_headers", 2, f"{EXT_PROC}.HttpHeaders"),
        message_field("response_headers", 3, f"{EXT_PROC}.HttpHeaders"),
        message_field("request_body", 4, f"{EXT_PROC}.HttpBody"),
        message_field("response_body", 5, f"{EXT_PROC}.HttpBody"),
    ],
    "HeaderMutation": [
        message_field("set_headers", 1, f"{CORE}.HeaderValueOption", True),
        scalar("remove_headers", 2, STRING, repeated=True),
    ],
    "StreamedBodyResponse": [scalar("body", 1, BYTES), scalar("end_of_stream", 2, BOOL)],
    "BodyMutation": [
        scalar("body", 1, BYTES),
        scalar("clear_body", 2, BOOL),
        message_field("streamed_response", 3, f"{EXT_PROC}.StreamedBodyResponse"),
    ],
    "CommonResponse": [
        message_field("header_mutation", 2, f"{EXT_PROC}.HeaderMutation"),
        message_field("body_mutation", 3, f"{EXT_PROC}.BodyMutation"),
    ],
    "HeadersResponse": [message_field("response", 1, f"{EXT_PROC}.CommonResponse")],
    "BodyResponse": [message_field("response", 1, f"{EXT_PROC}.CommonResponse")],
    "HttpStatus": [scalar("code", 1, UINT32)],
    "ImmediateResponse": [
        message_field("status", 1, f"{EXT_PROC}.HttpStatus"),
        message_field("headers", 2, f"{EXT_PROC}.HeaderMutation"),
        scalar("body", 3, BYTES),
        scalar("details", 5, STRING),
    ],
    "ProcessingResponse": [
        message_field("request_headers", 1, f"{EXT_PROC}.HeadersResponse"),
        message_field("response_headers", 2, f"{EXT_PROC}.HeadersResponse"),
        message_field("request_body", 3, f"{EXT_PROC}.BodyResponse"),
        message_field("response_body", 4, f"{EXT_PROC}.BodyResponse"),
        message_field("immediate_response", 7, f"{EXT_PROC}.ImmediateResponse"),
        message_field("dynamic_metadata", 8, "google.protobuf.Struct"),
    ],
}


def _file(name: str, package: str, messages: dict[str, list[Field]], deps: list[str]):
    proto = descriptor_pb2.FileDescriptorProto(
        name=name, package=package, syntax="proto3", dependency=deps
    )
    for message_name, fields in messages.items():
        message = proto.message_type.add(name=message_name)
        for spec in fields:
            message.field.add(
                name=spec.name,
                number=spec.number,
                type=spec.kind,
                type_name=spec.type_name or None,
                label=REPEATED if spec.repeated else OPTIONAL,
            )
    return proto


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(struct_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(_file("octavo/envoy_core_subset.proto", CORE, CORE_MESSAGES, []))
    deps = ["octavo/envoy_core_subset.proto", "google/protobuf/struct.proto"]
    pool.Add(_file("octavo/ext_proc_subset.proto", EXT_PROC, EXT_PROC_MESSAGES, deps))
    return pool


def message_class(full_name: str) -> type:
    """The message class of ``full_name`` (e.g. ``envoy.service.ext_proc.v3.HttpBody``)."""
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


def ext_proc(name: str) -> type:
    return message_class(f"{EXT_PROC}.{name}")


def core(name: str) -> type:
    return message_class(f"{CORE}.{name}")
