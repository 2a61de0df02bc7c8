//! TLS termination with rustls, configured from Gunicorn's SSL settings
//! (`certfile`, `keyfile`, `ca_certs`, `cert_reqs`, `ciphers`,
//! `ssl_version`), the bounded handshake, and what the ASGI `tls`
//! extension (spec 0.2) reports about a connection.

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use rustls::crypto::ring as provider;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedCipherSuite};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::asgi::conn::TlsInfo;
use crate::config::{ClientAuth, TlsSettings};
use crate::worker::connections::Order;
use crate::worker::Worker;

/// OpenSSL's names for the suites rustls implements.
const OPENSSL_NAMES: &[(&str, &str)] = &[
    ("TLS_AES_256_GCM_SHA384", "TLS13_AES_256_GCM_SHA384"),
    ("TLS_AES_128_GCM_SHA256", "TLS13_AES_128_GCM_SHA256"),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        "TLS13_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

fn suite_name(s: &SupportedCipherSuite) -> String {
    format!("{:?}", s.suite())
}

fn pick_suites(list: &str) -> Result<Vec<SupportedCipherSuite>, String> {
    let all = provider::ALL_CIPHER_SUITES;
    let mut out = Vec::new();
    for name in list
        .split([':', ','])
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        let iana = OPENSSL_NAMES
            .iter()
            .find(|(o, _)| o.eq_ignore_ascii_case(name))
            .map_or(name, |(_, i)| *i);
        let found = all.iter().find(|s| {
            let n = suite_name(s);
            n.eq_ignore_ascii_case(iana) || n.replace("TLS13_", "TLS_").eq_ignore_ascii_case(iana)
        });
        match found {
            Some(s) => out.push(*s),
            None => {
                let known: Vec<&str> = OPENSSL_NAMES.iter().map(|(o, _)| *o).collect();
                return Err(format!(
                    "ciphers: {name:?} is not a cipher suite this server implements \
                     (OpenSSL cipher-string keywords are not supported; name suites: {})",
                    known.join(":")
                ));
            }
        }
    }
    if out.is_empty() {
        return Err("ciphers: no cipher suite named".into());
    }
    Ok(out)
}

fn read(path: &str, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {path}: {e}"))
}

fn certs(path: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path, what)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what} {path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what} {path}: no PEM certificate found"));
    }
    Ok(certs)
}

fn key(path: &str) -> Result<PrivateKeyDer<'static>, String> {
    let pem = read(path, "keyfile")?;
    let text = String::from_utf8_lossy(&pem);
    if text.contains("ENCRYPTED PRIVATE KEY") || text.contains("Proc-Type: 4,ENCRYPTED") {
        return Err(format!(
            "keyfile {path} is encrypted with a passphrase, which this server cannot use; \
             decrypt it first (openssl pkey -in {path} -out key.pem) and protect the file instead"
        ));
    }
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("keyfile {path}: no usable private key ({e})"))
}

/// Builds the acceptor, and the PEM of the server's own certificate (the
/// `tls` extension's `server_cert`).
///
/// Errors: one line naming the setting and the cause (a missing or
/// unreadable file, an encrypted key, a key that does not match the
/// certificate, an unknown cipher or version, `cert_reqs` without
/// `ca_certs`).
pub fn acceptor(s: &TlsSettings) -> Result<(TlsAcceptor, String), String> {
    let (config, server_pem) = server_config(s, false)?;
    Ok((TlsAcceptor::from(Arc::new(config)), server_pem))
}

/// The rustls configuration of the HTTP/3 endpoint: the same certificate,
/// client authentication and suites as the TCP listeners', TLS 1.3 only
/// (RFC 9001 §4.2), ALPN `h3`.
///
/// Errors: as [`acceptor`], and settings that leave no TLS 1.3 suite.
pub fn quic_config(s: &TlsSettings) -> Result<ServerConfig, String> {
    Ok(server_config(s, true)?.0)
}

/// The server configuration and the PEM of its certificate; `quic`: for
/// the HTTP/3 endpoint (see [`quic_config`]).
fn server_config(s: &TlsSettings, quic: bool) -> Result<(ServerConfig, String), String> {
    let mut suites = provider::DEFAULT_CIPHER_SUITES.to_vec();
    if let Some(list) = &s.ciphers {
        suites = pick_suites(list)?;
    }
    let mut versions = Vec::new();
    for v in &s.versions {
        match v.as_str() {
            "1.2" => versions.push(&rustls::version::TLS12),
            "1.3" => versions.push(&rustls::version::TLS13),
            other => {
                return Err(format!(
                    "ssl_version: TLS {other} is not supported (1.2 and 1.3 are)"
                ))
            }
        }
    }
    if versions.is_empty() {
        versions = vec![&rustls::version::TLS12, &rustls::version::TLS13];
    }
    if quic {
        versions.retain(|v| v.version == rustls::ProtocolVersion::TLSv1_3);
        if versions.is_empty() {
            return Err("http3 needs TLS 1.3 (QUIC), which ssl_version rules out".into());
        }
    }
    // Keep only versions some chosen suite can serve.
    versions.retain(|v| suites.iter().any(|s| s.version().version == v.version));
    if versions.is_empty() {
        return Err("ciphers: none of the named suites works with the allowed TLS versions".into());
    }
    let provider = Arc::new(CryptoProvider {
        cipher_suites: suites,
        ..provider::default_provider()
    });
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .map_err(|e| format!("TLS settings: {e}"))?;
    let builder = match (s.client_auth, &s.ca_certs) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err("cert_reqs asks for client certificates but ca_certs is not set".into())
        }
        (auth, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for c in certs(ca, "ca_certs")? {
                roots.add(c).map_err(|e| format!("ca_certs {ca}: {e}"))?;
            }
            let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            if auth == ClientAuth::Optional {
                v = v.allow_unauthenticated();
            }
            builder.with_client_cert_verifier(v.build().map_err(|e| format!("ca_certs {ca}: {e}"))?)
        }
    };
    let chain = certs(&s.certfile, "certfile")?;
    let server_pem = pem(&chain[0]);
    let mut config = builder
        .with_single_cert(chain, key(&s.keyfile)?)
        .map_err(|e| format!("certfile/keyfile: {e}"))?;
    config.alpn_protocols = if quic {
        vec![b"h3".to_vec()]
    } else if s.alpn.is_empty() {
        vec![b"http/1.1".to_vec()]
    } else {
        s.alpn.clone()
    };
    Ok((config, server_pem))
}

/// Runs the TLS handshake of an accepted connection. `None` (logged at
/// debug) if it fails, is not done within `tls_handshake_timeout` (a client
/// that connects and stays silent, or stalls mid-handshake, would otherwise
/// hold its connection slot and descriptor forever: rustls has no
/// deadline of its own), or the server stops (close 1001 time: a drain
/// still lets it finish, as a new connection's first request is served).
pub(crate) async fn handshake<IO>(
    acceptor: &TlsAcceptor,
    io: IO,
    shared: &Worker,
    peer: SocketAddr,
) -> Option<TlsStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let limit = shared.config.tls_handshake_timeout;
    let mut accept = pin!(acceptor.accept(io));
    let mut deadline = (!limit.is_zero()).then(|| Box::pin(tokio::time::sleep(limit)));
    // A member of the registry for the handshake's length, so a stop
    // order reaches it.
    let member = shared.connections.join();
    let mut registered = false;
    let res = poll_fn(|cx| {
        if !registered {
            member.register(cx.waker());
            registered = true;
        }
        if matches!(member.order(), Order::GoingAway | Order::Abort) {
            return Poll::Ready(Err("the server is stopping".to_owned()));
        }
        if let Poll::Ready(r) = accept.as_mut().poll(cx) {
            return Poll::Ready(r.map_err(|e| {
                if let Some(why) = client_cert_refusal(&e) {
                    // The one handshake failure an operator must see: a
                    // client with a certificate, refused (an X.509 v1
                    // certificate from `openssl x509 -req`, an unknown
                    // issuer, expired, none where one is required).
                    tracing::info!("TLS handshake with {peer}: client certificate refused: {why}");
                }
                e.to_string()
            }));
        }
        match deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(format!("not completed in {limit:?}"))),
            _ => Poll::Pending,
        }
    })
    .await;
    match res {
        Ok(s) => Some(s),
        Err(why) => {
            tracing::debug!("TLS handshake with {peer}: {why}");
            None
        }
    }
}

/// Why rustls refused the client's certificate, if that is why the
/// handshake failed.
fn client_cert_refusal(e: &std::io::Error) -> Option<String> {
    let err = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    match err {
        rustls::Error::InvalidCertificate(why) => {
            let why = format!("{why:?}");
            let hint = if why.contains("UnsupportedCertVersion") {
                " (an X.509 v1 certificate, as `openssl x509 -req` makes without \
                 `-extfile`: only v3 is accepted)"
            } else {
                ""
            };
            Some(format!("{why}{hint}"))
        }
        rustls::Error::NoCertificatesPresented => Some("none presented".into()),
        _ => None,
    }
}

/// The `tls` extension's facts of an HTTP/3 connection (TLS 1.3; the
/// suite is not known), from the client's certificate chain, if any.
pub fn quic_info(chain: Option<&[CertificateDer<'static>]>) -> TlsInfo {
    TlsInfo {
        version: u16::from(rustls::ProtocolVersion::TLSv1_3),
        cipher_suite: None,
        client_cert_chain: chain
            .map(|c| c.iter().map(|d| pem(d)).collect())
            .unwrap_or_default(),
        client_cert_name: chain
            .and_then(|c| c.first())
            .and_then(|leaf| crate::server::cert_name::subject_rfc4514(leaf)),
        h2: false,
    }
}

/// PEM text of a DER certificate.
pub fn pem(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// The facts of a finished handshake.
pub fn info(conn: &rustls::ServerConnection) -> TlsInfo {
    TlsInfo {
        version: conn.protocol_version().map_or(0, u16::from),
        cipher_suite: conn.negotiated_cipher_suite().map(|s| u16::from(s.suite())),
        client_cert_chain: conn
            .peer_certificates()
            .map(|c| c.iter().map(|d| pem(d)).collect())
            .unwrap_or_default(),
        client_cert_name: conn
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|leaf| crate::server::cert_name::subject_rfc4514(leaf)),
        h2: conn.alpn_protocol() == Some(b"h2"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_encodes_base64_in_64_column_lines() {
        let p = pem(b"\x00\x01\x02\x03");
        assert_eq!(
            p,
            "-----BEGIN CERTIFICATE-----\nAAECAw==\n-----END CERTIFICATE-----\n"
        );
        let round = CertificateDer::from_pem_slice(pem(&[7u8; 100]).as_bytes()).expect("parses");
        assert_eq!(round.as_ref(), &[7u8; 100][..]);
    }

    #[test]
    fn cipher_names_in_either_spelling() {
        let s = pick_suites("ECDHE-RSA-AES128-GCM-SHA256:TLS_AES_256_GCM_SHA384").expect("known");
        assert_eq!(s.len(), 2);
        let e = pick_suites("HIGH:!aNULL").unwrap_err();
        assert!(e.contains("\"HIGH\""), "{e}");
    }
}
