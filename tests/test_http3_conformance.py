"""RFC 9114 (HTTP/3) and RFC 9204 (QPACK) requirements a server can get
wrong, over raw streams and frames (``tests/h3frames.py`` on aioquic's
QuicConnection). Each test cites the section whose MUST it checks, asserts
the server's exact reaction (the connection closed with the named code,
the stream reset or stopped with it, or a normal response), and that bad
input loses nothing else: the same connection still serves a request after
a stream error, a fresh connection does after a connection error.

Most of this is h3 0.0.8's doing; what Skirr adds is that malformed
requests never reach the app (checked through the app's ``/paths``), and
its GOAWAY on drain."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest
from harness import wait_until

pytest.importorskip("aioquic")
pytest.importorskip("trustme")
from aioquic.buffer import Buffer  # noqa: E402
from h3client import run  # noqa: E402
from h3frames import (  # noqa: E402
    CANCEL_PUSH,
    CONTROL,
    DATA,
    GOAWAY,
    H2_FRAME_TYPES,
    H3_CLOSED_CRITICAL_STREAM,
    H3_FRAME_ERROR,
    H3_FRAME_UNEXPECTED,
    H3_ID_ERROR,
    H3_MESSAGE_ERROR,
    H3_MISSING_SETTINGS,
    H3_NO_ERROR,
    H3_REQUEST_INCOMPLETE,
    H3_REQUEST_REJECTED,
    H3_SETTINGS_ERROR,
    H3_STREAM_CREATION_ERROR,
    HEADERS,
    MAX_FIELD_SECTION_SIZE,
    MAX_PUSH_ID,
    PUSH,
    PUSH_PROMISE,
    QPACK_BLOCKED_STREAMS,
    QPACK_DECODER,
    QPACK_DECODER_STREAM_ERROR,
    QPACK_DECOMPRESSION_FAILED,
    QPACK_ENCODER,
    QPACK_ENCODER_STREAM_ERROR,
    QPACK_MAX_TABLE_CAPACITY,
    SETTINGS,
    RawH3,
    encode_uint_var,
    fields,
    frame,
    grease,
    headers,
    raw_h3,
    request_fields,
    settings,
)
from test_http3 import _tls_ready, h3_skirr, pki  # noqa: E402, F401

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(pki):  # noqa: F811
    with h3_skirr(pki, "apps.probe:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        yield s


def conn(server, control: bytes | None = b""):
    return raw_h3(server.port, control=control)


async def served(c: RawH3, path: str = "/") -> None:
    """`c` answers a normal request."""
    r = await c.get(path)
    assert (r.status, r.body) == (200, b"ok"), r


async def connection_error(c: RawH3, server, code: int) -> None:
    """The server closes the connection with `code`; a fresh connection is
    served."""
    end = await c.closed()
    assert end.error_code == code, (hex(end.error_code), end.reason_phrase)
    async with conn(server) as fresh:
        await served(fresh)


async def stream_error(c: RawH3, sid: int, code: int) -> None:
    """The server resets or stops `sid` with `code` (and sends no response
    head); the connection serves the next request."""
    r = await c.answer(sid)
    assert c.terminated is None, (hex(c.terminated.error_code), c.terminated.reason_phrase)
    assert code in (r.reset, r.stop) and r.status == 0, r
    await served(c)


async def app_saw(c: RawH3) -> list[str]:
    return json.loads((await c.get("/paths")).body)


# --- §6.2.1 control streams ---------------------------------------------------


def test_6_2_1_server_settings_come_first_on_its_control_stream(server):
    """§6.2.1: each side opens one control stream, SETTINGS its first frame.
    RFC 9204 §5: the server advertises no dynamic table (capacity 0, no
    blocked streams: both absent or 0), and its field-section limit is
    http2_max_header_list_size (65536)."""

    async def go():
        async with conn(server) as c:
            frames, pairs = await c.server_settings()
            await served(c)
            return frames, dict(pairs)

    frames, got = run(go())
    assert frames[0][0] == SETTINGS
    assert got.get(QPACK_MAX_TABLE_CAPACITY, 0) == 0
    assert got.get(QPACK_BLOCKED_STREAMS, 0) == 0
    assert got[MAX_FIELD_SECTION_SIZE] == 65536


def test_6_2_1_a_second_control_stream_is_a_stream_creation_error(server):
    async def go():
        async with conn(server) as c:
            await served(c)
            c.uni(CONTROL, settings())
            await connection_error(c, server, H3_STREAM_CREATION_ERROR)

    run(go())


@pytest.mark.parametrize("how", ["fin", "reset"])
def test_6_2_1_closing_the_control_stream_is_a_closed_critical_stream(server, how):
    async def go():
        async with conn(server) as c:
            await served(c)
            if how == "fin":
                c.send(c.control, b"", end=True)
            else:
                c._quic.reset_stream(c.control, H3_NO_ERROR)
                c.transmit()
            await connection_error(c, server, H3_CLOSED_CRITICAL_STREAM)

    run(go())


def test_6_2_1_a_control_stream_not_opening_with_settings_is_missing_settings(server):
    async def go():
        async with conn(server, control=None) as c:
            c.uni(CONTROL, frame(GOAWAY, encode_uint_var(0)))
            await connection_error(c, server, H3_MISSING_SETTINGS)

    run(go())


def test_7_2_4_a_second_settings_frame_is_frame_unexpected(server):
    async def go():
        async with conn(server, control=settings()) as c:
            await connection_error(c, server, H3_FRAME_UNEXPECTED)

    run(go())


@pytest.mark.parametrize("ftype", [DATA, HEADERS, PUSH_PROMISE, *H2_FRAME_TYPES], ids=lambda t: f"type-{t:#x}")
def test_7_2_a_frame_not_allowed_on_the_control_stream_is_frame_unexpected(server, ftype):
    """§7.2.1 DATA, §7.2.2 HEADERS, §7.2.5 PUSH_PROMISE (from a client),
    §7.2.8 the reserved HTTP/2 types (PRIORITY, PING, WINDOW_UPDATE,
    CONTINUATION): H3_FRAME_UNEXPECTED on the control stream."""

    async def go():
        async with conn(server) as c:
            await served(c)
            c.send(c.control, frame(ftype, b"\x00\x00"))
            await connection_error(c, server, H3_FRAME_UNEXPECTED)

    run(go())


@pytest.mark.parametrize("ident", [0x2, 0x3, 0x4, 0x5], ids=lambda i: f"id-{i:#x}")
def test_7_2_4_1_an_http2_setting_is_a_settings_error(server, ident):
    """§7.2.4.1: the HTTP/2 settings without an HTTP/3 meaning (ENABLE_PUSH,
    MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE) are
    reserved: H3_SETTINGS_ERROR."""

    async def go():
        async with conn(server, control=None) as c:
            c.uni(CONTROL, settings([(ident, 1)]))
            await connection_error(c, server, H3_SETTINGS_ERROR)

    run(go())


def test_7_2_4_a_repeated_setting_is_a_settings_error(server):
    """§7.2.4: a setting identifier MUST NOT occur twice; the receiver MAY
    treat it as H3_SETTINGS_ERROR, and Skirr (h3) does."""

    async def go():
        async with conn(server, control=None) as c:
            c.uni(CONTROL, settings([(MAX_FIELD_SECTION_SIZE, 100), (MAX_FIELD_SECTION_SIZE, 200)]))
            await connection_error(c, server, H3_SETTINGS_ERROR)

    run(go())


# --- §9 extensions: unknown types are ignored ---------------------------------


def test_9_unknown_frames_streams_and_settings_are_ignored(server):
    """§9, §7.2.8, §6.2.3, §7.2.4.1: a grease setting, a grease frame on the
    control stream and around a request's frames, and streams of an unknown
    and a grease type change nothing: the request is answered, the
    connection stays open."""

    async def go():
        async with conn(server, control=None) as c:
            c.control = c.uni(CONTROL, settings([(grease(7), 9), (0x4242, 1)]) + frame(grease(1), b"xyz"))
            c.uni(grease(3), b"anything")
            c.uni(0x5A5A, frame(DATA, b"nothing"))
            g = frame(grease(2), b"\x01\x02")
            sid = c.bidi(g + headers(request_fields("POST", "/echo")) + g + frame(DATA, b"hi") + g)
            r = await c.answer(sid)
            c.send(c.control, frame(grease(4)))
            await served(c)
            return r, c.terminated

    r, end = run(go())
    assert (r.status, r.body) == (200, b"hi")
    assert end is None


def test_6_2_2_a_push_stream_from_the_client_is_a_stream_creation_error(server):
    """§6.2.2: only servers push; a client's push stream is a connection
    error H3_STREAM_CREATION_ERROR."""

    async def go():
        async with conn(server) as c:
            await served(c)
            c.uni(PUSH, encode_uint_var(0) + headers(request_fields()))
            await connection_error(c, server, H3_STREAM_CREATION_ERROR)

    run(go())


# --- §4.1 frame sequence on request streams -----------------------------------


def test_4_1_data_before_headers_is_frame_unexpected(server):
    async def go():
        async with conn(server) as c:
            await served(c)
            c.bidi(frame(DATA, b"early") + headers(request_fields("POST", "/echo")))
            await connection_error(c, server, H3_FRAME_UNEXPECTED)

    run(go())


def test_4_1_a_frame_after_trailers_is_frame_unexpected(server):
    async def go():
        async with conn(server) as c:
            await served(c)
            head = headers(request_fields("POST", "/echo"))
            c.bidi(head + frame(DATA, b"a") + headers([("x-t", "1")]) + frame(DATA, b"late"))
            await connection_error(c, server, H3_FRAME_UNEXPECTED)

    run(go())


@pytest.mark.parametrize(
    "ftype, payload",
    [
        (CANCEL_PUSH, encode_uint_var(0)),
        (SETTINGS, b""),
        (PUSH_PROMISE, encode_uint_var(0) + fields(request_fields())),
        (GOAWAY, encode_uint_var(0)),
        (MAX_PUSH_ID, encode_uint_var(0)),
        *[(t, b"\x00") for t in H2_FRAME_TYPES],
    ],
    ids=lambda v: f"type-{v:#x}" if isinstance(v, int) else "",
)
def test_7_2_a_control_frame_on_a_request_stream_is_frame_unexpected(server, ftype, payload):
    """§7.2.3 CANCEL_PUSH, §7.2.4 SETTINGS, §7.2.5 PUSH_PROMISE (a server
    receives none), §7.2.6 GOAWAY, §7.2.7 MAX_PUSH_ID, §7.2.8 the HTTP/2
    types, amid a request's frames: H3_FRAME_UNEXPECTED."""

    async def go():
        async with conn(server) as c:
            await served(c)
            c.bidi(headers(request_fields("POST", "/echo")) + frame(DATA, b"a") + frame(ftype, payload))
            await connection_error(c, server, H3_FRAME_UNEXPECTED)

    run(go())


@pytest.mark.parametrize("where", ["headers", "data"])
def test_7_1_a_frame_cut_short_by_the_stream_end_is_a_frame_error(server, where):
    """§7.1: a stream that ends inside a frame: H3_FRAME_ERROR."""

    async def go():
        async with conn(server) as c:
            await served(c)
            head = headers(request_fields("POST", "/echo"))
            if where == "headers":
                cut = head[:-3]
            else:
                cut = head + encode_uint_var(DATA) + encode_uint_var(100) + b"only ten.."
            c.bidi(cut)
            await connection_error(c, server, H3_FRAME_ERROR)

    run(go())


def test_5_2_a_client_goaway_lets_the_request_in_flight_finish(server):
    """§5.2: a client's GOAWAY (a push ID) stops nothing in flight: the
    request sent before it is answered, and the connection then ends
    without an error."""

    async def go():
        async with conn(server) as c:
            sid = c.request("GET", "/sleep?secs=0.3")
            c.send(c.control, frame(GOAWAY, encode_uint_var(0)))
            r = await c.answer(sid)
            end = await c.closed()
            return r, end

    r, end = run(go())
    assert (r.status, r.body) == (200, b"slept")
    assert end.error_code == H3_NO_ERROR


def test_5_2_a_client_goaway_with_a_larger_id_than_before_is_an_id_error(server):
    """§5.2: each GOAWAY's identifier MUST NOT be greater than the last;
    receiving a larger one is a connection error H3_ID_ERROR."""

    async def go():
        async with conn(server) as c:
            sid = c.request("GET", "/sleep?secs=1")
            await served(c)  # the request above was accepted before this one
            c.send(c.control, frame(GOAWAY, encode_uint_var(4)) + frame(GOAWAY, encode_uint_var(8)))
            end = await c.closed()
            assert end.error_code == H3_ID_ERROR, (hex(end.error_code), end.reason_phrase)
            assert c.response(sid).status == 0
        async with conn(server) as fresh:
            await served(fresh)

    run(go())


def test_7_2_3_cancel_push_for_a_push_never_promised_is_an_id_error(server):
    """§7.2.3: a server that receives CANCEL_PUSH for a push ID no
    PUSH_PROMISE mentioned (Skirr never pushes) MUST treat it as a
    connection error H3_ID_ERROR."""

    async def go():
        async with conn(server) as c:
            await served(c)
            c.send(c.control, frame(CANCEL_PUSH, encode_uint_var(0)))
            await connection_error(c, server, H3_ID_ERROR)

    run(go())


def test_7_2_7_a_max_push_id_lower_than_before_is_an_id_error(server):
    """§7.2.7: MAX_PUSH_ID cannot reduce the maximum push ID: a smaller
    value than before is a connection error H3_ID_ERROR (an equal or larger
    one is fine)."""

    async def go():
        async with conn(server) as c:
            c.send(c.control, frame(MAX_PUSH_ID, encode_uint_var(5)) + frame(MAX_PUSH_ID, encode_uint_var(5)))
            await served(c)
            c.send(c.control, frame(MAX_PUSH_ID, encode_uint_var(300)))
            await served(c)
            c.send(c.control, frame(MAX_PUSH_ID, encode_uint_var(4)))
            await connection_error(c, server, H3_ID_ERROR)

    run(go())


def test_4_1_a_request_stream_ended_without_headers_is_request_incomplete(server):
    """§4.1: a request stream that ends before a complete request: the
    server SHOULD abort the response with H3_REQUEST_INCOMPLETE (a stream
    error: the connection goes on)."""

    async def go():
        async with conn(server) as c:
            sid = c.bidi(b"", end=True)
            await stream_error(c, sid, H3_REQUEST_INCOMPLETE)

    run(go())


# --- §4.1.2, §4.3 malformed requests ------------------------------------------

MALFORMED = {
    "no-method": [(":scheme", "https"), (":authority", "localhost"), (":path", "/m-no-method")],
    "no-scheme": [(":method", "GET"), (":authority", "localhost"), (":path", "/m-no-scheme")],
    "no-path": [(":method", "GET"), (":scheme", "https"), (":authority", "localhost")],
    "empty-path": [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", "")],
    "uppercase-name": request_fields("GET", "/m-upper", [("X-Upper", "1")]),
    "connect-no-authority": [(":method", "CONNECT")],
    "status-in-request": request_fields("GET", "/m-status", [(":status", "200")]),
    "repeated-path": request_fields("GET", "/m-twice", [(":path", "/m-twice-again")]),
    "pseudo-after-regular": [
        (":method", "GET"),
        (":scheme", "https"),
        ("x-a", "1"),
        (":authority", "localhost"),
        (":path", "/m-after"),
    ],
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_4_1_2_a_malformed_request_head_is_a_message_error(server, case):
    """§4.3.1 (required pseudo-headers, non-empty :path, no response
    pseudo-header in a request, each once, before the regular fields), §4.2
    (lowercase names), §4.4 (CONNECT carries :authority): a stream error
    H3_MESSAGE_ERROR; the app is not called."""

    async def go():
        async with conn(server) as c:
            sid = c.bidi(headers(MALFORMED[case]))
            await stream_error(c, sid, H3_MESSAGE_ERROR)
            return await app_saw(c)

    paths = run(go())
    assert not [p for p in paths if p.startswith("/m-")], paths


@pytest.mark.parametrize("sent", [b"abc", b"abcdefgh"], ids=["less", "more"])
def test_4_1_2_a_body_that_does_not_match_content_length_is_a_message_error(server, sent):
    """§4.1.2: DATA frames whose total differs from content-length make the
    request malformed: H3_MESSAGE_ERROR on that stream."""

    async def go():
        async with conn(server) as c:
            head = headers(request_fields("POST", "/echo", [("content-length", "5")]))
            sid = c.bidi(head + frame(DATA, sent))
            await stream_error(c, sid, H3_MESSAGE_ERROR)

    run(go())


@pytest.mark.parametrize("body", [b"abc", b""], ids=["after-data", "no-data"])
def test_4_1_2_a_pseudo_header_in_trailers_is_a_message_error(server, body):
    """§4.3: pseudo-header fields MUST NOT appear in trailer sections."""

    async def go():
        async with conn(server) as c:
            head = headers(request_fields("POST", "/echo"))
            data = frame(DATA, body) if body else b""
            sid = c.bidi(head + data + headers([("x-t", "1"), (":path", "/x")]))
            await stream_error(c, sid, H3_MESSAGE_ERROR)

    run(go())


def test_4_1_a_request_with_regular_trailers_is_served(server):
    """§4.1: HEADERS, DATA, trailing HEADERS of regular fields: well-formed
    (the checks above refuse only what they name)."""

    async def go():
        async with conn(server) as c:
            head = headers(request_fields("POST", "/echo", [("te", "trailers")]))
            return await c.answer(c.bidi(head + frame(DATA, b"abc") + headers([("x-t", "1")])))

    r = run(go())
    assert (r.status, r.body) == (200, b"abc")


# --- §4.2.2 field section size -------------------------------------------------


def test_4_2_2_a_field_section_over_the_advertised_limit_is_answered_431(server):
    """§4.2.2: a server MAY refuse a field section larger than its
    SETTINGS_MAX_FIELD_SECTION_SIZE (65536); Skirr answers 431, as on
    HTTP/2, without calling the app, and the connection goes on."""

    async def go():
        async with conn(server) as c:
            big = [(f"x-big-{i}", "v" * 1000) for i in range(70)]
            r = await c.answer(c.bidi(headers(request_fields("GET", "/m-big", big))))
            await served(c)
            return r, await app_saw(c)

    r, paths = run(go())
    assert r.status == 431
    assert "/m-big" not in paths


# --- §4.1 responses ------------------------------------------------------------


def test_4_1_responses_have_a_status_no_connection_fields_and_no_body_where_none_is_allowed(server):
    """§4.3.2 :status; §4.2 no connection-specific fields; RFC 9110 §9.3.2
    HEAD, §15.3.5 204, §15.4.5 304: no content (no DATA frame)."""

    async def go():
        async with conn(server) as c:
            get = await c.get("/head")
            head = await c.answer(c.request("HEAD", "/head"))
            s204 = await c.get("/status-body?status=204")
            s304 = await c.get("/status-body?status=304")
            return get, head, s204, s304

    get, head, s204, s304 = run(go())
    assert (get.status, get.body) == (200, b"0123456789")
    for r in (get, head, s204, s304):
        names = {k for k, _ in r.headers}
        assert ":status" in names and not names & {"connection", "keep-alive", "transfer-encoding", "upgrade"}
        assert not [k for k in names if k.startswith(":") and k != ":status"]
    assert head.status == 200 and head.header("x-head") == "kept"
    assert (s204.status, s304.status) == (204, 304)
    for r in (head, s204, s304):
        assert DATA not in r.frame_types, r


# --- §5.2 the server's GOAWAY --------------------------------------------------


def test_5_2_goaway_on_drain_serves_the_requests_in_flight_then_names_the_first_not_accepted(pki):  # noqa: F811
    """§5.2 (the two steps of RFC 9113 §6.8): the drain's first GOAWAY
    names the largest stream ID (2^62-4), so that every request the client
    had in flight, however many, is processed; a second later the final
    GOAWAY names the first stream not accepted, and a request on it or
    above is rejected with H3_REQUEST_REJECTED (§4.1.1) and never reaches
    the app."""
    with h3_skirr(pki, "apps.probe:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with raw_h3(s.port) as c:
                first = c.request("GET", "/sleep?secs=2&tag=g1")
                for _ in range(200):
                    if "g1" in (await c.get("/events")).body.decode():
                        break
                    await asyncio.sleep(0.01)
                s.send_signal(signal.SIGTERM)

                def goaways():
                    got = c.server_uni(CONTROL)
                    return [Buffer(data=p).pull_uint_var() for t, p in (got[1] if got else []) if t == GOAWAY]

                gid = (await c.until(goaways, what="GOAWAY"))[0]
                # Three in flight (sent before the client read the GOAWAY).
                flight = [c.request("GET", f"/?flight={i}") for i in range(3)]
                served = [await c.answer(sid) for sid in flight]
                final = (await c.until(lambda: goaways()[1:], what="the final GOAWAY"))[0]
                later = {}
                while (sid := c._quic.get_next_available_stream_id()) < final + 8:
                    later[sid] = c.request("GET", f"/?after={sid}")
                answers = {sid: await c.answer(sid) for sid in later}
                return gid, flight, served, final, await c.answer(first), answers, goaways()

        gid, flight, served, final, first, answers, ids = run(go())
        assert gid == 2**62 - 4
        assert [r.status for r in served] == [200, 200, 200], served
        assert final == flight[-1] + 4 and ids == [gid, final], (flight, ids)
        assert (first.status, first.body) == (200, b"slept")
        for sid, r in answers.items():
            assert sid >= final
            assert H3_REQUEST_REJECTED in (r.reset, r.stop) and r.status == 0, (final, sid, r)
        assert s.wait(10) == 0
        assert "/?flight=2 HTTP/3.0" in s.logs()
        assert "/?after=" not in s.logs()


def test_5_2_a_request_the_goaway_allows_sent_as_the_drained_connection_goes_idle_is_not_lost(pki):  # noqa: F811
    """§5.2: a request below the GOAWAY's id "might have been processed"
    until the client learns otherwise, so the server must not close the
    connection over it. The client sends a request the drain's GOAWAY
    allows just after the connection has been idle for the drain's
    1 s (it read nothing meanwhile, as a pooled connection or a slow
    network does): it gets a response, or H3_REQUEST_REJECTED after a
    final GOAWAY naming that stream, never a close that drops it (issue
    21: the trial's connection reset ~2 s after a HUP)."""
    with h3_skirr(pki, "apps.probe:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with raw_h3(s.port) as c:
                assert (await c.get("/")).status == 200
                s.send_signal(signal.SIGTERM)

                def goaways():
                    got = c.server_uni(CONTROL)
                    return [Buffer(data=p).pull_uint_var() for t, p in (got[1] if got else []) if t == GOAWAY]

                gid = (await c.until(goaways, what="GOAWAY"))[0]
                # Deaf for longer than the drain's idle second: what the
                # server sends meanwhile is not read (dropped, then
                # retransmitted by the server's QUIC).
                c.datagram_received = lambda data, addr: None
                await asyncio.sleep(1.3)
                sid = c.request("POST", "/echo", body=b"late" * 100)
                del c.datagram_received
                try:
                    r = await c.answer(sid, timeout=5)
                except TimeoutError:
                    r = None
                if r is not None and not r.status:
                    # The final GOAWAY, resent once the client reads again.
                    await c.until(lambda: len(goaways()) > 1 or c.terminated, timeout=5, what="final GOAWAY")
                return gid, sid, r, goaways(), c.terminated

        gid, sid, r, ids, terminated = run(go())
        assert (gid, sid) == (2**62 - 4, 4)
        assert r is not None and not (terminated and r.status == 0 and r.reset is None), (
            f"request {sid} lost: {r}, close {terminated}, GOAWAYs {ids}"
        )
        if r.status:
            assert (r.status, r.body) == (200, b"late" * 100)
        else:
            # Rejected: not processed, and the final GOAWAY says so.
            assert H3_REQUEST_REJECTED in (r.reset, r.stop), r
            assert ids == [gid, sid], ids
            assert "/echo HTTP/3.0" not in s.logs()
        assert s.wait(10) == 0


# --- RFC 9204 QPACK -------------------------------------------------------------


def test_rfc9204_2_2_3_a_reference_to_the_dynamic_table_is_decompression_failed(server):
    """RFC 9204 §4.5.1.1, §2.2.3: with no dynamic table (capacity 0), a field
    section whose Required Insert Count is not 0, or that references a
    dynamic entry, could not come from a conforming encoder:
    QPACK_DECOMPRESSION_FAILED (a connection error)."""

    async def go():
        async with conn(server) as c:
            await served(c)
            # Encoded Required Insert Count 1, Base 0; indexed field line, dynamic, index 0.
            c.bidi(frame(HEADERS, b"\x01\x00\x80"))
            await connection_error(c, server, QPACK_DECOMPRESSION_FAILED)

    run(go())


def test_rfc9204_2_1_2_a_blocked_stream_over_the_limit_is_decompression_failed(server):
    """RFC 9204 §2.1.2: SETTINGS_QPACK_BLOCKED_STREAMS is 0, so a field
    section that would wait for an insert (a Required Insert Count the
    decoder has not reached) is QPACK_DECOMPRESSION_FAILED; the same bytes
    as above, but a literal with a post-base name reference."""

    async def go():
        async with conn(server) as c:
            await served(c)
            # Required Insert Count 1, Base 0 (delta 0); literal with post-base name index 0.
            c.bidi(frame(HEADERS, b"\x01\x00\x00\x01v"))
            await connection_error(c, server, QPACK_DECOMPRESSION_FAILED)

    run(go())


@pytest.mark.parametrize("stype", [QPACK_ENCODER, QPACK_DECODER], ids=["encoder", "decoder"])
def test_rfc9204_4_2_a_second_encoder_or_decoder_stream_is_a_stream_creation_error(server, stype):
    async def go():
        async with conn(server) as c:
            c.uni(stype)
            await served(c)
            c.uni(stype)
            await connection_error(c, server, H3_STREAM_CREATION_ERROR)

    run(go())


@pytest.mark.parametrize(
    "stype, instructions, code",
    [
        (QPACK_ENCODER, b"\x3f\xe1\x1f", QPACK_ENCODER_STREAM_ERROR),  # Set Dynamic Table Capacity 4096
        (QPACK_ENCODER, b"\xc0\x01v", QPACK_ENCODER_STREAM_ERROR),  # Insert With Name Reference (static 0)
        (QPACK_ENCODER, b"\x00", QPACK_ENCODER_STREAM_ERROR),  # Duplicate entry 0
        (QPACK_DECODER, b"\x80", QPACK_DECODER_STREAM_ERROR),  # Section Acknowledgment, stream 0
        (QPACK_DECODER, b"\x01", QPACK_DECODER_STREAM_ERROR),  # Insert Count Increment 1
    ],
    ids=["capacity-4096", "insert", "duplicate", "section-ack", "insert-count-increment"],
)
def test_rfc9204_4_3_4_4_an_instruction_a_table_of_capacity_0_cannot_take(server, stype, instructions, code):
    """RFC 9204 §4.3.1: a capacity over SETTINGS_QPACK_MAX_TABLE_CAPACITY
    (0), §3.2.2: an entry larger than the capacity, §4.3.4: a duplicate of
    an entry that does not exist: QPACK_ENCODER_STREAM_ERROR. §4.4.1: a
    Section Acknowledgment for a section with no dynamic reference,
    §4.4.3: an Insert Count Increment past the inserts sent:
    QPACK_DECODER_STREAM_ERROR."""

    async def go():
        async with conn(server) as c:
            await served(c)
            c.uni(stype, instructions)
            await connection_error(c, server, code)

    run(go())


def test_rfc9204_4_3_instructions_a_table_of_capacity_0_allows_are_taken(server):
    """Set Dynamic Table Capacity 0 (§4.3.1) on the encoder stream, Stream
    Cancellation (§4.4.2, one- and multi-byte stream ids) on the decoder
    stream: no error, requests are served."""

    async def go():
        async with conn(server) as c:
            c.uni(QPACK_ENCODER, b"\x20")
            dec = c.uni(QPACK_DECODER, b"\x44")
            await served(c)
            c.send(dec, b"\x7f\x89\x01")
            await served(c)
            return c.terminated

    assert run(go()) is None


@pytest.mark.parametrize("stype", [QPACK_ENCODER, QPACK_DECODER], ids=["encoder", "decoder"])
@pytest.mark.parametrize("how", ["fin", "reset"])
def test_rfc9204_4_2_closing_the_encoder_or_decoder_stream_is_a_closed_critical_stream(server, stype, how):
    async def go():
        async with conn(server) as c:
            sid = c.uni(stype)
            await served(c)
            if how == "fin":
                c.send(sid, b"", end=True)
            else:
                c._quic.reset_stream(sid, H3_NO_ERROR)
                c.transmit()
            await connection_error(c, server, H3_CLOSED_CRITICAL_STREAM)

    run(go())
