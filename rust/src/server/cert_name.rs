//! The subject of a client certificate as an RFC 4514 string, for the
//! ASGI `tls` extension's `client_cert_name`.
//!
//! The certificate is parsed by `x509-cert`; the string is written here so
//! that it matches what Python's `cryptography` gives
//! (`Name.rfc4514_string()`), which apps compare against: RDNs last to
//! first (RFC 4514 §2.1), `+` inside a multi-valued RDN, the short names of
//! RFC 4514 §3 and dotted OIDs for every other type (§2.3), and the escapes
//! of §2.4. Values that are not strings are `#` and their hex (§2.4).

use x509_cert::der::asn1::ObjectIdentifier as Oid;
use x509_cert::der::{Decode, Tag, Tagged};

/// The short names RFC 4514 §3 lists (those `cryptography` uses).
const SHORT_NAMES: [(Oid, &str); 9] = [
    (Oid::new_unwrap("2.5.4.3"), "CN"),
    (Oid::new_unwrap("2.5.4.7"), "L"),
    (Oid::new_unwrap("2.5.4.8"), "ST"),
    (Oid::new_unwrap("2.5.4.10"), "O"),
    (Oid::new_unwrap("2.5.4.11"), "OU"),
    (Oid::new_unwrap("2.5.4.6"), "C"),
    (Oid::new_unwrap("2.5.4.9"), "STREET"),
    (Oid::new_unwrap("0.9.2342.19200300.100.1.25"), "DC"),
    (Oid::new_unwrap("0.9.2342.19200300.100.1.1"), "UID"),
];

/// The subject of the DER certificate `der` as an RFC 4514 string; `None`
/// if it does not parse.
pub fn subject_rfc4514(der: &[u8]) -> Option<String> {
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    let mut out = String::new();
    for (i, rdn) in cert.tbs_certificate.subject.0.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, atv) in rdn.0.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            match SHORT_NAMES.iter().find(|(oid, _)| *oid == atv.oid) {
                Some((_, name)) => out.push_str(name),
                None => out.push_str(&atv.oid.to_string()),
            }
            out.push('=');
            let bytes = atv.value.value();
            match decode_string(atv.value.tag(), bytes) {
                Some(s) => escape_into(&s, &mut out),
                None => {
                    out.push('#');
                    for b in bytes {
                        out.push_str(&format!("{b:02x}"));
                    }
                }
            }
        }
    }
    Some(out)
}

/// A directory string's text (X.520): the string types certificates use.
fn decode_string(tag: Tag, b: &[u8]) -> Option<String> {
    match tag {
        Tag::Utf8String | Tag::PrintableString | Tag::Ia5String | Tag::VisibleString => {
            Some(String::from_utf8_lossy(b).into_owned())
        }
        // T.61 in practice carries Latin-1.
        Tag::TeletexString => Some(b.iter().map(|&c| c as char).collect()),
        Tag::BmpString => {
            let units = b.chunks_exact(2).map(|p| u16::from_be_bytes([p[0], p[1]]));
            Some(
                char::decode_utf16(units)
                    .map(|c| c.unwrap_or('\u{FFFD}'))
                    .collect(),
            )
        }
        _ => None,
    }
}

/// RFC 4514 §2.4 escapes, as `cryptography` applies them.
fn escape_into(v: &str, out: &mut String) {
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        match c {
            '\\' | '"' | '+' | ',' | ';' | '<' | '>' => {
                out.push('\\');
                out.push(c);
            }
            '\0' => out.push_str("\\00"),
            '#' | ' ' if i == 0 => {
                out.push('\\');
                out.push(c);
            }
            ' ' if i == last => out.push_str("\\ "),
            _ => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::escape_into;

    fn esc(v: &str) -> String {
        let mut s = String::new();
        escape_into(v, &mut s);
        s
    }

    #[test]
    fn escapes_follow_rfc_4514_section_2_4() {
        assert_eq!(esc("a,b+c;d<e>f\"g\\h"), "a\\,b\\+c\\;d\\<e\\>f\\\"g\\\\h");
        assert_eq!(esc("#x"), "\\#x");
        assert_eq!(esc(" lead and trail "), "\\ lead and trail\\ ");
        assert_eq!(esc("mid#dle"), "mid#dle");
        assert_eq!(esc("nul\0"), "nul\\00");
        assert_eq!(esc(" "), "\\ ");
    }
}
