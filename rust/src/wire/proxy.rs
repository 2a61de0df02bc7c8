//! Requests relayed by a trusted reverse proxy: the client address and
//! scheme it reports (`X-Forwarded-For`, `X-Forwarded-Proto` and Gunicorn's
//! `secure_scheme_headers`, or RFC 7239 `Forwarded`), honoured only when the
//! connection comes from an address in `forwarded_allow_ips`.
//!
//! The client is the rightmost address in the chain that is not itself a
//! trusted proxy (each proxy appends the address it received from, so
//! entries left of the first untrusted one may be forged).

use std::net::IpAddr;
use std::str::FromStr;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const SCRIPT_NAME: HeaderName = HeaderName::from_static("script_name");

/// Who may speak for the client, and through which headers.
#[derive(Clone, Debug, Default)]
pub struct ProxyConfig {
    /// `*` in `forwarded_allow_ips`: every peer is trusted.
    pub trust_all: bool,
    /// Trusted peer addresses and networks.
    pub trusted: Vec<IpNet>,
    /// `(header, value meaning https)`, e.g. `("x-forwarded-proto", "https")`.
    pub secure_scheme_headers: Vec<(HeaderName, String)>,
    /// Honour a `SCRIPT_NAME` header as `root_path` (Gunicorn's
    /// `forwarder_headers`).
    pub script_name: bool,
}

/// What a trusted proxy said about the original request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// The client's address and port (0 when the proxy did not say).
    pub client: Option<(String, u16)>,
    /// `Some(true)` for https, `Some(false)` for http.
    pub https: Option<bool>,
    /// The prefix the proxy mounts the app under.
    pub root_path: Option<String>,
}

/// Parses `forwarded_allow_ips`: comma-separated addresses and networks,
/// or `*`.
///
/// Errors: the first entry that is neither, named.
pub fn parse_allow_list(s: &str) -> Result<(bool, Vec<IpNet>), String> {
    let mut nets = Vec::new();
    let mut all = false;
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if item == "*" {
            all = true;
        } else if let Ok(net) = IpNet::from_str(item) {
            nets.push(net);
        } else if let Ok(ip) = IpAddr::from_str(item) {
            nets.push(IpNet::from(ip));
        } else {
            return Err(format!("{item:?} is not an IP address or network"));
        }
    }
    Ok((all, nets))
}

impl ProxyConfig {
    /// Whether `peer` may set forwarding headers; `None` (a Unix socket,
    /// reachable only from this host) is trusted, as in Gunicorn.
    pub fn trusts(&self, peer: Option<IpAddr>) -> bool {
        match peer {
            None => true,
            Some(ip) => {
                let ip = ip.to_canonical();
                self.trust_all || self.trusted.iter().any(|n| n.contains(&ip))
            }
        }
    }

    fn is_proxy(&self, ip: &IpAddr) -> bool {
        self.trust_all || self.trusted.iter().any(|n| n.contains(&ip.to_canonical()))
    }

    /// What a trusted `peer` reports in `headers`; `Ok(None)` when the
    /// peer is not trusted or says nothing.
    ///
    /// Errors (answered 400): secure-scheme headers that contradict each
    /// other.
    pub fn origin(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<Option<Origin>, &'static str> {
        if !self.trusts(peer) {
            return Ok(None);
        }
        // One pass over the field names: a hashed lookup per name (five
        // with Gunicorn's defaults) cost more than the pass on a typical
        // head, and most requests carry none of them.
        let mut forwarded = None;
        let mut xff = None;
        let mut script = None;
        // Gunicorn's rule: the configured headers must agree with each other.
        let mut secure_headers: Option<bool> = None;
        for name in headers.keys() {
            if name == http::header::FORWARDED {
                forwarded = headers.get(name);
            } else if name == X_FORWARDED_FOR {
                xff = headers.get(name);
            } else if self.script_name && name == SCRIPT_NAME {
                script = headers.get(name);
            }
            for (secure_name, secure) in &self.secure_scheme_headers {
                if name != secure_name {
                    continue;
                }
                if let Some(v) = headers.get(name) {
                    let https = v.as_bytes() == secure.as_bytes();
                    match secure_headers {
                        Some(prev) if prev != https => return Err("contradictory scheme headers"),
                        _ => secure_headers = Some(https),
                    }
                }
            }
        }
        let mut o = Origin::default();
        if let Some(fwd) = forwarded {
            let (client, proto) = self.parse_forwarded(fwd.as_bytes());
            o.client = client;
            o.https = proto;
        } else if let Some(xff) = xff {
            o.client = self.client_from_xff(xff.as_bytes());
        }
        if o.https.is_none() {
            o.https = secure_headers;
        }
        if let Some(v) = script.and_then(|v| v.to_str().ok()) {
            o.root_path = Some(v.trim_end_matches('/').to_owned());
        }
        if o == Origin::default() {
            return Ok(None);
        }
        Ok(Some(o))
    }

    /// Rightmost untrusted hop of `X-Forwarded-For`.
    fn client_from_xff(&self, v: &[u8]) -> Option<(String, u16)> {
        let s = std::str::from_utf8(v).ok()?;
        let hops: Vec<&str> = s
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .collect();
        let pick = hops
            .iter()
            .rev()
            .find(|h| !IpAddr::from_str(h).is_ok_and(|ip| self.is_proxy(&ip)))
            .or(hops.first())?;
        node(pick)
    }

    /// `for=` (rightmost untrusted) and the last `proto=` of RFC 7239
    /// `Forwarded` elements.
    fn parse_forwarded(&self, v: &[u8]) -> (Option<(String, u16)>, Option<bool>) {
        let Ok(s) = std::str::from_utf8(v) else {
            return (None, None);
        };
        let mut fors = Vec::new();
        let mut proto = None;
        for element in s.split(',') {
            for pair in element.split(';') {
                let Some((k, val)) = pair.split_once('=') else {
                    continue;
                };
                let val = val.trim().trim_matches('"');
                match k.trim().to_ascii_lowercase().as_str() {
                    "for" => fors.push(val.to_owned()),
                    "proto" => {
                        proto = Some(
                            val.eq_ignore_ascii_case("https") || val.eq_ignore_ascii_case("wss"),
                        )
                    }
                    _ => {}
                }
            }
        }
        let pick = fors
            .iter()
            .rev()
            .find(|f| {
                !node(f)
                    .and_then(|(h, _)| IpAddr::from_str(&h).ok())
                    .is_some_and(|ip| self.is_proxy(&ip))
            })
            .or(fors.first());
        (pick.and_then(|f| node(f)), proto)
    }
}

/// A node: `1.2.3.4`, `1.2.3.4:80`, `[::1]`, `[::1]:80` or `::1`; RFC
/// 7239's obfuscated identifiers (`_hidden`, `unknown`) give no address.
fn node(s: &str) -> Option<(String, u16)> {
    let s = s.trim();
    if let Ok(ip) = IpAddr::from_str(s) {
        return Some((ip.to_canonical().to_string(), 0));
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest.split_once(']')?;
        let ip = IpAddr::from_str(host).ok()?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if tail.is_empty() => 0,
            None => return None,
        };
        return Some((ip.to_string(), port));
    }
    let (host, port) = s.rsplit_once(':')?;
    let ip = IpAddr::from_str(host).ok()?;
    Some((ip.to_canonical().to_string(), port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn cfg() -> ProxyConfig {
        let (trust_all, trusted) = parse_allow_list("127.0.0.1, 10.0.0.0/8").expect("list");
        ProxyConfig {
            trust_all,
            trusted,
            secure_scheme_headers: vec![
                (HeaderName::from_static("x-forwarded-proto"), "https".into()),
                (HeaderName::from_static("x-forwarded-ssl"), "on".into()),
            ],
            script_name: true,
        }
    }

    fn h(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_str(v).expect("value"));
        }
        m
    }

    fn local() -> Option<IpAddr> {
        Some("127.0.0.1".parse().expect("ip"))
    }

    #[test]
    fn untrusted_peers_are_ignored() {
        let c = cfg();
        let hs = h(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-proto", "https"),
        ]);
        assert_eq!(
            c.origin(&hs, Some("8.8.8.8".parse().expect("ip"))),
            Ok(None)
        );
        assert!(c.origin(&hs, local()).expect("ok").is_some());
        assert!(c.trusts(Some("::ffff:10.1.2.3".parse().expect("ip"))));
        assert!(c.trusts(None), "unix sockets are trusted");
    }

    #[test]
    fn rightmost_untrusted_hop_is_the_client() {
        let c = cfg();
        let hs = h(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.0.0.7")]);
        let o = c.origin(&hs, local()).expect("ok").expect("origin");
        assert_eq!(o.client, Some(("1.2.3.4".into(), 0)));
        let all_trusted = h(&[("x-forwarded-for", "10.0.0.1, 10.0.0.2")]);
        let o = c
            .origin(&all_trusted, local())
            .expect("ok")
            .expect("origin");
        assert_eq!(o.client, Some(("10.0.0.1".into(), 0)));
    }

    #[test]
    fn scheme_headers() {
        let c = cfg();
        let o = c
            .origin(&h(&[("x-forwarded-proto", "https")]), local())
            .expect("ok");
        assert_eq!(o.and_then(|o| o.https), Some(true));
        let o = c
            .origin(&h(&[("x-forwarded-proto", "http")]), local())
            .expect("ok");
        assert_eq!(o.and_then(|o| o.https), Some(false));
        let both = h(&[("x-forwarded-proto", "https"), ("x-forwarded-ssl", "off")]);
        assert_eq!(
            c.origin(&both, local()),
            Err("contradictory scheme headers")
        );
    }

    #[test]
    fn forwarded_header() {
        let c = cfg();
        let hs = h(&[(
            "forwarded",
            r#"for=6.6.6.6, for="[2001:db8::1]:4711";proto=https, for=10.0.0.3"#,
        )]);
        let o = c.origin(&hs, local()).expect("ok").expect("origin");
        assert_eq!(o.client, Some(("2001:db8::1".into(), 4711)));
        assert_eq!(o.https, Some(true));
        let hidden = h(&[("forwarded", "for=_hidden;proto=http")]);
        let o = c.origin(&hidden, local()).expect("ok").expect("origin");
        assert_eq!((o.client, o.https), (None, Some(false)));
    }

    #[test]
    fn script_name_sets_root_path() {
        let o = cfg()
            .origin(&h(&[("script_name", "/api/")]), local())
            .expect("ok");
        assert_eq!(o.and_then(|o| o.root_path), Some("/api".into()));
    }

    #[test]
    fn allow_list_errors_name_the_entry() {
        assert!(parse_allow_list("127.0.0.1,nope")
            .unwrap_err()
            .contains("nope"));
        assert!(parse_allow_list("*").expect("star").0);
    }
}
