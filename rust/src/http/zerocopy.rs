//! `http.response.zerocopysend` (ASGI "Zero Copy Send" extension): the app
//! hands over a region of an open file; the Tokio side reads it and writes
//! it as body data, in order with `http.response.body` chunks.
//!
//! Ownership: the app keeps its file (the spec makes closing it the app's
//! job). `send()` duplicates the descriptor at once, so the app may close
//! its file as soon as `send()` returns; the duplicate closes when its
//! region is written, the client leaves or the response is dropped. Reads
//! are positional (`pread(2)`): the duplicate shares the app's file offset,
//! which the Tokio side never reads or moves. Reads go through Tokio's
//! blocking pool, 256 KiB at a time; hyper writes the socket, so there is
//! no `sendfile(2)` (the data is copied once through userspace, as for
//! `http.response.pathsend`).

use std::fs::File;
use std::future::Future;
use std::io::{Seek, SeekFrom};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};
use tokio::task::JoinHandle;

use crate::asgi::message::type_name;

/// The message type, for error messages.
pub(crate) const WHAT: &str = "http.response.zerocopysend";

/// Bytes read per body frame.
const CHUNK: usize = 256 * 1024;

/// A region of a file to send: `len` bytes from `offset`, read through a
/// descriptor of the server's own (a duplicate of the app's).
pub(crate) struct FileSegment {
    file: Arc<File>,
    offset: u64,
    len: usize,
}

impl FileSegment {
    /// Bytes still to send.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Moves the app's file position past the region sent, as `sendfile(2)`
/// does when it is given no offset: run once the message is accepted.
pub(crate) enum Advance {
    /// Through the file object's own `seek()` (keeps a Python buffered
    /// reader consistent with what was sent).
    Python(Py<PyAny>, u64),
    /// With `lseek(2)` on the (shared) file offset.
    Os(Arc<File>, u64),
}

impl Advance {
    /// Sets the position; errors are the `seek()` call's.
    pub(crate) fn run(self, py: Python<'_>) -> PyResult<()> {
        match self {
            Advance::Python(f, to) => {
                f.bind(py).call_method1(intern!(py, "seek"), (to,))?;
            }
            Advance::Os(f, to) => {
                (&*f).seek(SeekFrom::Start(to)).map_err(|e| {
                    PyRuntimeError::new_err(format!("{WHAT}: cannot move the file position: {e}"))
                })?;
            }
        }
        Ok(())
    }
}

/// A parsed `http.response.zerocopysend` message.
pub(crate) struct ZeroCopySend {
    /// The region to send (already duplicated).
    pub(crate) segment: FileSegment,
    /// More body messages follow.
    pub(crate) more_body: bool,
    /// Set when the message gave no `offset`.
    pub(crate) advance: Option<Advance>,
}

/// An optional non-negative int field (`None` counts as absent).
fn optional_u64(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Option<u64>> {
    let Some(v) = d.get_item(key)? else {
        return Ok(None);
    };
    if v.is_none() {
        return Ok(None);
    }
    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{WHAT} '{key}' must be an int, got {}",
            type_name(&v)
        )));
    }
    match v.extract::<u64>() {
        Ok(n) => Ok(Some(n)),
        Err(_) => {
            let shown = v.str().map(|s| s.to_string()).unwrap_or_default();
            Err(PyRuntimeError::new_err(format!(
                "{WHAT} '{key}' must be a non-negative int, got {shown}"
            )))
        }
    }
}

/// `file.fileno()`, duplicated: a descriptor the server owns.
fn dup_fileno(file: &Bound<'_, PyAny>) -> PyResult<File> {
    let py = file.py();
    let no_fd = |why: String| {
        PyTypeError::new_err(format!(
            "{WHAT} 'file' must be a file object with an OS file descriptor \
             (fileno()), got {}: {why}",
            type_name(file)
        ))
    };
    let fileno = file
        .getattr(intern!(py, "fileno"))
        .map_err(|_| no_fd("it has no fileno()".into()))?;
    let fd = fileno
        .call0()
        .map_err(|e| no_fd(format!("fileno() raised {e}")))?;
    let fd: i32 = fd
        .extract()
        .ok()
        .filter(|fd| *fd >= 0)
        .ok_or_else(|| no_fd(format!("fileno() returned {}", type_name(&fd))))?;
    // SAFETY: `fd` is not -1 and is the descriptor the app's file object
    // just reported. This thread holds the GIL (not released between
    // `fileno()` and the dup) and a reference to the object, so no Python
    // code can close it while `borrowed` lives, which is only for the
    // `dup` on the next line. A descriptor closed behind Python's back
    // makes that `dup` fail (EBADF), reported as an error.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let owned = borrowed.try_clone_to_owned().map_err(|e| {
        PyRuntimeError::new_err(format!("{WHAT}: cannot duplicate descriptor {fd}: {e}"))
    })?;
    let file = File::from(owned);
    // A file opened for writing only fails at the first read, after the
    // head is out: refused here instead.
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    if let Ok(flags) = fcntl(&file, FcntlArg::F_GETFL) {
        if OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE == OFlag::O_WRONLY {
            return Err(PyRuntimeError::new_err(format!(
                "{WHAT}: the file (descriptor {fd}) is open for writing only"
            )));
        }
    }
    Ok(file)
}

/// The file's current position: its own `tell()` when it has one (a
/// buffered reader's position is not the descriptor's; `true` is returned
/// then), else the descriptor's, from `lseek(2)`.
fn position(file: &Bound<'_, PyAny>, dup: &File) -> PyResult<(u64, bool)> {
    let py = file.py();
    if file.hasattr(intern!(py, "tell"))? && file.hasattr(intern!(py, "seek"))? {
        let pos = file.call_method0(intern!(py, "tell"))?;
        let pos: u64 = pos.extract().map_err(|_| {
            PyRuntimeError::new_err(format!(
                "{WHAT}: the file's tell() returned {}, not a non-negative int",
                type_name(&pos)
            ))
        })?;
        return Ok((pos, true));
    }
    let pos = (&*dup)
        .stream_position()
        .map_err(|e| PyRuntimeError::new_err(format!("{WHAT}: cannot read the position: {e}")))?;
    Ok((pos, false))
}

/// Parses an `http.response.zerocopysend` message (ASGI extensions doc):
/// `file` (an object with `fileno()`, on a regular file), optional `offset`
/// (default: the file's current position, which then moves past the region,
/// as `sendfile(2)` without an offset does), optional `count` (default: to
/// the end of the file) and `more_body`.
///
/// Errors: `TypeError` for a missing or wrong-typed field or an object
/// without a descriptor; `RuntimeError` for negative values, a region past
/// the end of the file, or a descriptor that is not a regular file.
pub(crate) fn parse(d: &Bound<'_, PyDict>) -> PyResult<ZeroCopySend> {
    let py = d.py();
    let file = d
        .get_item("file")?
        .ok_or_else(|| PyTypeError::new_err(format!("{WHAT} has no 'file'")))?;
    let offset = optional_u64(d, "offset")?;
    let count = optional_u64(d, "count")?;
    let dup = dup_fileno(&file)?;
    let meta = dup
        .metadata()
        .map_err(|e| PyRuntimeError::new_err(format!("{WHAT}: cannot stat 'file': {e}")))?;
    if !meta.is_file() {
        return Err(PyRuntimeError::new_err(format!(
            "{WHAT} 'file' must be a regular file (pipes, sockets and devices cannot be \
             read at an offset)"
        )));
    }
    let size = meta.len();
    let (offset, by_python) = match offset {
        Some(o) => (o, None),
        None => {
            let (pos, by_python) = position(&file, &dup)?;
            (pos, Some(by_python))
        }
    };
    if offset > size {
        return Err(PyRuntimeError::new_err(format!(
            "{WHAT} 'offset' {offset} is past the end of the file ({size} bytes)"
        )));
    }
    let count = count.unwrap_or(size - offset);
    if count > size - offset {
        return Err(PyRuntimeError::new_err(format!(
            "{WHAT} 'count' {count} from offset {offset} runs past the end of the file \
             ({size} bytes)"
        )));
    }
    let len = usize::try_from(count)
        .map_err(|_| PyRuntimeError::new_err(format!("{WHAT} 'count' {count} is too large")))?;
    let end = offset + count;
    let dup = Arc::new(dup);
    let advance = by_python.map(|python| {
        if python {
            Advance::Python(file.clone().unbind(), end)
        } else {
            Advance::Os(Arc::clone(&dup), end)
        }
    });
    let more_body = match d.get_item(intern!(py, "more_body"))? {
        Some(m) => m.is_truthy()?,
        None => false,
    };
    Ok(ZeroCopySend {
        segment: FileSegment {
            file: dup,
            offset,
            len,
        },
        more_body,
        advance,
    })
}

/// A region being read on the Tokio side, one frame at a time.
pub(crate) struct FileRead {
    seg: FileSegment,
    task: Option<JoinHandle<std::io::Result<Vec<u8>>>>,
}

/// Reading the region failed: the response cannot be completed.
pub(crate) struct ReadFailed {
    /// Bytes of the region that will never be sent.
    pub(crate) unread: usize,
}

impl FileRead {
    /// Starts reading `seg`.
    pub(crate) fn new(seg: FileSegment) -> Self {
        Self { seg, task: None }
    }

    /// The next frame of the region; `None` once it is all read.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, ReadFailed>>> {
        if self.seg.len == 0 {
            return Poll::Ready(None);
        }
        let task = self.task.get_or_insert_with(|| {
            let file = Arc::clone(&self.seg.file);
            let (offset, want) = (self.seg.offset, self.seg.len.min(CHUNK));
            tokio::task::spawn_blocking(move || read_region(&file, offset, want))
        });
        let res = match std::pin::Pin::new(task).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        self.task = None;
        let unread = self.seg.len;
        match res {
            Ok(Ok(buf)) if !buf.is_empty() => {
                self.seg.offset += buf.len() as u64;
                self.seg.len -= buf.len();
                Poll::Ready(Some(Ok(Bytes::from(buf))))
            }
            Ok(Ok(_)) => {
                tracing::error!("{WHAT}: the file ended {unread} bytes early");
                self.seg.len = 0;
                Poll::Ready(Some(Err(ReadFailed { unread })))
            }
            Ok(Err(e)) => {
                tracing::error!("{WHAT}: reading the file failed: {e}");
                self.seg.len = 0;
                Poll::Ready(Some(Err(ReadFailed { unread })))
            }
            Err(e) => {
                tracing::error!("{WHAT}: the read task failed: {e}");
                self.seg.len = 0;
                Poll::Ready(Some(Err(ReadFailed { unread })))
            }
        }
    }
}

/// Up to `want` bytes from `offset` (fewer only at the end of the file).
fn read_region(file: &File, offset: u64, want: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn read_region_is_positional_and_stops_at_the_end() {
        let mut f = tempfile_with(b"0123456789");
        f.seek(SeekFrom::Start(7)).unwrap();
        assert_eq!(read_region(&f, 2, 3).unwrap(), b"234");
        assert_eq!(read_region(&f, 8, 5).unwrap(), b"89");
        assert_eq!(
            f.stream_position().unwrap(),
            7,
            "the shared offset is untouched"
        );
    }

    fn tempfile_with(data: &[u8]) -> File {
        let path = std::env::temp_dir().join(format!("skirr-zcs-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(data).unwrap();
        f
    }
}
