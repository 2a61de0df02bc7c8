//! TLS options (Gunicorn's `certfile`, `keyfile`, `ca_certs`, `cert_reqs`,
//! `ciphers`, `ssl_version`): what [`crate::server::tls`] builds its rustls
//! configuration from.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{count, str_list, Http2};

/// Whether clients must present a certificate (Python's `ssl.CERT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// `CERT_NONE` (0): none is asked for.
    None,
    /// `CERT_OPTIONAL` (1): asked for, verified against `ca_certs` if sent.
    Optional,
    /// `CERT_REQUIRED` (2): a handshake without a valid one fails.
    Required,
}

/// The TLS settings, as paths and names; see
/// [`acceptor`](crate::server::tls::acceptor).
#[derive(Clone, Debug)]
pub struct TlsSettings {
    /// PEM certificate chain, leaf first.
    pub certfile: String,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1), unencrypted.
    pub keyfile: String,
    /// PEM CA certificates for client certificates.
    pub ca_certs: Option<String>,
    pub client_auth: ClientAuth,
    /// Colon-separated cipher suite names (IANA or OpenSSL spelling);
    /// `None` keeps rustls's defaults.
    pub ciphers: Option<String>,
    /// Allowed versions: `"1.2"`, `"1.3"`. Default both.
    pub versions: Vec<String>,
    /// ALPN protocols offered, in order of preference (rustls picks the
    /// first the client also offers).
    pub alpn: Vec<Vec<u8>>,
}

/// The `ssl_*` keys as read, before TLS is known to be on.
pub(super) struct Options(TlsSettings);

impl Default for Options {
    fn default() -> Self {
        Options(TlsSettings {
            certfile: String::new(),
            keyfile: String::new(),
            ca_certs: None,
            client_auth: ClientAuth::None,
            ciphers: None,
            versions: Vec::new(),
            alpn: Vec::new(),
        })
    }
}

impl Options {
    /// Takes `key` if it is a TLS option (returns whether it was).
    ///
    /// Errors: `TypeError` for a value of the wrong type, `ValueError` for
    /// an `ssl_cert_reqs` other than 0, 1 or 2.
    pub(super) fn set(&mut self, key: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
        let tls = &mut self.0;
        match key {
            "ssl_certfile" => tls.certfile = v.extract::<Option<String>>()?.unwrap_or_default(),
            "ssl_keyfile" => tls.keyfile = v.extract::<Option<String>>()?.unwrap_or_default(),
            "ssl_ca_certs" => tls.ca_certs = v.extract()?,
            "ssl_ciphers" => tls.ciphers = v.extract()?,
            "ssl_version" => tls.versions = str_list(v, key)?,
            "ssl_cert_reqs" => {
                tls.client_auth = match count::<u8>(v, key)? {
                    0 => ClientAuth::None,
                    1 => ClientAuth::Optional,
                    2 => ClientAuth::Required,
                    n => {
                        return Err(PyValueError::new_err(format!(
                            "option {key:?} must be 0 (none), 1 (optional) or 2 (required), got {n}"
                        )))
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The settings when `ssl_certfile` is set (TLS is on), with ALPN
    /// offering the protocols `http2` serves, in its order.
    pub(super) fn finish(self, http2: Option<&Http2>) -> Option<TlsSettings> {
        let mut tls = self.0;
        if tls.certfile.is_empty() {
            return None;
        }
        tls.alpn = match http2 {
            None => vec![b"http/1.1".to_vec()],
            Some(h) if !h.http1 => vec![b"h2".to_vec()],
            Some(h) if h.h2_first => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Some(_) => vec![b"http/1.1".to_vec(), b"h2".to_vec()],
        };
        if tls.keyfile.is_empty() {
            // As Python's `load_cert_chain`: the key may sit in the certfile.
            tls.keyfile = tls.certfile.clone();
        }
        Some(tls)
    }
}
