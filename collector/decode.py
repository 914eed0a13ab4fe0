"""OTLP/HTTP trace payloads (protobuf or JSON) decoded into SpanRecords, with every problem named by where it is.

A payload that cannot be read, or holds a malformed span (ids of the wrong size or not hex, attributes of the wrong
type), is refused whole: `PayloadError`. A well-formed span that is invalid by the OTLP specification (all-zero ids, an
end before the start), over a limit (an attribute's size, count or nesting) or holding a value the store cannot keep
(a time outside 0 to 2^63 - 1 ns, an integer outside int64, a NUL character in a string) is rejected alone and
reported as a partial success, and its neighbours are stored; a fault in a resource or a scope rejects the spans under
it. PostgreSQL refuses NUL characters; they are refused on SQLite too, so that a request gets the same answer from
either store. A string that is not valid UTF-8 (or a lone surrogate escape in JSON) is stored with U+FFFD in place of
what cannot be, with a note in the partial success naming where (`collector.mend`): one such string used to refuse the
whole request.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, NoReturn, TypeVar

import orjson
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracemill.collector.mend import Unmendable, mend_json, mend_protobuf
from tracemill.spans import SpanRecord

_M = TypeVar("_M", bound=Message)

_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
MAX_ATTRIBUTES = 10_000
MAX_DEPTH = 32
_INT64 = 2**63
_INT32 = 2**31
_SPAN_KINDS = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
               "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


class PayloadError(ValueError):
    """The request cannot be stored; the message says what is wrong and where."""


class SpanError(ValueError):
    """This span (or every span under this resource or scope) cannot be stored; the message says why and where."""


@dataclass(slots=True)
class Decoded:
    spans: list[SpanRecord] = field(default_factory=list)
    places: list[str] = field(default_factory=list)  # where each of `spans` is in the request
    rejected: int = 0  # spans
    # why, one message per rejected span or group of spans; and where a string was mended to be stored
    reasons: list[str] = field(default_factory=list)

    def reject(self, reason: str, spans: int = 1) -> None:
        self.rejected += spans
        self.reasons.append(reason)


@dataclass(frozen=True, slots=True)
class Limits:
    max_attribute_bytes: int

    def checked(self, value: str | bytes, where: str) -> Any:
        if len(value) > self.max_attribute_bytes:
            unit = "bytes" if isinstance(value, bytes) else "characters"
            raise SpanError(f"{where}: attribute value of {len(value)} {unit} is over the limit of "
                            f"{self.max_attribute_bytes}")
        return _text(value, where) if isinstance(value, str) else value


def _text(value: str, where: str) -> str:
    if "\x00" in value:
        raise SpanError(f"{where}: holds a NUL character (U+0000), which the store cannot keep")
    return value


def _time(value: int, where: str) -> int:
    if not 0 <= value < _INT64:
        raise SpanError(f"{where}: {value} ns is not a time the store can keep (0 to 2^63 - 1 ns, before 2262)")
    return value


def _check_span(span: SpanRecord, where: str, out: Decoded) -> None:
    if span.trace_id == _ZERO_TRACE or span.span_id == _ZERO_SPAN:
        out.reject(f"{where}: trace id and span id must not be all zeros")
    elif span.end_time_ns and span.start_time_ns and span.end_time_ns < span.start_time_ns:
        out.reject(f"{where}: ends ({span.end_time_ns}) before it starts ({span.start_time_ns})")
    else:
        out.spans.append(span)
        out.places.append(where)


# ---- protobuf ---------------------------------------------------------------------------------------------------

def _pb_value(value: Any, limits: Limits, where: str, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise SpanError(f"{where}: attribute nested deeper than {MAX_DEPTH} levels")
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return limits.checked(value.string_value, where)
    if kind == "int_value":
        return value.int_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "double_value":
        return value.double_value
    if kind == "bytes_value":
        return base64.b64encode(limits.checked(value.bytes_value, where)).decode()
    if kind == "array_value":
        return [_pb_value(v, limits, f"{where}[{i}]", depth + 1) for i, v in enumerate(value.array_value.values)]
    if kind == "kvlist_value":
        return {_text(kv.key, f"{where}.{kv.key!r}"): _pb_value(kv.value, limits, f"{where}.{kv.key}", depth + 1)
                for kv in value.kvlist_value.values}
    return None


def _pb_attributes(attributes: Any, limits: Limits, where: str, field: str) -> dict[str, Any]:
    """`where` + `field` locate the attributes; the location is only built for an error (this is the hot loop)."""
    if len(attributes) > MAX_ATTRIBUTES:
        raise SpanError(f"{where}{field}: {len(attributes)} attributes, more than the limit of {MAX_ATTRIBUTES}")
    out: dict[str, Any] = {}
    limit = limits.max_attribute_bytes
    for kv in attributes:
        key, value = kv.key, kv.value
        if "\x00" in key:
            _text(key, f"{where}{field}[{key!r}]")
        text = value.string_value  # "" unless the value is a non-empty string, the common case
        if text and len(text) <= limit and "\x00" not in text:
            out[key] = text
        else:
            out[key] = _pb_value(value, limits, f"{where}{field}[{key!r}]")
    return out


def _bad_id(raw: bytes, size: int, where: str, field: str) -> NoReturn:
    raise PayloadError(f"{where}{field}: must be {size} bytes, got {len(raw)}")


def protobuf_request(message: type[_M], body: bytes, notes: list[str] | None = None) -> _M:
    """An OTLP/protobuf body decoded as the export request `message`, its strings mended where they are not UTF-8
    (`collector.mend`; a note for each added to `notes`). Raises PayloadError."""
    try:
        return message.FromString(body)
    except (DecodeError, RuntimeError, ValueError) as exc:
        refused = PayloadError(f"body is not a protobuf {message.__name__}: {exc}")
        if "UTF-8" not in str(exc):
            raise refused from exc
        try:
            mended, found = mend_protobuf(body, message.DESCRIPTOR)
            request = message.FromString(mended)
        except (Unmendable, DecodeError, RuntimeError, ValueError):
            raise refused from exc
    if notes is not None:
        notes.extend(found)
    return request


def decode_protobuf(body: bytes, limits: Limits) -> Decoded:
    out = Decoded()
    request = protobuf_request(ExportTraceServiceRequest, body, out.reasons)
    for i, resource_spans in enumerate(request.resource_spans):
        try:
            resource = _pb_attributes(resource_spans.resource.attributes, limits, f"resourceSpans[{i}]",
                                      ".resource.attributes")
        except SpanError as exc:
            out.reject(str(exc), sum(len(scope_spans.spans) for scope_spans in resource_spans.scope_spans))
            continue
        for j, scope_spans in enumerate(resource_spans.scope_spans):
            scope = scope_spans.scope
            try:
                scope_name = _text(scope.name, f"resourceSpans[{i}].scopeSpans[{j}].scope.name")
                scope_version = _text(scope.version, f"resourceSpans[{i}].scopeSpans[{j}].scope.version")
            except SpanError as exc:
                out.reject(str(exc), len(scope_spans.spans))
                continue
            for k, span in enumerate(scope_spans.spans):
                where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                try:
                    record = _pb_span(span, where, limits, resource, scope_name, scope_version)
                except SpanError as exc:
                    out.reject(str(exc))
                else:
                    _check_span(record, where, out)
    return out


def _pb_span(span: Any, where: str, limits: Limits, resource: dict[str, Any], scope_name: str,
             scope_version: str) -> SpanRecord:
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    name, start, end, status = span.name, span.start_time_unix_nano, span.end_time_unix_nano, span.status
    message = status.message
    return SpanRecord(
        trace_id=trace_id.hex() if len(trace_id) == 16 else _bad_id(trace_id, 16, where, ".traceId"),
        span_id=span_id.hex() if len(span_id) == 8 else _bad_id(span_id, 8, where, ".spanId"),
        parent_span_id=(parent.hex() if len(parent) == 8
                        else _bad_id(parent, 8, where, ".parentSpanId") if parent else None),
        name=name if "\x00" not in name else _text(name, f"{where}.name"),
        kind=span.kind,
        start_time_ns=start if start < _INT64 else _time(start, f"{where}.startTimeUnixNano"),
        end_time_ns=end if end < _INT64 else _time(end, f"{where}.endTimeUnixNano"),
        status_code=status.code,
        status_message=message if "\x00" not in message else _text(message, f"{where}.status.message"),
        attributes=_pb_attributes(span.attributes, limits, where, ".attributes"),
        resource=resource,
        scope_name=scope_name,
        scope_version=scope_version,
        events=[
            {"name": _text(e.name, f"{where}.events[{n}].name"),
             "time_ns": _time(e.time_unix_nano, f"{where}.events[{n}].timeUnixNano"),
             "attributes": _pb_attributes(e.attributes, limits, where, f".events[{n}].attributes")}
            for n, e in enumerate(span.events)
        ] if span.events else [],
        links=[
            {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(),
             "attributes": _pb_attributes(link.attributes, limits, where, f".links[{n}].attributes")}
            for n, link in enumerate(span.links)
        ] if span.links else [],
    )


# ---- JSON (OTLP/JSON: lowerCamelCase keys, hex ids, int64 as strings) ---------------------------------------------

def _field(obj: Mapping[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    if camel in obj:
        return obj[camel]
    return obj.get(snake, default)


def _expect(value: Any, types: type | tuple[type, ...], where: str, what: str) -> Any:
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise PayloadError(f"{where}: expected {what}, got {type(value).__name__} {_preview(value)}")
    return value


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_int(value: Any, where: str, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool):
        raise PayloadError(f"{where}: expected an integer, got bool")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():  # proto3's JSON mapping takes 1.0 and 1e18 for an integer
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
        try:
            number = Decimal(value)  # "1e18", "3.0"
        except InvalidOperation:
            pass
        else:
            if number.is_finite() and number == number.to_integral_value():
                return int(number)
    raise PayloadError(f"{where}: expected an integer (or its decimal string), got {_preview(value)}")


def _json_ranged(value: Any, where: str, bound: int, what: str) -> int:
    number = _json_int(value, where)
    if not -bound <= number < bound:
        raise SpanError(f"{where}: {number} is outside {what}")
    return number


def _json_time(value: Any, where: str) -> int:
    return _time(_json_int(value, where), where)


def _json_enum(value: Any, names: Mapping[str, int], where: str) -> int:
    if isinstance(value, str) and value in names:
        return names[value]
    return _json_ranged(value, where, _INT32, "int32")


def _json_id(value: Any, size: int, where: str, optional: bool = False) -> str | None:
    if value in (None, "") and optional:
        return None
    if not isinstance(value, str) or len(value) != size * 2:
        raise PayloadError(f"{where}: expected {size * 2} hex digits, got {_preview(value)}")
    try:
        digits = bytes.fromhex(value)
    except ValueError:
        digits = b""
    if len(digits) != size:  # fromhex skips spaces
        raise PayloadError(f"{where}: expected {size * 2} hex digits, got {_preview(value)}")
    return value.lower()


def _json_value(value: Any, limits: Limits, where: str, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise SpanError(f"{where}: attribute nested deeper than {MAX_DEPTH} levels")
    if value is None:  # an AnyValue left empty, as some encoders write it
        return None
    _expect(value, dict, where, "an AnyValue object")
    if not value:
        return None
    if len(value) != 1:
        raise PayloadError(f"{where}: an AnyValue holds exactly one of stringValue, intValue, ..., got {sorted(value)}")
    (kind, inner), = value.items()
    if kind in ("stringValue", "string_value"):
        return limits.checked(_expect(inner, str, where, "a string"), where)
    if kind in ("intValue", "int_value"):
        return _json_ranged(inner, where, _INT64, "int64")
    if kind in ("boolValue", "bool_value"):
        return _expect(inner, bool, where, "a boolean")
    if kind in ("doubleValue", "double_value"):
        if isinstance(inner, str):  # "NaN", "Infinity", "1.5": proto3's JSON mapping takes a double as a string too
            try:
                return float(inner)
            except ValueError:
                pass
        return float(_expect(inner, (int, float), where, "a number"))
    if kind in ("bytesValue", "bytes_value"):
        return limits.checked(_expect(inner, str, where, "base64 text"), where)
    if kind in ("arrayValue", "array_value"):
        values = _expect(_expect(inner, dict, where, "an object").get("values") or [], list, where, "a list")
        return [_json_value(v, limits, f"{where}[{i}]", depth + 1) for i, v in enumerate(values)]
    if kind in ("kvlistValue", "kvlist_value"):
        values = _expect(_expect(inner, dict, where, "an object").get("values") or [], list, where, "a list")
        return _json_attributes(values, limits, where, depth + 1)
    raise PayloadError(f"{where}: unknown AnyValue field {kind!r}")


def _json_attributes(items: Any, limits: Limits, where: str, depth: int = 0) -> dict[str, Any]:
    if items is None:
        return {}
    _expect(items, list, where, "a list of key/value objects")
    if len(items) > MAX_ATTRIBUTES:
        raise SpanError(f"{where}: {len(items)} attributes, more than the limit of {MAX_ATTRIBUTES}")
    out: dict[str, Any] = {}
    for n, item in enumerate(items):
        _expect(item, dict, f"{where}[{n}]", "a key/value object")
        key = _text(_expect(item.get("key"), str, f"{where}[{n}].key", "a string"), f"{where}[{n}].key")
        out[key] = _json_value(item.get("value", {}), limits, f"{where}[{key!r}]", depth)
    return out


def _json_list(obj: Mapping[str, Any], camel: str, snake: str, where: str) -> list[Any]:
    return _expect(_field(obj, camel, snake, []) or [], list, f"{where}.{camel}", "a list")


def json_request(body: bytes, message: str, notes: list[str] | None = None) -> dict[str, Any]:
    """An OTLP/JSON body decoded: an object, the export request `message` names; its strings mended where they are
    not UTF-8 (`collector.mend`; a note for each added to `notes`). Raises PayloadError."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        try:
            request, found = mend_json(body)
        except Unmendable:
            raise PayloadError(f"body is not valid JSON: {exc}") from exc
        if notes is not None:
            notes.extend(found)
    return _expect(request, dict, "body", f"an {message} object")


def decode_json(body: bytes, limits: Limits) -> Decoded:
    out = Decoded()
    request = json_request(body, "ExportTraceServiceRequest", out.reasons)
    for i, rs in enumerate(_json_list(request, "resourceSpans", "resource_spans", "body")):
        rs_where = f"resourceSpans[{i}]"
        _expect(rs, dict, rs_where, "an object")
        resource_obj = _expect(rs.get("resource") or {}, dict, f"{rs_where}.resource", "an object")
        scope_spans = _json_list(rs, "scopeSpans", "scope_spans", rs_where)
        try:
            resource = _json_attributes(resource_obj.get("attributes"), limits, f"{rs_where}.resource.attributes")
        except SpanError as exc:
            out.reject(str(exc), sum(len(_json_list(ss, "spans", "spans", rs_where)) for ss in scope_spans
                                     if isinstance(ss, dict)))
            continue
        for j, ss in enumerate(scope_spans):
            ss_where = f"{rs_where}.scopeSpans[{j}]"
            _expect(ss, dict, ss_where, "an object")
            scope = _expect(ss.get("scope") or {}, dict, f"{ss_where}.scope", "an object")
            spans = _json_list(ss, "spans", "spans", ss_where)
            try:
                scope_name = _text(_expect(scope.get("name", ""), str, f"{ss_where}.scope.name", "a string"),
                                   f"{ss_where}.scope.name")
                scope_version = _text(_expect(scope.get("version", ""), str, f"{ss_where}.scope.version",
                                              "a string"), f"{ss_where}.scope.version")
            except SpanError as exc:
                out.reject(str(exc), len(spans))
                continue
            for k, span in enumerate(spans):
                where = f"{ss_where}.spans[{k}]"
                try:
                    record = _json_span(span, where, limits, resource, scope_name, scope_version)
                except SpanError as exc:
                    out.reject(str(exc))
                else:
                    _check_span(record, where, out)
    return out


def _json_span(span: Any, where: str, limits: Limits, resource: dict[str, Any], scope_name: str,
               scope_version: str) -> SpanRecord:
    _expect(span, dict, where, "a span object")
    status = _expect(span.get("status") or {}, dict, f"{where}.status", "an object")
    return SpanRecord(
        trace_id=_json_id(_field(span, "traceId", "trace_id"), 16, f"{where}.traceId") or "",
        span_id=_json_id(_field(span, "spanId", "span_id"), 8, f"{where}.spanId") or "",
        parent_span_id=_json_id(_field(span, "parentSpanId", "parent_span_id"), 8, f"{where}.parentSpanId",
                                optional=True),
        name=_text(_expect(span.get("name", ""), str, f"{where}.name", "a string"), f"{where}.name"),
        kind=_json_enum(span.get("kind", 0), _SPAN_KINDS, f"{where}.kind"),
        start_time_ns=_json_time(_field(span, "startTimeUnixNano", "start_time_unix_nano"),
                                 f"{where}.startTimeUnixNano"),
        end_time_ns=_json_time(_field(span, "endTimeUnixNano", "end_time_unix_nano"), f"{where}.endTimeUnixNano"),
        status_code=_json_enum(status.get("code", 0), _STATUS_CODES, f"{where}.status.code"),
        status_message=_text(_expect(status.get("message", ""), str, f"{where}.status.message", "a string"),
                             f"{where}.status.message"),
        attributes=_json_attributes(span.get("attributes"), limits, f"{where}.attributes"),
        resource=resource,
        scope_name=scope_name,
        scope_version=scope_version,
        events=[_json_event(e, limits, f"{where}.events[{n}]")
                for n, e in enumerate(_json_list(span, "events", "events", where))],
        links=[_json_link(link, limits, f"{where}.links[{n}]")
               for n, link in enumerate(_json_list(span, "links", "links", where))],
    )


def _json_event(event: Any, limits: Limits, where: str) -> dict[str, Any]:
    _expect(event, dict, where, "an event object")
    return {"name": _text(_expect(event.get("name", ""), str, f"{where}.name", "a string"), f"{where}.name"),
            "time_ns": _json_time(_field(event, "timeUnixNano", "time_unix_nano"), f"{where}.timeUnixNano"),
            "attributes": _json_attributes(event.get("attributes"), limits, f"{where}.attributes")}


def _json_link(link: Any, limits: Limits, where: str) -> dict[str, Any]:
    _expect(link, dict, where, "a link object")
    return {"trace_id": _json_id(_field(link, "traceId", "trace_id"), 16, f"{where}.traceId"),
            "span_id": _json_id(_field(link, "spanId", "span_id"), 8, f"{where}.spanId"),
            "attributes": _json_attributes(link.get("attributes"), limits, f"{where}.attributes")}


DECODERS: dict[str, Callable[[bytes, Limits], Decoded]] = {
    "application/x-protobuf": decode_protobuf,
    "application/protobuf": decode_protobuf,
    "application/json": decode_json,
}
