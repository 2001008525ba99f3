"""The broker's side of Kafka SASL, without I/O: the frames it reads and writes, and the checks.

A test broker that does not do SASL is put behind a terminator (tests/support/secured_kafka.py) that
answers SaslHandshake (API key 17) and SaslAuthenticate (key 36) itself and then pipes bytes.
This module holds what that needs, apart from sockets:

- the request header (which API, which version, where the body starts);
- the broker's ApiVersions response with keys 17 and 36 added, so clients see a SASL broker;
- SaslHandshake v1 and SaslAuthenticate v0-v2 requests and responses (v2 is a flexible version:
  compact lengths and tagged fields, and a response header with tagged fields);
- PLAIN (RFC 4616) and SCRAM-SHA-256/-512 (RFC 5802, RFC 7677) checks against known passwords.

Wire formats follow Kafka's message definitions (kafka-python ships them as JSON under
kafka/protocol/schemas/resources). Only what librdkafka and kafka-python send is handled:
SaslHandshake v0 (raw SASL tokens after the handshake) is answered UNSUPPORTED_VERSION, and
SaslHandshake is advertised as v1 only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
# (min, max) versions the terminator answers, advertised in place of the broker's own.
SASL_API_RANGES = {SASL_HANDSHAKE: (1, 1), SASL_AUTHENTICATE: (0, 2)}

NO_ERROR = 0
UNSUPPORTED_VERSION = 35
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# RFC 7677 asks for at least 4096; Kafka's minimum is 4096 too.
SCRAM_ITERATIONS = 4096


class AuthenticationFailedError(Exception):
    """The client's SASL bytes do not prove it knows a configured user's password."""


class WireError(Exception):
    """A frame too short or malformed for the field being read."""


# --- Primitive encodings ------------------------------------------------------------------------


def _read_uvarint(data: bytes, offset: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if offset >= len(data):
            raise WireError("varint runs past the end of the frame")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte & 0x80 == 0:
            return value, offset
        shift += 7
        if shift > 28:
            raise WireError("varint longer than 5 bytes")


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _skip_tagged_fields(data: bytes, offset: int) -> int:
    count, offset = _read_uvarint(data, offset)
    for _ in range(count):
        _tag, offset = _read_uvarint(data, offset)
        size, offset = _read_uvarint(data, offset)
        offset += size
    if offset > len(data):
        raise WireError("tagged field runs past the end of the frame")
    return offset


def _unpack(fmt: str, data: bytes, offset: int) -> tuple[int, ...]:
    try:
        return struct.unpack_from(fmt, data, offset)
    except struct.error as error:
        raise WireError(str(error)) from None


def _string(value: str) -> bytes:
    encoded = value.encode()
    return struct.pack(">h", len(encoded)) + encoded


def frame(payload: bytes) -> bytes:
    """A Kafka frame: the payload preceded by its length (int32)."""
    return struct.pack(">i", len(payload)) + payload


# --- Requests -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    body_offset: int
    """Where the request body starts in the frame's payload."""


def _uses_flexible_header(api_key: int, api_version: int) -> bool:
    # Only the APIs read here; header v2 (client id, then tagged fields) from their flexible
    # versions on. SaslHandshake has none.
    return (api_key == API_VERSIONS and api_version >= 3) or (
        api_key == SASL_AUTHENTICATE and api_version >= 2
    )


def parse_request_header(payload: bytes) -> RequestHeader:
    """The header of a request frame's payload (the bytes after the length)."""
    api_key, api_version, correlation_id = _unpack(">hhi", payload, 0)
    # The client id is a classic nullable string even in header v2.
    (client_id_length,) = _unpack(">h", payload, 8)
    offset = 10 + max(client_id_length, 0)
    if _uses_flexible_header(api_key, api_version):
        offset = _skip_tagged_fields(payload, offset)
    return RequestHeader(api_key, api_version, correlation_id, offset)


def parse_handshake_mechanism(payload: bytes, header: RequestHeader) -> str:
    (length,) = _unpack(">h", payload, header.body_offset)
    start = header.body_offset + 2
    if length < 0 or start + length > len(payload):
        raise WireError("SaslHandshake mechanism runs past the end of the frame")
    return payload[start : start + length].decode()


def parse_authenticate_bytes(payload: bytes, header: RequestHeader) -> bytes:
    offset = header.body_offset
    if header.api_version >= 2:
        length_plus_one, offset = _read_uvarint(payload, offset)
        length = length_plus_one - 1
    else:
        (length,) = _unpack(">i", payload, offset)
        offset += 4
    if length < 0 or offset + length > len(payload):
        raise WireError("SaslAuthenticate bytes run past the end of the frame")
    return payload[offset : offset + length]


def api_versions_request(correlation_id: int, client_id: str = "probe") -> bytes:
    """A framed ApiVersions v0 request: what a readiness probe sends to a bare broker."""
    return frame(struct.pack(">hhi", API_VERSIONS, 0, correlation_id) + _string(client_id))


# --- Responses ----------------------------------------------------------------------------------


def with_sasl_apis(response_payload: bytes, request_version: int) -> bytes:
    """The broker's ApiVersions response payload, advertising SaslHandshake and SaslAuthenticate.

    A response carrying an error (UNSUPPORTED_VERSION: the client retries with a lower version)
    is returned unchanged. Its header is v0 (the correlation id only) whatever the version: the
    client cannot know the broker's header versions yet.
    """
    (error_code,) = _unpack(">h", response_payload, 4)
    if error_code != NO_ERROR:
        return response_payload
    flexible = request_version >= 3
    offset = 6
    if flexible:
        count_plus_one, offset = _read_uvarint(response_payload, offset)
        count = count_plus_one - 1
    else:
        (count,) = _unpack(">i", response_payload, offset)
        offset += 4
    # Entries kept as raw bytes (with any tagged fields of their own), keyed by API key.
    entries: dict[int, bytes] = {}
    for _ in range(count):
        start = offset
        (api_key,) = _unpack(">h", response_payload, offset)
        offset += 6
        if flexible:
            offset = _skip_tagged_fields(response_payload, offset)
        entries[api_key] = response_payload[start:offset]
    rest = response_payload[offset:]  # throttle time (v1+) and tagged fields (v3+)
    for api_key, (min_version, max_version) in SASL_API_RANGES.items():
        entry = struct.pack(">hhh", api_key, min_version, max_version)
        entries[api_key] = entry + (b"\x00" if flexible else b"")
    count_bytes = _uvarint(len(entries) + 1) if flexible else struct.pack(">i", len(entries))
    body = b"".join(entries[key] for key in sorted(entries))
    return response_payload[:6] + count_bytes + body + rest


def handshake_response(correlation_id: int, error_code: int) -> bytes:
    """A framed SaslHandshake v0/v1 response listing every mechanism the terminator checks."""
    mechanisms = b"".join(_string(mechanism) for mechanism in MECHANISMS)
    return frame(struct.pack(">ihi", correlation_id, error_code, len(MECHANISMS)) + mechanisms)


def authenticate_response(
    header: RequestHeader, error_code: int, error_message: str | None, auth_bytes: bytes
) -> bytes:
    """A framed SaslAuthenticate response in the request's version (0-2)."""
    version = header.api_version
    message = None if error_message is None else error_message.encode()
    if version >= 2:
        out = struct.pack(">i", header.correlation_id) + b"\x00"  # header v1: tagged fields
        out += struct.pack(">h", error_code)
        out += _uvarint(0) if message is None else _uvarint(len(message) + 1) + message
        out += _uvarint(len(auth_bytes) + 1) + auth_bytes
    else:
        out = struct.pack(">ih", header.correlation_id, error_code)
        out += (
            struct.pack(">h", -1) if message is None else struct.pack(">h", len(message)) + message
        )
        out += struct.pack(">i", len(auth_bytes)) + auth_bytes
    if version >= 1:
        out += struct.pack(">q", 0)  # session lifetime 0: no re-authentication (KIP-368)
    if version >= 2:
        out += b"\x00"
    return frame(out)


# --- Mechanisms ---------------------------------------------------------------------------------


class SaslExchange(Protocol):
    """One client's authentication: client bytes in, server bytes out, until `done`."""

    @property
    def done(self) -> bool: ...

    def step(self, client_bytes: bytes) -> bytes:
        """The server's reply to one client message; raises AuthenticationFailedError."""
        ...


def _matches(expected: str | None, given: str) -> bool:
    return expected is not None and hmac.compare_digest(expected.encode(), given.encode())


class PlainExchange:
    """RFC 4616: one message, "authzid NUL user NUL password", answered with nothing."""

    def __init__(self, passwords: Mapping[str, str]) -> None:
        self._passwords = passwords
        self.done = False

    def step(self, client_bytes: bytes) -> bytes:
        parts = client_bytes.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailedError("malformed PLAIN message")
        authzid, user, password = (part.decode(errors="replace") for part in parts)
        if authzid not in ("", user) or not _matches(self._passwords.get(user), password):
            raise AuthenticationFailedError(f"Invalid username or password for user {user!r}")
        self.done = True
        return b""


def _scram_attributes(message: str) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for part in message.split(","):
        name, separator, value = part.partition("=")
        if not separator or len(name) != 1:
            raise AuthenticationFailedError(f"malformed SCRAM attribute {part!r}")
        attributes[name] = value
    return attributes


def _unescape_saslname(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramExchange:
    """RFC 5802 server side: client-first, server-first, client-final, server-final.

    The salt is new for each exchange and the salted password derived from the plain one: the
    terminator holds test passwords, not a credential store.
    """

    def __init__(self, passwords: Mapping[str, str], mechanism: str) -> None:
        self._passwords = passwords
        self._hash_name = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self.done = False
        self._step: Callable[[str], bytes] = self._answer_client_first
        self._user = ""
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._salt = secrets.token_bytes(16)

    def step(self, client_bytes: bytes) -> bytes:
        return self._step(client_bytes.decode(errors="replace"))

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash_name).digest()

    def _answer_client_first(self, client_first: str) -> bytes:
        # gs2-header: a channel-binding flag and an optional authzid, each ending with a comma.
        flag, _, rest = client_first.partition(",")
        authzid, _, client_first_bare = rest.partition(",")
        if flag not in ("n", "y") or not client_first_bare:
            raise AuthenticationFailedError("malformed SCRAM client-first message")
        attributes = _scram_attributes(client_first_bare)
        self._user = _unescape_saslname(attributes.get("n", ""))
        if self._user not in self._passwords:
            raise AuthenticationFailedError(f"Invalid username or password for user {self._user!r}")
        client_nonce = attributes.get("r", "")
        if not client_nonce:
            raise AuthenticationFailedError("SCRAM client-first message without a nonce")
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = client_first_bare
        self._nonce = client_nonce + secrets.token_urlsafe(18)
        salt = base64.b64encode(self._salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={SCRAM_ITERATIONS}"
        self._step = self._answer_client_final
        return self._server_first.encode()

    def _answer_client_final(self, client_final: str) -> bytes:
        without_proof, separator, proof_b64 = client_final.rpartition(",p=")
        if not separator:
            raise AuthenticationFailedError("SCRAM client-final message without a proof")
        attributes = _scram_attributes(without_proof)
        expected_binding = base64.b64encode(self._gs2_header.encode()).decode()
        if attributes.get("c") != expected_binding or attributes.get("r") != self._nonce:
            raise AuthenticationFailedError("SCRAM channel binding or nonce does not match")
        password = self._passwords[self._user].encode()
        salted = hashlib.pbkdf2_hmac(self._hash_name, password, self._salt, SCRAM_ITERATIONS)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash_name, client_key).digest()
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = self._hmac(stored_key, auth_message)
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise AuthenticationFailedError("SCRAM proof is not base64") from None
        if len(proof) != len(client_signature):
            raise AuthenticationFailedError(f"Invalid username or password for user {self._user!r}")
        recovered_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        if not hmac.compare_digest(
            hashlib.new(self._hash_name, recovered_key).digest(), stored_key
        ):
            raise AuthenticationFailedError(f"Invalid username or password for user {self._user!r}")
        server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        self.done = True
        return b"v=" + base64.b64encode(server_signature)


def exchange_for(mechanism: str, passwords: Mapping[str, str]) -> SaslExchange:
    """A fresh exchange for `mechanism` (one of MECHANISMS)."""
    factories: dict[str, Callable[[], SaslExchange]] = {
        "PLAIN": lambda: PlainExchange(passwords),
        "SCRAM-SHA-256": lambda: ScramExchange(passwords, "SCRAM-SHA-256"),
        "SCRAM-SHA-512": lambda: ScramExchange(passwords, "SCRAM-SHA-512"),
    }
    return factories[mechanism]()
