"""The wire codec of docs/protocol.md §3 (acceptance §11.2)."""
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings, strategies as st

from worldcell import codec

pytestmark = pytest.mark.any_database  # runs in the PostgreSQL pass only


def dt(text):
    return codec.parse_date_string(text)


def test_it_tags_dates_with_millisecond_utc_iso():
    value = datetime(2026, 1, 2, 3, 4, 5, 678999, tzinfo=timezone.utc)
    assert codec.encode(value) == '{"__type":"Date","iso":"2026-01-02T03:04:05.678Z"}'
    assert codec.encode(datetime(1970, 1, 1, tzinfo=timezone.utc)) == '{"__type":"Date","iso":"1970-01-01T00:00:00.000Z"}'


@pytest.mark.parametrize("iso", ["2026-01-02T03:04:05.678Z", "1999-12-31T23:59:59.999Z", "1970-01-01T00:00:00.000Z"])
def test_it_round_trips_dates_at_any_depth(iso):
    text = codec.encode({"createdAt": dt(iso), "x": {"someRandomField": dt(iso)}, "list": [dt(iso)]})
    back = codec.decode(text)
    assert back == {"createdAt": dt(iso), "x": {"someRandomField": dt(iso)}, "list": [dt(iso)]}
    assert codec.format_iso(back["list"][0]) == iso


def test_it_round_trips_bytes_including_large_arrays():
    assert codec.decode(codec.encode(bytes([0, 1, 2, 253, 254, 255]))) == bytes([0, 1, 2, 253, 254, 255])
    big = bytes(i % 256 for i in range(200_000))
    back = codec.decode(codec.encode([big]))[0]
    assert back[199_999] == 199_999 % 256 and back == big
    assert codec.encode(b"") == '{"__type":"Uint8Array","data":""}'


def test_it_revives_untagged_iso_strings_only_under_date_fields():
    back = codec.decode(
        '{"createdAt":"2020-01-01T00:00:00Z","note":"2020-01-01T00:00:00Z","startedAt":"garbage",'
        '"deep":[{"retryAfter":"2020-01-01"}]}'
    )
    assert back["createdAt"] == datetime(2020, 1, 1, tzinfo=timezone.utc)
    assert back["note"] == "2020-01-01T00:00:00Z"
    assert back["startedAt"] == "garbage"
    assert back["deep"][0]["retryAfter"] == datetime(2020, 1, 1, tzinfo=timezone.utc)
    assert codec.encode(back["createdAt"]) == '{"__type":"Date","iso":"2020-01-01T00:00:00.000Z"}'


def test_it_keeps_the_legacy_bytes_form_as_a_plain_object():
    legacy = {"__uint8array": True, "data": [1, 2]}
    assert codec.decode(codec.encode(legacy)) == legacy


def test_it_passes_ordinary_json_through():
    value = ["wrun_1", {"pagination": {"limit": 5}}, None, True, 42]
    assert codec.decode(codec.encode(value)) == value


@pytest.mark.parametrize(
    "iso,expected",
    [
        ("2020-01-01T00:00:00+02:00", "2019-12-31T22:00:00.000Z"),
        ("2020-01-01T00:00:00.123456Z", "2020-01-01T00:00:00.123Z"),
        ("2020-01-01T10:11", "2020-01-01T10:11:00.000Z"),
        ("2020-01-01", "2020-01-01T00:00:00.000Z"),
    ],
)
def test_it_parses_iso_forms_and_truncates_to_milliseconds(iso, expected):
    assert codec.format_iso(codec.parse_date_string(iso)) == expected


@pytest.mark.parametrize("text", ["", "[", "NaN", "[Infinity]", '[{"__type":"Uint8Array","data":"!!!"}]',
                                  '[{"__type":"Date","iso":"not a date"}]', '[{"__type":"Uint8Array","data":"A"}]'])
def test_it_rejects_malformed_bodies(text):
    with pytest.raises(codec.DecodeError):
        codec.decode(text)


def test_it_decodes_base64_leniently_like_atob():
    assert codec.decode('{"__type":"Uint8Array","data":"aGk"}') == b"hi"
    assert codec.decode('{"__type":"Uint8Array","data":" aG k= "}') == b"hi"


def test_it_replaces_invalid_utf8_and_drops_a_bom():
    assert codec.decode(b'\xef\xbb\xbf["a\xff"]') == ["a\ufffd"]


def test_it_encodes_u0000_and_astral_characters_as_ascii_escapes():
    text = codec.encode({"s": "nul\u0000 \U0001F600 é"})
    assert text.isascii()
    assert codec.decode(text) == {"s": "nul\u0000 \U0001F600 é"}


def test_it_never_emits_nan():
    with pytest.raises(ValueError):
        codec.encode(float("nan"))


def test_it_treats_integral_floats_like_javascript_numbers():
    assert codec.encode(codec.decode("[1.0, 2.5, 1e3]")) == "[1,2.5,1000]"


def test_it_fails_cleanly_on_absurd_nesting():
    with pytest.raises(codec.DecodeError):
        codec.decode("[" * 100_000 + "]" * 100_000)


# ----------------------------------------------------------------------- properties

millis = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59), timezones=st.just(timezone.utc)
).map(codec.to_utc_ms)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.floats(allow_nan=False, allow_infinity=False),
    st.text(), st.binary(), millis,
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(max_size=8).filter(lambda k: k != "__type"), children, max_size=5),
    ),
    max_leaves=30,
)


def _normalise(value):
    """What a JavaScript peer would hold after a round trip (1.0 is 1)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    return value


def _without_date_fields_strings(value):
    # A string under a DATE_FIELDS key that parses as ISO is revived by design (§3.2 rule 3).
    if isinstance(value, dict):
        return {
            k: v for k, v in ((k, _without_date_fields_strings(v)) for k, v in value.items())
            if not (k in codec.DATE_FIELDS and isinstance(v, str) and codec.parse_date_string(v))
        }
    if isinstance(value, list):
        return [_without_date_fields_strings(v) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(values)
def test_it_round_trips_arbitrary_values(value):
    value = _without_date_fields_strings(value)
    text = codec.encode(value)
    assert text.isascii()
    assert codec.decode(text) == _normalise(value)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048))
def test_it_round_trips_arbitrary_bytes_including_non_utf8(data):
    assert codec.decode(codec.encode({"b": data})) == {"b": data}


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_it_round_trips_any_unicode_text_including_surrogates_and_nul(text):
    assert codec.decode(codec.encode([text])) == [text]


@pytest.mark.parametrize("key,four,eight", [("k-1", 0, 4), ("a", 0, 4), ("b", 1, 5), ("step-123", 2, 2), ("msg_x", 1, 5)])
def test_it_picks_the_same_queue_shard_as_the_js_client(key, four, eight):
    from worldcell_client import shard_for

    assert (shard_for(key, 4), shard_for(key, 8), shard_for(key, 1)) == (four, eight, 0)


# ----------------------------------------------------------------------- the date fast paths

def _utc_ms_reference(value: datetime) -> datetime:
    """The UTC instant of ``value`` (naive = UTC) truncated to milliseconds (the codec's former formula)."""
    v = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return v.replace(microsecond=v.microsecond - v.microsecond % 1000)


def _iso_field_by_field(value: datetime) -> str:
    """``toISOString()`` computed field by field (the codec's former formula)."""
    v = _utc_ms_reference(value)
    return (f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:{v.second:02d}."
            f"{v.microsecond // 1000:03d}Z")


any_datetimes = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),  # naive = UTC
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(timezone.utc)),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.timezones()),
)


@settings(max_examples=400, deadline=None)
@given(any_datetimes)
def test_format_iso_and_to_utc_ms_agree_with_the_field_by_field_formula(value):
    assert codec.format_iso(value) == _iso_field_by_field(value)
    ms = codec.to_utc_ms(value)
    assert ms.tzinfo is timezone.utc and ms.microsecond % 1000 == 0
    reference = _utc_ms_reference(value)
    assert (ms.tzinfo, ms.timetuple(), ms.microsecond) == (reference.tzinfo, reference.timetuple(), reference.microsecond)
    assert codec.to_utc_ms(ms) is ms  # an already-truncated UTC value is returned as it is
