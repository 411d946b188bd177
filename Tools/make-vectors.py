#!/usr/bin/env python3
"""Generates the golden vectors of Ferry's event record format into Specs/vectors/.

An independent implementation of the record encoder of Specs/event-format.md (Python 3 standard
library only; CRC-32C is implemented here, bit by bit, not imported). It shares no code with the
Swift implementation in Sources/FerryLog, so a vector that the Swift decoder accepts shows that
both agree on the format.

Every input is fixed (ids, timestamps, payloads), so the output is byte-for-byte the same on every
run: re-running overwrites the same files with the same contents.

    python3 Tools/make-vectors.py              # writes into Specs/vectors/ of this repository
    python3 Tools/make-vectors.py --out DIR    # writes into DIR instead
"""

import argparse
import json
import os
import struct
import sys

# --- CRC-32C (Castagnoli) -------------------------------------------------------------------------

CRC32C_POLY_REFLECTED = 0x82F63B78


def crc32c(data: bytes) -> int:
    """CRC-32C: reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF.

    Deliberately the plain bitwise algorithm (no tables), unlike the Swift slicing-by-8 one.
    """
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            if crc & 1:
                crc = (crc >> 1) ^ CRC32C_POLY_REFLECTED
            else:
                crc >>= 1
    return crc ^ 0xFFFFFFFF


# (description, input bytes, expected CRC) — the expected values are published ones; the script
# refuses to write anything if its CRC does not reproduce them.
RFC3720_ISCSI_READ = bytes.fromhex(
    "01c00000000000000000000000000000"
    "14000000000004000000001400000018"
    "28000000000000000200000000000000"
)
KNOWN_CRCS = [
    ("empty input", b"", 0x00000000),
    ('check value: ASCII "123456789"', b"123456789", 0xE3069283),
    ("RFC 3720 B.4: 32 bytes of 0x00", bytes(32), 0x8A9136AA),
    ("RFC 3720 B.4: 32 bytes of 0xFF", b"\xff" * 32, 0x62A8AB43),
    ("RFC 3720 B.4: 32 incrementing bytes 0x00..0x1F", bytes(range(32)), 0x46DD794E),
    ("RFC 3720 B.4: 32 decrementing bytes 0x1F..0x00", bytes(range(31, -1, -1)), 0x113FDB5C),
    ("RFC 3720 B.4: an iSCSI SCSI Read (10) command PDU, 48 bytes", RFC3720_ISCSI_READ, 0xD9963A56),
]

# Further inputs whose CRC is computed here (lengths that exercise 8-byte blocks plus a remainder).
COMPUTED_CRC_INPUTS = [
    ('ASCII "a"', b"a"),
    ('ASCII "abc"', b"abc"),
    ("ASCII \"The quick brown fox jumps over the lazy dog\"", b"The quick brown fox jumps over the lazy dog"),
    ("7 bytes 0x01..0x07 (shorter than one 8-byte block)", bytes(range(1, 8))),
    ("9 bytes 0x01..0x09 (one 8-byte block and one byte)", bytes(range(1, 10))),
    ("all 256 byte values 0x00..0xFF, then 0x00..0x0C (269 bytes)", bytes(range(256)) + bytes(range(13))),
    ("1000 bytes, byte i = (i * 31 + 7) mod 256", bytes((i * 31 + 7) % 256 for i in range(1000))),
]


def check_crc_implementation() -> None:
    failures = []
    for description, data, expected in KNOWN_CRCS:
        got = crc32c(data)
        if got != expected:
            failures.append(f"  {description}: computed 0x{got:08x}, expected 0x{expected:08x}")
    if failures:
        sys.exit("make-vectors: the CRC-32C implementation does not reproduce the published values:\n"
                 + "\n".join(failures) + "\nNothing was written.")


# --- The record format ----------------------------------------------------------------------------

FORMAT_VERSION = 2
MAX_TYPE_LENGTH = 64
TYPE_ALPHABET = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
OVERHEAD = 1 + 1 + 2 + 8 + 16 + 4 + 8 + 4  # 44 bytes around the type and the payload (format 2)
MINIMUM_LENGTH = 37  # the shortest record of any format: format 1, 1-byte type, empty payload


def record_body(type_bytes: bytes, schema_version: int, timestamp: int, event_id: bytes, payload: bytes,
                format_version: int = FORMAT_VERSION, type_length: int = None,
                payload_length: int = None, sequence: int = None) -> bytes:
    """Every byte of a record before its CRC: format 2 ends with the sequence it is stored under,
    format 1 has none (pass sequence=None). The overrides exist to build invalid records."""
    assert len(event_id) == 16
    tail = b"" if sequence is None else struct.pack(">Q", sequence)
    return (
        struct.pack(">B", format_version)
        + struct.pack(">B", len(type_bytes) if type_length is None else type_length)
        + type_bytes
        + struct.pack(">H", schema_version)
        + struct.pack(">q", timestamp)
        + event_id
        + struct.pack(">I", len(payload) if payload_length is None else payload_length)
        + payload
        + tail
    )


def seal(body: bytes) -> bytes:
    """Appends the CRC-32C of `body`, big-endian."""
    return body + struct.pack(">I", crc32c(body))


def encode(type_name: str, schema_version: int, timestamp: int, event_id: bytes, payload: bytes,
           sequence: int = None, format_version: int = FORMAT_VERSION) -> bytes:
    """A valid record (format 2 stored under `sequence`, or format 1 without one); refuses inputs
    the format does not allow."""
    assert (format_version == 2) == (sequence is not None) and format_version in (1, 2)
    type_bytes = type_name.encode("ascii")
    assert 1 <= len(type_bytes) <= MAX_TYPE_LENGTH and set(type_bytes) <= TYPE_ALPHABET, type_name
    assert 1 <= schema_version <= 0xFFFF
    assert -(1 << 63) <= timestamp < (1 << 63)
    assert len(payload) <= 0xFFFFFFFF
    if sequence is not None:
        assert 0 <= sequence < (1 << 64)
    return seal(record_body(type_bytes, schema_version, timestamp, event_id, payload,
                            format_version=format_version, sequence=sequence))


def uuid7(unix_ms: int, tail: bytes) -> bytes:
    """A UUIDv7-layout id with fixed (not random) bits: 48-bit milliseconds, version 7, variant 10."""
    assert len(tail) == 10
    b = bytearray(unix_ms.to_bytes(8, "big", signed=True)[2:] + tail)
    b[6] = (b[6] & 0x0F) | 0x70
    b[8] = (b[8] & 0x3F) | 0x80
    return bytes(b)


# --- The vectors ----------------------------------------------------------------------------------

ID_SEQUENTIAL = bytes(range(0x10, 0x20))        # a caller-chosen id: any 16 bytes
ID_ZERO = bytes(16)
ID_FF = b"\xff" * 16
TS_TYPICAL = 1_700_000_000_000                  # 2023-11-14T22:13:20Z
TS_APOLLO = -14_182_940_000                     # 1969-07-20T20:17:40Z, before the epoch
ID_TYPICAL = uuid7(TS_TYPICAL, bytes.fromhex("0123456789abcdef0123"))
TYPICAL_PAYLOAD = '{"id":"t-1","title":"Buy milk ü"}'.encode("utf-8")
TYPE_64 = "a.b_c:d-" + "".join("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"[i % 62]
                               for i in range(56))
assert len(TYPE_64) == 64
PAYLOAD_300 = bytes(range(256)) + bytes(range(44))


def valid(name, description, sequence, type_name, schema_version, timestamp, event_id, payload,
          format_version=FORMAT_VERSION):
    record = encode(type_name, schema_version, timestamp, event_id, payload,
                    sequence=sequence if format_version == 2 else None, format_version=format_version)
    return name, {
        "description": description,
        "sequence": sequence,
        "hex": record.hex(),
        "expect": {
            "formatVersion": format_version,
            "type": type_name,
            "schemaVersion": schema_version,
            "timestamp": timestamp,
            "eventId": event_id.hex(),
            "payloadHex": payload.hex(),
            "crc32c": f"0x{crc32c(record[:-4]):08x}",
        },
    }


def invalid(name, description, sequence, record, error):
    return name, {"description": description, "sequence": sequence, "hex": record.hex(), "error": error}


def flip(data: bytes, index: int, mask: int = 0x01) -> bytes:
    b = bytearray(data)
    b[index] ^= mask
    return bytes(b)


def crc_matches(record: bytes) -> bool:
    return len(record) >= 4 and struct.unpack(">I", record[-4:])[0] == crc32c(record[:-4])


def build_record_vectors():
    vectors = []

    vectors.append(valid(
        "record-001-minimal",
        "Smallest valid record: 1-byte type, schema version 1, timestamp 0, all-zero id, empty payload "
        "(45 bytes, the shortest record of format 2).",
        1, "a", 1, 0, ID_ZERO, b""))
    vectors.append(valid(
        "record-002-typical",
        "Typical record: type \"task.added\", schema version 1, a UUIDv7-layout id, a UTF-8 JSON payload "
        "(with a non-ASCII character).",
        2, "task.added", 1, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD))
    vectors.append(valid(
        "record-003-schema3-negative-timestamp",
        "Schema version 3 and a negative timestamp (1969-07-20T20:17:40Z, before the Unix epoch); "
        "a caller-chosen id that is not UUIDv7.",
        42, "moon:landed", 3, TS_APOLLO, ID_SEQUENTIAL, b"\x00\x01\x02"))
    vectors.append(valid(
        "record-004-type-64",
        "The longest type: 64 bytes, using every character class of the alphabet (A-Z a-z 0-9 . _ : -).",
        1000, TYPE_64, 1, TS_TYPICAL + 1, ID_FF, b"x"))
    vectors.append(valid(
        "record-005-payload-300-all-bytes",
        "A 300-byte payload holding every byte value 0x00..0xFF, then 0x00..0x2B; schema version 65535 "
        "(the largest).",
        123456789, "blob.stored", 65535, TS_TYPICAL + 2, ID_SEQUENTIAL, PAYLOAD_300))
    vectors.append(valid(
        "record-006-timestamp-minus-one",
        "Timestamp -1 (all 64 bits set, 1969-12-31T23:59:59.999Z); a 4-byte payload e3069283 that "
        "looks like a CRC trailer but is payload.",
        3, "x-y_z.w:v", 2, -1, ID_TYPICAL, bytes.fromhex("e3069283")))
    vectors.append(valid(
        "record-007-format1-typical",
        "record-002's event in the old format 1 (no sequence inside, 37-byte minimum): still read, "
        "never written. Format 1 cannot tell which key it is stored under.",
        2, "task.added", 1, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD, format_version=1))
    vectors.append(valid(
        "record-008-format1-minimal-any-key",
        "The shortest format 1 record (37 bytes), stored under sequence 99: format 1 decodes under any key.",
        99, "a", 1, 0, ID_ZERO, b"", format_version=1))
    vectors.append(valid(
        "record-009-sequence-max",
        "A format 2 record stored under the largest sequence number, 2^64 - 1.",
        (1 << 64) - 1, "a", 1, 0, ID_ZERO, b""))

    typical = encode("task.added", 1, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD, sequence=2)
    type_offset = 2
    payload_offset = len(typical) - 12 - len(TYPICAL_PAYLOAD)

    # Invalid records. Each is checked below to fail at the step its description names.
    flipped_payload = flip(typical, payload_offset + 5)
    assert not crc_matches(flipped_payload)
    vectors.append(invalid(
        "record-101-payload-bit-flipped",
        "record-002 with one bit of a payload byte flipped: the CRC does not match.",
        2, flipped_payload, "corruptRecord"))

    flipped_crc = flip(typical, len(typical) - 1, 0x80)
    assert not crc_matches(flipped_crc)
    vectors.append(invalid(
        "record-102-crc-bit-flipped",
        "record-002 with one bit of its stored CRC flipped: the CRC does not match.",
        2, flipped_crc, "corruptRecord"))

    truncated = typical[:-5]
    assert len(truncated) >= OVERHEAD + 1 and not crc_matches(truncated)
    vectors.append(invalid(
        "record-103-truncated",
        "record-002 with its last 5 bytes removed: long enough to pass the length check, but its last "
        "4 bytes are not the CRC of the rest.",
        2, truncated, "corruptRecord"))

    v3 = seal(record_body(b"task.added", 1, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD, format_version=3,
                          sequence=2))
    assert crc_matches(v3)
    vectors.append(invalid(
        "record-104-format-version-3",
        "record-002 written with format version 3 (CRC recomputed, so only the version is wrong): a "
        "newer format than the decoder reads.",
        2, v3, "unsupportedRecordFormat"))

    trailing = seal(record_body(b"task.added", 1, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD, sequence=2)
                    + b"\x00")
    assert crc_matches(trailing)
    vectors.append(invalid(
        "record-105-trailing-byte",
        "record-002 with one extra byte (0x00) after the sequence, inside the CRC coverage (CRC "
        "recomputed): the CRC passes, parsing finds 1 byte after the sequence.",
        2, trailing, "corruptRecord"))

    empty_type = seal(record_body(b"", 1, TS_TYPICAL, ID_TYPICAL, b"abc", sequence=7))
    assert crc_matches(empty_type) and len(empty_type) >= OVERHEAD + 1
    vectors.append(invalid(
        "record-106-type-length-0",
        "typeLength 0 (empty type) with a valid CRC; a 3-byte payload keeps it at the minimum length, "
        "so it fails the type check, not the length check.",
        7, empty_type, "corruptRecord"))

    # Extra cases, one per remaining decoding rule.
    too_short = encode("a", 1, 0, ID_ZERO, b"", sequence=1)[:MINIMUM_LENGTH - 1]
    assert len(too_short) == 36
    vectors.append(invalid(
        "record-107-shorter-than-minimum",
        "36 bytes (the first 36 of record-001): shorter than the 37-byte minimum of any format.",
        1, too_short, "corruptRecord"))

    v3_bad_crc = flip(v3, payload_offset + 5)
    assert not crc_matches(v3_bad_crc)
    vectors.append(invalid(
        "record-108-format-version-3-bad-crc",
        "record-104 (format version 3) with a payload bit flipped as well: the CRC is checked "
        "before the version, so damage reads as damage: corruptRecord.",
        2, v3_bad_crc, "corruptRecord"))

    v0 = seal(record_body(b"task.added", 1, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD, format_version=0,
                          sequence=2))
    assert crc_matches(v0)
    vectors.append(invalid(
        "record-109-format-version-0",
        "record-002 with format version 0 (CRC recomputed): version 0 was never valid.",
        2, v0, "corruptRecord"))

    bad_char = seal(record_body(b"task added", 1, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD, sequence=2))
    assert crc_matches(bad_char)
    vectors.append(invalid(
        "record-110-type-with-space",
        "A type containing a space (\"task added\"), valid CRC: the type is not a valid name.",
        2, bad_char, "corruptRecord"))

    long_type = seal(record_body(("a" * 65).encode(), 1, TS_TYPICAL, ID_TYPICAL, b"", sequence=2))
    assert crc_matches(long_type)
    vectors.append(invalid(
        "record-111-type-65-bytes",
        "A 65-byte type (one over the maximum), valid CRC.",
        2, long_type, "corruptRecord"))

    non_ascii = seal(record_body("tâsk".encode("utf-8"), 1, TS_TYPICAL, ID_TYPICAL, b"", sequence=2))
    assert crc_matches(non_ascii)
    vectors.append(invalid(
        "record-112-type-non-ascii",
        "A type with a non-ASCII UTF-8 character (\"tâsk\"), valid CRC.",
        2, non_ascii, "corruptRecord"))

    long_payload_length = seal(record_body(b"task.added", 1, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD,
                                           payload_length=len(TYPICAL_PAYLOAD) + 1, sequence=2))
    assert crc_matches(long_payload_length)
    vectors.append(invalid(
        "record-113-payload-length-too-large",
        "payloadLength one more than the payload bytes present, valid CRC: truncated at the payload.",
        2, long_payload_length, "corruptRecord"))

    long_type_length = seal(record_body(b"a", 1, 0, ID_ZERO, b"", type_length=255, sequence=1))
    assert crc_matches(long_type_length)
    vectors.append(invalid(
        "record-114-type-length-past-end",
        "typeLength 255 but only 1 type byte followed by the rest of a minimal record, valid CRC: "
        "truncated at the type.",
        1, long_type_length, "corruptRecord"))

    schema0 = seal(record_body(b"task.added", 0, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD, sequence=2))
    assert crc_matches(schema0)
    vectors.append(invalid(
        "record-115-schema-version-0",
        "record-002 with schema version 0 (CRC recomputed): schema versions start at 1.",
        2, schema0, "corruptRecord"))

    first_byte_flipped = flip(typical, 0, 0x01)
    assert not crc_matches(first_byte_flipped)
    vectors.append(invalid(
        "record-116-format-byte-damaged",
        "record-002 with its format-version byte damaged (0x02 -> 0x03), CRC not recomputed: "
        "corruptRecord, not a newer format.",
        2, first_byte_flipped, "corruptRecord"))

    vectors.append(invalid(
        "record-117-stored-under-another-key",
        "record-002 (written as sequence 2) found under key 3, as a record copied or misplaced by "
        "damage would be: the CRC passes, the sequence inside it disagrees with its key.",
        3, typical, "corruptRecord"))

    no_sequence = seal(record_body(b"task.added", 1, TS_TYPICAL, ID_TYPICAL, TYPICAL_PAYLOAD))
    assert crc_matches(no_sequence)
    vectors.append(invalid(
        "record-118-format2-without-sequence",
        "record-002's fields under format version 2 but without the sequence (CRC recomputed): "
        "truncated at the sequence.",
        2, no_sequence, "corruptRecord"))

    valid_crc_sanity = [v for v in vectors if "expect" in v[1]]
    for _, vector in valid_crc_sanity:
        assert crc_matches(bytes.fromhex(vector["hex"]))
    assert bytes.fromhex(vectors[1][1]["hex"]) == typical
    assert typical[type_offset:type_offset + 10] == b"task.added"
    return vectors


def build_crc_vectors():
    cases = [{"description": d, "inputHex": data.hex(), "crc32c": f"0x{expected:08x}"}
             for d, data, expected in KNOWN_CRCS]
    cases += [{"description": d, "inputHex": data.hex(), "crc32c": f"0x{crc32c(data):08x}"}
              for d, data in COMPUTED_CRC_INPUTS]
    return cases


def write_json(path: str, value) -> None:
    text = json.dumps(value, indent=2, ensure_ascii=False) + "\n"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"wrote {path} ({len(text.encode('utf-8'))} bytes)")


def payload_string(text: str) -> bytes:
    """A payload string field (task-events.md section 1): u32 byte count, then UTF-8."""
    data = text.encode("utf-8")
    return struct.pack(">I", len(data)) + data


def build_upcast_vectors():
    """The schema-evolution worked example (Specs/schema-evolution.md): a `note.saved` record at
    schema version 1 (text), and the payload its upcaster 1 -> 2 must produce (text, pinned=false)."""
    event_id = bytes.fromhex("019bbf5a6f0070008000000000000001")
    v1_payload = payload_string("buy milk")
    record = encode("note.saved", 1, 1768467600000, event_id, v1_payload, format_version=1)
    v2_payload = v1_payload + b"\x00"
    return [("upcast-001-note-v1", {
        "description": "A note.saved record at schema version 1 (payload: text). Version 2 adds a pinned "
                       "flag; its upcaster appends false. The stored bytes never change: reading with the "
                       "version 2 catalog gives the version 2 payload below.",
        "sequence": 1,
        "hex": record.hex(),
        "type": "note.saved",
        "storedSchemaVersion": 1,
        "timestamp": 1768467600000,
        "eventId": event_id.hex(),
        "v1PayloadHex": v1_payload.hex(),
        "upcastSchemaVersion": 2,
        "upcastPayloadHex": v2_payload.hex(),
    })]


def build_task_vectors():
    """Schema version 2 of task.runStarted and task.errorRecorded (Specs/task-events.md 2.1): a
    version 1 record of each with the payload its upcaster must produce, and a version 2 record
    as Ferry must encode it. And task.payloadUpdated (2.2) as Ferry must encode it."""
    event_id = bytes.fromhex("019bbf5a6f0070008000000000000002")
    ts = 1768467600123
    task_id = struct.pack(">Q", 42)
    attempt = struct.pack(">I", 3)
    owner = payload_string("1f2e-00112233aabbccdd")
    runner = struct.pack(">I", 7)
    started_v1 = task_id + attempt
    started_v2 = task_id + attempt + owner + runner
    error_v1 = task_id + payload_string("Log in to upload")
    new_payload = b'{"item":"oat milk"}'
    updated = task_id + struct.pack(">I", len(new_payload)) + new_payload
    vectors = [
        ("upcast-002-task-runStarted-v1", {
            "description": "task.runStarted at schema version 1 (taskId 42, attempt 3). Version 2 adds the "
                           "claim's owner and runner; the upcaster appends an empty owner (u32 length 0) "
                           "and runner 0.",
            "sequence": 50, "hex": encode("task.runStarted", 1, ts, event_id, started_v1, format_version=1).hex(),
            "type": "task.runStarted", "storedSchemaVersion": 1, "timestamp": ts, "eventId": event_id.hex(),
            "v1PayloadHex": started_v1.hex(), "upcastSchemaVersion": 2,
            "upcastPayloadHex": (started_v1 + struct.pack(">I", 0) + struct.pack(">I", 0)).hex(),
        }),
        ("upcast-003-task-errorRecorded-v1", {
            "description": "task.errorRecorded at schema version 1 (taskId 42, \"Log in to upload\"), which "
                           "only a run's outcome ever logged. Version 2 adds endsRun; the upcaster appends "
                           "true (1).",
            "sequence": 51, "hex": encode("task.errorRecorded", 1, ts, event_id, error_v1, format_version=1).hex(),
            "type": "task.errorRecorded", "storedSchemaVersion": 1, "timestamp": ts, "eventId": event_id.hex(),
            "v1PayloadHex": error_v1.hex(), "upcastSchemaVersion": 2,
            "upcastPayloadHex": (error_v1 + b"\x01").hex(),
        }),
        ("task-001-runStarted-v2", {
            "description": "task.runStarted at schema version 2: taskId 42, attempt 3, owner "
                           "\"1f2e-00112233aabbccdd\", runner 7.",
            "sequence": 52, "hex": encode("task.runStarted", 2, ts, event_id, started_v2, sequence=52).hex(),
            "type": "task.runStarted", "schemaVersion": 2, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": started_v2.hex(),
        }),
        ("task-002-errorRecorded-v2", {
            "description": "task.errorRecorded at schema version 2 recorded by the app (endsRun false): "
                           "taskId 42, \"Log in to upload\".",
            "sequence": 53,
            "hex": encode("task.errorRecorded", 2, ts, event_id, error_v1 + b"\x00", sequence=53).hex(),
            "type": "task.errorRecorded", "schemaVersion": 2, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": (error_v1 + b"\x00").hex(),
        }),
        ("task-003-payloadUpdated", {
            "description": "task.payloadUpdated at schema version 1 (Specs/task-events.md 2.2): taskId 42, "
                           "then the new payload as bytes (u32 count, then the JSON {\"item\":\"oat milk\"}).",
            "sequence": 54,
            "hex": encode("task.payloadUpdated", 1, ts, event_id, updated, sequence=54).hex(),
            "type": "task.payloadUpdated", "schemaVersion": 1, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": updated.hex(),
        }),
    ]
    vectors += build_priority_vectors(ts, event_id)
    vectors += build_sync_vectors(ts, event_id)
    vectors += build_schedule_vectors(ts, event_id)
    return vectors


def build_schedule_vectors(ts, event_id):
    """Schema version 3 of task.added (Specs/task-events.md 2.6): startAt i64? and interval i64?
    appended to version 2, and of task.runStarted (2.7): batch u64? appended to version 2. The
    version 2 records with the payloads their upcasters must produce, and version 3 records as
    Ferry must encode them."""
    task_payload = b'{"id":7}'
    base = (payload_string("save-note") + struct.pack(">I", len(task_payload)) + task_payload
            + payload_optional_string("note-7") + payload_optional_string("notes")
            + b"\x00" + b"\x00")  # not manual, unique 0 (append)
    added_v2 = base + struct.pack(">b", 1) + b"\x01" + struct.pack(">q", 1768467660123)
    start = 1768471200000  # 2026-01-15T10:00:00Z
    interval = 900000  # 15 minutes
    added_start = base + b"\x00" + b"\x00" + b"\x01" + struct.pack(">q", start) + b"\x00"
    added_every = (base + b"\x00" + b"\x00" + b"\x01" + struct.pack(">q", start)
                   + b"\x01" + struct.pack(">q", interval))
    owner = "1f2e-00112233aabbccdd"
    started_v2 = (struct.pack(">Q", 42) + struct.pack(">I", 3) + payload_string(owner) + struct.pack(">I", 7))
    started_batch = started_v2 + b"\x01" + struct.pack(">Q", 40)
    return [
        ("upcast-007-task-runStarted-v2", {
            "description": "task.runStarted at schema version 2 (the claim of task-001: taskId 42, attempt 3, "
                           "owner \"1f2e-00112233aabbccdd\", runner 7). Version 3 adds batch (u64?, the first "
                           "task of the batch the run was claimed in); the upcaster appends an absent one "
                           "(presence byte 0): a run on its own.",
            "sequence": 65, "hex": encode("task.runStarted", 2, ts, event_id, started_v2, sequence=65).hex(),
            "type": "task.runStarted", "storedSchemaVersion": 2, "timestamp": ts, "eventId": event_id.hex(),
            "v2PayloadHex": started_v2.hex(), "upcastSchemaVersion": 3,
            "upcastPayloadHex": (started_v2 + b"\x00").hex(),
        }),
        ("task-011-runStarted-v3-batch", {
            "description": "task.runStarted at schema version 3: the same claim, made in the batch whose "
                           "first task is 40.",
            "sequence": 66, "hex": encode("task.runStarted", 3, ts, event_id, started_batch, sequence=66).hex(),
            "type": "task.runStarted", "schemaVersion": 3, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": started_batch.hex(),
        }),
        ("upcast-006-task-added-v2", {
            "description": "task.added at schema version 2 (the add of task-004: priority 1, deadline "
                           "1768467660123). Version 3 adds startAt (i64?) and interval (i64?); the upcaster "
                           "appends two absent optionals (presence bytes 0 0): it starts at once, and runs once.",
            "sequence": 62, "hex": encode("task.added", 2, ts, event_id, added_v2, sequence=62).hex(),
            "type": "task.added", "storedSchemaVersion": 2, "timestamp": ts, "eventId": event_id.hex(),
            "v2PayloadHex": added_v2.hex(), "upcastSchemaVersion": 3,
            "upcastPayloadHex": (added_v2 + b"\x00" + b"\x00").hex(),
        }),
        ("task-009-added-v3-start", {
            "description": "task.added at schema version 3: the add of upcast-004 (priority 0, no deadline) "
                           "that starts at 1768471200000 (Unix ms) and runs once.",
            "sequence": 63, "hex": encode("task.added", 3, ts, event_id, added_start, sequence=63).hex(),
            "type": "task.added", "schemaVersion": 3, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": added_start.hex(),
        }),
        ("task-010-added-v3-every", {
            "description": "task.added at schema version 3: the same add, starting at 1768471200000 and "
                           "repeating every 900000 ms (15 minutes) after each success.",
            "sequence": 64, "hex": encode("task.added", 3, ts, event_id, added_every, sequence=64).hex(),
            "type": "task.added", "schemaVersion": 3, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": added_every.hex(),
        }),
    ]


def build_sync_vectors(ts, event_id):
    """task.runSucceeded at schema version 2 (an output and the cache keys it makes stale), its
    version 1 and upcast, and task.runDeferred (Specs/task-events.md 2, 2.1)."""
    task_id = struct.pack(">Q", 42)
    output = b'{"id":"srv-7"}'
    succeeded_v2 = (task_id + b"\x01" + struct.pack(">I", len(output)) + output + struct.pack(">I", 2)
                    + payload_string("notes") + payload_string("note/7"))
    deferred = task_id + payload_string("offline")
    return [
        ("upcast-005-task-runSucceeded-v1", {
            "description": "task.runSucceeded at schema version 1 (taskId 42). Version 2 adds an output "
                           "(bool, then bytes when present) and the cache keys it makes stale (u32 count, "
                           "then strings); the upcaster appends an absent output (0) and a count of 0.",
            "sequence": 59, "hex": encode("task.runSucceeded", 1, ts, event_id, task_id, sequence=59).hex(),
            "type": "task.runSucceeded", "storedSchemaVersion": 1, "timestamp": ts, "eventId": event_id.hex(),
            "v1PayloadHex": task_id.hex(), "upcastSchemaVersion": 2,
            "upcastPayloadHex": (task_id + b"\x00" + struct.pack(">I", 0)).hex(),
        }),
        ("task-007-runSucceeded-v2", {
            "description": "task.runSucceeded at schema version 2: taskId 42, output {\"id\":\"srv-7\"}, "
                           "cache keys \"notes\" and \"note/7\".",
            "sequence": 60, "hex": encode("task.runSucceeded", 2, ts, event_id, succeeded_v2, sequence=60).hex(),
            "type": "task.runSucceeded", "schemaVersion": 2, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": succeeded_v2.hex(),
        }),
        ("task-008-runDeferred", {
            "description": "task.runDeferred at schema version 1: taskId 42, reason \"offline\".",
            "sequence": 61, "hex": encode("task.runDeferred", 1, ts, event_id, deferred, sequence=61).hex(),
            "type": "task.runDeferred", "schemaVersion": 1, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": deferred.hex(),
        }),
    ]


def payload_optional_string(text):
    """A payload string? field: a presence byte, then the string when present."""
    return b"\x00" if text is None else b"\x01" + payload_string(text)


def build_priority_vectors(ts, event_id):
    """Schema version 2 of task.added (Specs/task-events.md 2.3): priority i8 and deadline i64?
    appended to version 1. A version 1 record with the payload its upcaster must produce (priority
    0, no deadline), version 2 records as Ferry must encode them, and task.expired (2.4)."""
    task_payload = b'{"id":7}'
    added_v1 = (payload_string("save-note") + struct.pack(">I", len(task_payload)) + task_payload
                + payload_optional_string("note-7") + payload_optional_string("notes")
                + b"\x00"      # manual: false
                + b"\x00")     # unique: 0 (append)
    deadline = 1768467660123
    added_high = added_v1 + struct.pack(">b", 1) + b"\x01" + struct.pack(">q", deadline)
    added_low = added_v1 + struct.pack(">b", -1) + b"\x00"
    expired = struct.pack(">Q", 42)
    return [
        ("upcast-004-task-added-v1", {
            "description": "task.added at schema version 1: tag \"save-note\", payload {\"id\":7}, dataId "
                           "\"note-7\", groupId \"notes\", not manual, unique 0. Version 2 adds priority (i8) "
                           "and deadline (i64?); the upcaster appends priority 0 (normal) and an absent "
                           "deadline (presence byte 0).",
            "sequence": 55, "hex": encode("task.added", 1, ts, event_id, added_v1, sequence=55).hex(),
            "type": "task.added", "storedSchemaVersion": 1, "timestamp": ts, "eventId": event_id.hex(),
            "v1PayloadHex": added_v1.hex(), "upcastSchemaVersion": 2,
            "upcastPayloadHex": (added_v1 + b"\x00" + b"\x00").hex(),
        }),
        ("task-004-added-v2-high-deadline", {
            "description": "task.added at schema version 2: the add of upcast-004 with priority 1 (high) "
                           "and deadline 1768467660123 (Unix ms).",
            "sequence": 56, "hex": encode("task.added", 2, ts, event_id, added_high, sequence=56).hex(),
            "type": "task.added", "schemaVersion": 2, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": added_high.hex(),
        }),
        ("task-005-added-v2-low", {
            "description": "task.added at schema version 2: the add of upcast-004 with priority -1 (low, "
                           "the byte ff) and no deadline.",
            "sequence": 57, "hex": encode("task.added", 2, ts, event_id, added_low, sequence=57).hex(),
            "type": "task.added", "schemaVersion": 2, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": added_low.hex(),
        }),
        ("task-006-expired", {
            "description": "task.expired at schema version 1 (Specs/task-events.md 2.4): taskId 42.",
            "sequence": 58, "hex": encode("task.expired", 1, ts, event_id, expired, sequence=58).hex(),
            "type": "task.expired", "schemaVersion": 1, "timestamp": ts, "eventId": event_id.hex(),
            "payloadHex": expired.hex(),
        }),
    ]


def main() -> None:
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description="Writes Ferry's record-format golden vectors.")
    parser.add_argument("--out", default=os.path.join(repository, "Specs", "vectors"),
                        help="output directory (default: Specs/vectors of this repository)")
    arguments = parser.parse_args()

    check_crc_implementation()
    record_vectors = build_record_vectors()
    crc_vectors = build_crc_vectors()

    os.makedirs(arguments.out, exist_ok=True)
    write_json(os.path.join(arguments.out, "crc32c.json"), crc_vectors)
    for name, vector in record_vectors + build_upcast_vectors() + build_task_vectors():
        write_json(os.path.join(arguments.out, name + ".json"), vector)
    print(f"{len(record_vectors)} record vectors and {len(crc_vectors)} CRC-32C cases in {arguments.out}")


if __name__ == "__main__":
    main()
