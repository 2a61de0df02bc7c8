//! Compression options (`compression`, `compression_min_size`,
//! `compression_event_stream`): what [`crate::http::compress`] negotiates
//! and applies.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{count, str_list};

/// A content coding Skirr can apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    Zstd,
    Br,
}

impl Coding {
    /// Its token in `Accept-Encoding` / `Content-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Zstd => "zstd",
            Coding::Br => "br",
        }
    }

    /// Parses a token of the `compression` option.
    pub fn parse(s: &str) -> Option<Coding> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gzip" => Some(Coding::Gzip),
            "zstd" => Some(Coding::Zstd),
            "br" => Some(Coding::Br),
            _ => None,
        }
    }
}

/// The compression settings.
#[derive(Clone, Debug)]
pub struct Compression {
    /// Codings offered, in the server's order of preference (between
    /// codings the client weighs equally).
    pub codings: Vec<Coding>,
    /// Bodies known to be smaller than this (bytes) are sent as they are.
    /// Default 500.
    pub min_size: u64,
    /// `text/event-stream` responses are compressed too. Default off.
    pub event_stream: bool,
}

/// The `compression*` keys as read.
pub(super) struct Options(Compression);

impl Default for Options {
    fn default() -> Self {
        Options(Compression {
            codings: Vec::new(),
            min_size: 500,
            event_stream: false,
        })
    }
}

impl Options {
    /// Takes `key` if it is a compression option (returns whether it was).
    ///
    /// Errors: `ValueError` for an unknown coding or a negative size,
    /// `TypeError` for a value of the wrong type.
    pub(super) fn set(&mut self, key: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
        let compression = &mut self.0;
        match key {
            "compression" => {
                compression.codings.clear();
                for t in str_list(v, key)? {
                    let coding = Coding::parse(&t).ok_or_else(|| {
                        PyValueError::new_err(format!(
                            "option 'compression': unknown coding {t:?} (gzip, zstd or br)"
                        ))
                    })?;
                    if !compression.codings.contains(&coding) {
                        compression.codings.push(coding);
                    }
                }
            }
            "compression_min_size" => compression.min_size = count(v, key)?,
            "compression_event_stream" => compression.event_stream = v.extract()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The settings, or `None` when no coding is offered (compression off).
    pub(super) fn finish(self) -> Option<Compression> {
        (!self.0.codings.is_empty()).then_some(self.0)
    }
}
