//! Proxy options: forwarding headers from trusted proxies
//! (`proxy_headers`, `forwarded_allow_ips`, `secure_scheme_headers`,
//! `forwarder_headers`) and PROXY protocol headers from trusted load
//! balancers (`proxy_protocol`, `proxy_allow_ips`).

use http::HeaderName;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::str_list;
use crate::wire::proxy::{parse_allow_list, ProxyConfig};
use crate::wire::proxy_protocol::Versions;

/// `forwarded_allow_ips` and `proxy_allow_ips` by default: this host only.
const LOCALHOST: &str = "127.0.0.1,::1";

/// Gunicorn's `proxy_protocol` and `proxy_allow_ips`.
#[derive(Clone, Debug)]
pub struct ProxyProtocol {
    pub versions: Versions,
    trust_all: bool,
    trusted: Vec<ipnet::IpNet>,
}

impl ProxyProtocol {
    /// Whether a connection from `ip` must start with a PROXY header.
    pub fn allows(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trust_all || self.trusted.iter().any(|n| n.contains(&ip))
    }
}

/// The forwarding-header settings by default (`proxy_headers` on).
pub(super) fn default_proxy() -> ProxyConfig {
    let (trust_all, trusted) = parse_allow_list(LOCALHOST).unwrap_or_default();
    ProxyConfig {
        trust_all,
        trusted,
        secure_scheme_headers: [
            ("x-forwarded-protocol", "ssl"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-ssl", "on"),
        ]
        .into_iter()
        .map(|(k, v)| (HeaderName::from_static(k), v.to_owned()))
        .collect(),
        script_name: true,
    }
}

/// The proxy keys as read.
pub(super) struct Options {
    /// `proxy_headers`.
    on: bool,
    headers: ProxyConfig,
    /// `proxy_protocol` (`None`: off).
    versions: Option<Versions>,
    /// `proxy_allow_ips`, parsed once the PROXY protocol is known to be on.
    allow: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            on: true,
            headers: default_proxy(),
            versions: None,
            allow: LOCALHOST.to_owned(),
        }
    }
}

impl Options {
    /// Takes `key` if it is a proxy option (returns whether it was).
    ///
    /// Errors: `ValueError` for an address, network, header name or mode
    /// that does not parse, `TypeError` for a value of the wrong type.
    pub(super) fn set(&mut self, key: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
        let proxy = &mut self.headers;
        match key {
            "proxy_headers" => self.on = v.extract()?,
            "forwarded_allow_ips" => {
                let list = str_list(v, key)?.join(",");
                (proxy.trust_all, proxy.trusted) = parse_allow_list(&list)
                    .map_err(|e| PyValueError::new_err(format!("option {key:?}: {e}")))?;
            }
            "secure_scheme_headers" => proxy.secure_scheme_headers = scheme_headers(v, key)?,
            "forwarder_headers" => {
                proxy.script_name = str_list(v, key)?
                    .iter()
                    .any(|h| h == "*" || h.eq_ignore_ascii_case("SCRIPT_NAME"));
            }
            "proxy_protocol" => {
                let mode: String = v.extract()?;
                self.versions = match mode.as_str() {
                    "off" => None,
                    "v1" => Some(Versions {
                        v1: true,
                        v2: false,
                    }),
                    "v2" => Some(Versions {
                        v1: false,
                        v2: true,
                    }),
                    "auto" => Some(Versions { v1: true, v2: true }),
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "option 'proxy_protocol' must be off, v1, v2 or auto, got {other:?}"
                        )))
                    }
                }
            }
            "proxy_allow_ips" => self.allow = str_list(v, key)?.join(","),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The forwarding-header settings (`None` when `proxy_headers` is off)
    /// and the PROXY protocol settings (`None` when off).
    ///
    /// Errors: `ValueError` if `proxy_allow_ips` does not parse.
    pub(super) fn finish(self) -> PyResult<(Option<ProxyConfig>, Option<ProxyProtocol>)> {
        let headers = self.on.then_some(self.headers);
        let Some(versions) = self.versions else {
            return Ok((headers, None));
        };
        let (trust_all, trusted) = parse_allow_list(&self.allow)
            .map_err(|e| PyValueError::new_err(format!("option 'proxy_allow_ips': {e}")))?;
        Ok((
            headers,
            Some(ProxyProtocol {
                versions,
                trust_all,
                trusted,
            }),
        ))
    }
}

/// `secure_scheme_headers`: header names (any case) to the value that means
/// https, in the dict's order.
fn scheme_headers(v: &Bound<'_, PyAny>, key: &str) -> PyResult<Vec<(HeaderName, String)>> {
    let wrong = || PyTypeError::new_err(format!("option {key:?} must map header names to values"));
    let map = v.cast::<PyDict>().map_err(|_| wrong())?;
    map.iter()
        .map(|(k, v)| {
            let (k, v): (String, String) = (
                k.extract().map_err(|_| wrong())?,
                v.extract().map_err(|_| wrong())?,
            );
            HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map(|h| (h, v))
                .map_err(|_| {
                    PyValueError::new_err(format!("option {key:?}: invalid header name {k:?}"))
                })
        })
        .collect()
}
