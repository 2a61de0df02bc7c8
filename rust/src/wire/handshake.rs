//! The opening handshake (RFC 6455 §4.2; over HTTP/2, RFC 8441 §4–5):
//! recognising an upgrade request, validating it, and building the response
//! once the app has decided.

use bytes::Bytes;
use http::header::{
    CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL,
    SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, Version};

/// Whether `value` (a comma-separated token list) contains `token`,
/// case-insensitively.
fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .as_bytes()
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Whether the request asks to switch to the WebSocket protocol.
pub fn is_upgrade(parts: &Parts) -> bool {
    parts
        .headers
        .get_all(UPGRADE)
        .iter()
        .any(|v| has_token(v, "websocket"))
}

/// Whether the request is an HTTP/2 extended CONNECT (RFC 8441 §4): a
/// CONNECT with a `:protocol` pseudo-header, which hyper only passes on when
/// SETTINGS_ENABLE_CONNECT_PROTOCOL was sent (`http2_websockets`).
pub fn is_extended_connect(parts: &Parts) -> bool {
    parts.method == Method::CONNECT && parts.extensions.get::<hyper::ext::Protocol>().is_some()
}

/// Checks an extended CONNECT handshake (RFC 8441 §5): `:protocol` is
/// `websocket` and `Sec-WebSocket-Version` is 13. There is no key and no
/// accept value on HTTP/2; `:scheme`, `:path` and `:authority` are checked
/// by the h2 crate.
pub fn validate_h2(parts: &Parts) -> Result<(), Refusal> {
    let protocol = parts.extensions.get::<hyper::ext::Protocol>();
    if !protocol.is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket")) {
        return Err(refuse(
            StatusCode::NOT_IMPLEMENTED,
            "unsupported :protocol (websocket is supported)",
        ));
    }
    check_version(parts)
}

fn check_version(parts: &Parts) -> Result<(), Refusal> {
    match parts.headers.get(SEC_WEBSOCKET_VERSION) {
        None => Err(refuse(
            StatusCode::BAD_REQUEST,
            "missing Sec-WebSocket-Version",
        )),
        Some(v) if v.as_bytes().trim_ascii() != b"13" => Err(refuse(
            StatusCode::UPGRADE_REQUIRED,
            "unsupported Sec-WebSocket-Version (13 is supported)",
        )),
        Some(_) => Ok(()),
    }
}

/// Why a handshake is refused before the app sees it.
pub struct Refusal {
    pub status: StatusCode,
    pub message: &'static str,
}

fn refuse(status: StatusCode, message: &'static str) -> Refusal {
    Refusal { status, message }
}

fn is_base64_key(key: &[u8]) -> bool {
    // A base64-encoded 16-byte nonce: 22 characters and "==" (§4.1).
    key.len() == 24
        && key.ends_with(b"==")
        && key[..22]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
}

/// Checks the handshake; the `Sec-WebSocket-Accept` value on success.
pub fn validate(parts: &Parts) -> Result<String, Refusal> {
    if parts.method != Method::GET {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "WebSocket handshake must be a GET",
        ));
    }
    if parts.version < Version::HTTP_11 {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "WebSocket handshake needs HTTP/1.1",
        ));
    }
    if !parts
        .headers
        .get_all(CONNECTION)
        .iter()
        .any(|v| has_token(v, "upgrade"))
    {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "missing 'Connection: Upgrade'",
        ));
    }
    // Exactly one key (RFC 6455 §4.2.1 item 5: "a |Sec-WebSocket-Key|
    // header field"; §11.3.1: it MUST NOT appear more than once).
    let mut keys = parts.headers.get_all(SEC_WEBSOCKET_KEY).iter();
    let accept = match (keys.next(), keys.next()) {
        (Some(k), None) if is_base64_key(k.as_bytes().trim_ascii()) => {
            tungstenite::handshake::derive_accept_key(k.as_bytes().trim_ascii())
        }
        _ => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "missing or invalid Sec-WebSocket-Key",
            ))
        }
    };
    check_version(parts).map(|()| accept)
}

/// The subprotocols the client offers, in order: every
/// `Sec-WebSocket-Protocol` field, each a comma-separated list.
pub fn subprotocols(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).into_owned())
        .filter(|t| !t.is_empty())
        .collect()
}

/// `101 Switching Protocols` with the app's subprotocol and extra headers.
pub fn switching_protocols(
    accept_key: &str,
    subprotocol: Option<&str>,
    extra: HeaderMap,
) -> Result<(StatusCode, HeaderMap), &'static str> {
    let mut headers = extra;
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(
        SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(accept_key).map_err(|_| "invalid accept key")?,
    );
    if let Some(p) = subprotocol {
        headers.insert(
            SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_str(p).map_err(|_| "invalid subprotocol")?,
        );
    }
    Ok((StatusCode::SWITCHING_PROTOCOLS, headers))
}

/// `200 OK` accepting an extended CONNECT (RFC 8441 §5), with the app's
/// subprotocol and extra headers; the stream then carries the WebSocket.
pub fn connect_accepted(
    subprotocol: Option<&str>,
    extra: HeaderMap,
) -> Result<(StatusCode, HeaderMap), &'static str> {
    let mut headers = extra;
    if let Some(p) = subprotocol {
        headers.insert(
            SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_str(p).map_err(|_| "invalid subprotocol")?,
        );
    }
    Ok((StatusCode::OK, headers))
}

/// A short plain-text refusal (400, 403, 426, 500) that closes the
/// connection.
pub fn plain(status: StatusCode, message: &str) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::copy_from_slice(message.as_bytes()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    crate::wire::response::plain_text_fields(h);
    if status == StatusCode::UPGRADE_REQUIRED {
        h.insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(req: http::Request<()>) -> Parts {
        req.into_parts().0
    }

    fn handshake() -> http::request::Builder {
        http::Request::get("/ws")
            .header("Upgrade", "websocket")
            .header("Connection", "keep-alive, Upgrade")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
    }

    #[test]
    fn accept_key_is_rfc_6455_example() {
        let p = parts(handshake().body(()).unwrap());
        assert!(is_upgrade(&p));
        assert_eq!(validate(&p).ok().unwrap(), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn wrong_version_is_426() {
        let p = parts(
            handshake()
                .header("Sec-WebSocket-Version", "8")
                .body(())
                .unwrap(),
        );
        let mut p = p;
        p.headers
            .insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("8"));
        assert_eq!(
            validate(&p).err().unwrap().status,
            StatusCode::UPGRADE_REQUIRED
        );
    }

    #[test]
    fn bad_key_and_missing_connection_are_400() {
        let mut p = parts(handshake().body(()).unwrap());
        p.headers
            .insert(SEC_WEBSOCKET_KEY, HeaderValue::from_static("short"));
        assert_eq!(validate(&p).err().unwrap().status, StatusCode::BAD_REQUEST);
        let mut p = parts(handshake().body(()).unwrap());
        p.headers.remove(CONNECTION);
        assert_eq!(validate(&p).err().unwrap().status, StatusCode::BAD_REQUEST);
        let p = parts(
            handshake()
                .header("Sec-WebSocket-Key", "AQIDBAUGBwgJCgsMDQ4PEA==")
                .body(())
                .unwrap(),
        );
        assert_eq!(validate(&p).err().unwrap().status, StatusCode::BAD_REQUEST);
    }

    fn connect(protocol: Option<&'static str>, version: Option<&str>) -> Parts {
        let mut b = http::Request::builder()
            .method(Method::CONNECT)
            .version(Version::HTTP_2)
            .uri("https://example.test/chat");
        if let Some(v) = version {
            b = b.header("Sec-WebSocket-Version", v);
        }
        let mut p = parts(b.body(()).unwrap());
        if let Some(proto) = protocol {
            p.extensions
                .insert(hyper::ext::Protocol::from_static(proto));
        }
        p
    }

    #[test]
    fn extended_connect_needs_websocket_protocol_and_version_13() {
        assert!(!is_extended_connect(&connect(None, Some("13"))));
        let ok = connect(Some("websocket"), Some("13"));
        assert!(is_extended_connect(&ok));
        assert!(validate_h2(&ok).is_ok());
        let other = connect(Some("connect-udp"), Some("13"));
        assert_eq!(
            validate_h2(&other).err().unwrap().status,
            StatusCode::NOT_IMPLEMENTED
        );
        let v8 = connect(Some("websocket"), Some("8"));
        assert_eq!(
            validate_h2(&v8).err().unwrap().status,
            StatusCode::UPGRADE_REQUIRED
        );
        let none = connect(Some("websocket"), None);
        assert_eq!(
            validate_h2(&none).err().unwrap().status,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn subprotocols_from_lists_and_repeated_fields() {
        let p = parts(
            handshake()
                .header("Sec-WebSocket-Protocol", "chat, superchat")
                .header("Sec-WebSocket-Protocol", " v2.json ,")
                .body(())
                .unwrap(),
        );
        assert_eq!(subprotocols(&p.headers), ["chat", "superchat", "v2.json"]);
    }
}
