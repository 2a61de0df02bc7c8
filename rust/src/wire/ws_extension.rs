//! `Sec-WebSocket-Extensions` negotiation for permessage-deflate (RFC 7692
//! §5, §7.1): parsing the client's offers (RFC 6455 §9.1 grammar) and
//! choosing the first acceptable one.
//!
//! Anything Skirr does not understand — an unknown extension, an unknown or
//! repeated parameter, a value out of range, a malformed header — only means
//! that offer is declined: the handshake goes on without compression, it
//! never fails (RFC 7692 §5: "the server MUST decline ... an offer" it
//! cannot accept; failing is the client's call).

use http::HeaderMap;

/// The permessage-deflate extension token.
pub const PERMESSAGE_DEFLATE: &str = "permessage-deflate";

/// Skirr's side of the negotiation (options `ws_per_message_deflate`,
/// `ws_deflate_window_bits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeflateConfig {
    /// The LZ77 window (bits, 9..=15) Skirr compresses with, and asks
    /// clients that allow it to compress with (`client_max_window_bits`).
    /// Smaller windows cost less memory per connection (RFC 7692 §7.1.2).
    pub window_bits: u8,
    /// Keep a compressor per connection when the client allows it
    /// (`ws_deflate_context_takeover`): better ratios for similar messages,
    /// ~200 KiB more per connection. Off: Skirr always answers
    /// `server_no_context_takeover` (§7.1.1.1 lets a server declare it
    /// unasked) and compresses with a compressor shared per thread.
    pub context_takeover: bool,
}

/// What both sides agreed on (RFC 7692 §7.1). Window sizes in bits, 8..=15.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed {
    /// Skirr resets its compressor after every message (§7.1.1.1).
    pub server_no_context_takeover: bool,
    /// The client resets its compressor after every message (§7.1.1.2):
    /// Skirr may free its decompressor between messages.
    pub client_no_context_takeover: bool,
    /// Largest window Skirr may compress with (§7.1.2.1).
    pub server_max_window_bits: u8,
    /// Largest window the client compresses with (§7.1.2.2).
    pub client_max_window_bits: u8,
}

impl Agreed {
    /// The response's `Sec-WebSocket-Extensions` value for this agreement;
    /// `offered_server_bits`/`offered_client_bits` say which window
    /// parameters the offer carried (only those may be answered, §7.1.2).
    fn header(&self, offered_server_bits: bool, offered_client_bits: bool) -> String {
        let mut h = String::from(PERMESSAGE_DEFLATE);
        if self.server_no_context_takeover {
            h.push_str("; server_no_context_takeover");
        }
        if self.client_no_context_takeover {
            h.push_str("; client_no_context_takeover");
        }
        if offered_server_bits {
            h.push_str(&format!(
                "; server_max_window_bits={}",
                self.server_max_window_bits
            ));
        }
        if offered_client_bits && self.client_max_window_bits < 15 {
            h.push_str(&format!(
                "; client_max_window_bits={}",
                self.client_max_window_bits
            ));
        }
        h
    }
}

/// One offered extension: its name and parameters (`None`: no value).
#[derive(Debug, PartialEq, Eq)]
pub struct Offer {
    pub name: String,
    pub params: Vec<(String, Option<String>)>,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t') {
            self.i += 1;
        }
    }

    fn token(&mut self) -> Option<String> {
        self.ws();
        let start = self.i;
        while self.i < self.s.len() && is_tchar(self.s[self.i]) {
            self.i += 1;
        }
        (self.i > start).then(|| String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    /// A token or a quoted-string (RFC 6455 §9.1: a quoted value must
    /// itself be a token once unquoted).
    fn value(&mut self) -> Option<String> {
        self.ws();
        if self.s.get(self.i) != Some(&b'"') {
            return self.token();
        }
        self.i += 1;
        let mut out = Vec::new();
        loop {
            match *self.s.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    break;
                }
                b'\\' => {
                    out.push(*self.s.get(self.i + 1)?);
                    self.i += 2;
                }
                c => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
        (!out.is_empty() && out.iter().all(|b| is_tchar(*b)))
            .then(|| String::from_utf8_lossy(&out).into_owned())
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    /// Skips to just after the next top-level comma (error recovery).
    fn skip_element(&mut self) {
        let mut quoted = false;
        while let Some(&b) = self.s.get(self.i) {
            self.i += 1;
            match b {
                b'"' => quoted = !quoted,
                b'\\' if quoted => self.i += 1,
                b',' if !quoted => return,
                _ => {}
            }
        }
    }

    /// One `extension *( ";" param )`; `None` if malformed (the rest of the
    /// element is skipped).
    fn element(&mut self) -> Option<Offer> {
        let name = self.token()?;
        let mut params = Vec::new();
        loop {
            match self.peek() {
                None => break,
                Some(b',') => {
                    self.i += 1;
                    break;
                }
                Some(b';') => {
                    self.i += 1;
                    let p = self.token()?;
                    if self.peek() == Some(b'=') {
                        self.i += 1;
                        params.push((p, Some(self.value()?)));
                    } else {
                        params.push((p, None));
                    }
                }
                Some(_) => return None,
            }
        }
        Some(Offer { name, params })
    }
}

/// Every extension offered in `Sec-WebSocket-Extensions` fields, in order.
/// A malformed element is left out (it cannot be accepted), the others are
/// kept; empty list elements are ignored.
pub fn offers(headers: &HeaderMap) -> Vec<Offer> {
    let mut out = Vec::new();
    for v in headers.get_all(http::header::SEC_WEBSOCKET_EXTENSIONS) {
        let mut lx = Lexer {
            s: v.as_bytes(),
            i: 0,
        };
        while lx.peek().is_some() {
            if lx.peek() == Some(b',') {
                lx.i += 1;
                continue;
            }
            let start = lx.i;
            match lx.element() {
                Some(o) => out.push(o),
                None => {
                    lx.i = start;
                    lx.skip_element();
                }
            }
            // Cap the work a hostile header can cause.
            if out.len() >= 64 {
                return out;
            }
        }
    }
    out
}

fn window_bits(v: &str) -> Option<u8> {
    // RFC 7692 §7.1.2: 1*DIGIT in 8..=15, no leading zero.
    if v.len() > 2 || v.starts_with('0') {
        return None;
    }
    v.parse::<u8>().ok().filter(|b| (8..=15).contains(b))
}

/// Accepts one permessage-deflate offer, or `None` to decline it.
fn accept(offer: &Offer, cfg: DeflateConfig) -> Option<(Agreed, String)> {
    if !offer.name.eq_ignore_ascii_case(PERMESSAGE_DEFLATE) {
        return None;
    }
    let mut server_nct = false;
    let mut client_nct = false;
    let mut server_bits: Option<u8> = None;
    // Some(None): offered without a value (the client accepts any).
    let mut client_bits: Option<Option<u8>> = None;
    for (name, value) in &offer.params {
        // A parameter given twice declines the offer (§7).
        match (name.to_ascii_lowercase().as_str(), value) {
            ("server_no_context_takeover", None) if !server_nct => server_nct = true,
            ("client_no_context_takeover", None) if !client_nct => client_nct = true,
            ("server_max_window_bits", Some(v)) if server_bits.is_none() => {
                server_bits = Some(window_bits(v)?)
            }
            ("client_max_window_bits", None) if client_bits.is_none() => client_bits = Some(None),
            ("client_max_window_bits", Some(v)) if client_bits.is_none() => {
                client_bits = Some(Some(window_bits(v)?))
            }
            _ => return None,
        }
    }
    let ours = cfg.window_bits.clamp(9, 15);
    let agreed = Agreed {
        server_no_context_takeover: server_nct || !cfg.context_takeover,
        client_no_context_takeover: client_nct,
        server_max_window_bits: server_bits.map_or(15, |b| b.min(15)),
        client_max_window_bits: match client_bits {
            None => 15,
            // The client lets the server choose: ours (less memory to
            // inflate with).
            Some(None) => ours,
            Some(Some(b)) => b.min(ours),
        },
    };
    let header = agreed.header(server_bits.is_some(), client_bits.is_some());
    Some((agreed, header))
}

/// Negotiates permessage-deflate (RFC 7692 §5): the first acceptable
/// offer wins. Returns the agreement and the `Sec-WebSocket-Extensions`
/// value to answer with, or `None` (answer without the header).
pub fn negotiate(headers: &HeaderMap, cfg: DeflateConfig) -> Option<(Agreed, String)> {
    offers(headers).iter().find_map(|o| accept(o, cfg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const CFG: DeflateConfig = DeflateConfig {
        window_bits: 12,
        context_takeover: false,
    };

    fn hdrs(values: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                http::header::SEC_WEBSOCKET_EXTENSIONS,
                HeaderValue::from_static(v),
            );
        }
        h
    }

    fn neg(values: &[&'static str]) -> Option<String> {
        negotiate(&hdrs(values), CFG).map(|(_, h)| h)
    }

    #[test]
    fn plain_offer() {
        assert_eq!(
            neg(&["permessage-deflate"]).unwrap(),
            "permessage-deflate; server_no_context_takeover"
        );
        let (a, _) = negotiate(&hdrs(&["permessage-deflate"]), CFG).unwrap();
        assert_eq!(a.client_max_window_bits, 15);
        assert_eq!(a.server_max_window_bits, 15);
        assert!(a.server_no_context_takeover && !a.client_no_context_takeover);
    }

    #[test]
    fn context_takeover_when_configured_and_allowed() {
        let cfg = DeflateConfig {
            window_bits: 12,
            context_takeover: true,
        };
        let (a, h) = negotiate(&hdrs(&["permessage-deflate"]), cfg).unwrap();
        assert_eq!(h, "permessage-deflate");
        assert!(!a.server_no_context_takeover);
        let (a, _) = negotiate(
            &hdrs(&["permessage-deflate; server_no_context_takeover"]),
            cfg,
        )
        .unwrap();
        assert!(a.server_no_context_takeover);
    }

    #[test]
    fn browser_offer_gets_our_client_window() {
        let h = neg(&["permessage-deflate; client_max_window_bits"]).unwrap();
        assert_eq!(
            h,
            "permessage-deflate; server_no_context_takeover; client_max_window_bits=12"
        );
    }

    #[test]
    fn all_parameters() {
        let (a, h) = negotiate(
            &hdrs(&["permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10; client_max_window_bits=\"9\""]),
            CFG,
        )
        .unwrap();
        assert_eq!(h, "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10; client_max_window_bits=9");
        assert_eq!(a.server_max_window_bits, 10);
        assert_eq!(a.client_max_window_bits, 9);
        let (a, _) = negotiate(
            &hdrs(&["permessage-deflate; server_max_window_bits=8"]),
            CFG,
        )
        .unwrap();
        assert_eq!(a.server_max_window_bits, 8);
    }

    #[test]
    fn first_acceptable_of_several() {
        assert_eq!(
            neg(&["x-webkit-deflate-frame, permessage-deflate; foo=1, permessage-deflate; server_max_window_bits=9, permessage-deflate"]).unwrap(),
            "permessage-deflate; server_no_context_takeover; server_max_window_bits=9"
        );
        assert_eq!(
            neg(&[
                "permessage-deflate; server_max_window_bits=16",
                "permessage-deflate; client_no_context_takeover"
            ])
            .unwrap(),
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
        );
    }

    #[test]
    fn declined_offers() {
        for bad in [
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_max_window_bits=7",
            "permessage-deflate; server_max_window_bits=08",
            "permessage-deflate; client_max_window_bits=16",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; unknown",
            "permessage-deflate; client_max_window_bits=\"1 0\"",
            "permessage-deflate x",
            "permessage-deflate; ;",
            "permessage-deflate; server_max_window_bits=\"10",
            "deflate-frame",
            "",
            ",,,",
        ] {
            assert_eq!(neg(&[bad]), None, "{bad}");
        }
    }

    #[test]
    fn malformed_element_does_not_hide_the_next() {
        assert_eq!(
            neg(&["foo; a=\"x,y\"; ==, permessage-deflate"]).unwrap(),
            "permessage-deflate; server_no_context_takeover"
        );
    }
}
