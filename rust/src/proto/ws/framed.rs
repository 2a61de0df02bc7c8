//! The message stream the driver runs on: Skirr's framing
//! ([`wire::ws_frame`](crate::wire::ws_frame)) and permessage-deflate
//! ([`wire::ws_deflate`](crate::wire::ws_deflate)) over the upgraded
//! socket, with the `Stream`/`Sink` shape and the close-handshake
//! behaviour of tokio-tungstenite's `WebSocketStream` (which it replaced:
//! tungstenite has no compression and rejects RSV1): a ping is answered
//! with a pong (the latest one, if several wait), a peer's close frame is
//! echoed (1002 if its code is not allowed) and ends the stream; tungstenite's
//! `Message` and `Error` types are kept so the driver's mapping to close
//! codes is unchanged.
//!
//! Bounded: one message is written at a time (`poll_ready` waits until the
//! previous one is on the socket, so `send_buffer` keeps bounding what the
//! app may queue); reading stops after each message until the driver asks
//! for the next.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tungstenite::error::{CapacityError, ProtocolError};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::frame::Utf8Bytes;
use tungstenite::protocol::CloseFrame;
use tungstenite::{Error, Message};

use crate::wire::ws_deflate::{Deflater, Inflater};
use crate::wire::ws_extension::Agreed;
use crate::wire::ws_frame::{self, close_code_allowed, opcode, FrameReader, Incoming, ReadError};

/// Bytes read from the socket at once (as tungstenite's read buffer was:
/// an idle connection should cost little).
const READ_CHUNK: usize = 4096;
/// An output buffer larger than this is freed once written.
const KEEP_OUT: usize = 64 * 1024;

/// Compression settings of one connection.
pub(crate) struct Deflate {
    pub(crate) agreed: Agreed,
    /// `ws_deflate_window_bits`: the window Skirr compresses with.
    pub(crate) window_bits: u8,
    /// `ws_deflate_min_size`: smaller messages go uncompressed.
    pub(crate) min_size: usize,
}

/// A WebSocket over `io`; see the module docs.
pub(crate) struct Framed<S> {
    io: S,
    reader: FrameReader,
    rbuf: Box<[u8]>,
    rpos: usize,
    rend: usize,
    out: Vec<u8>,
    opos: usize,
    deflater: Option<(Deflater, usize)>,
    zbuf: Vec<u8>,
    pending_pong: Option<Vec<u8>>,
    close_sent: bool,
    close_received: bool,
    ended: bool,
}

fn read_error(e: ReadError) -> Error {
    match e {
        ReadError::InvalidUtf8 => Error::Utf8("invalid UTF-8".into()),
        ReadError::TooBig => Error::Capacity(CapacityError::MessageTooLong {
            size: 0,
            max_size: 0,
        }),
        ReadError::Protocol(why) => {
            tracing::debug!("WebSocket protocol violation: {why}");
            Error::Protocol(ProtocolError::InvalidOpcode(0))
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Framed<S> {
    /// A server-side WebSocket: messages up to `max_message_size` bytes
    /// (after inflation), compressed as agreed if `deflate`.
    pub(crate) fn new(io: S, max_message_size: usize, deflate: Option<Deflate>) -> Self {
        let inflater = deflate.as_ref().map(|d| Inflater::new(&d.agreed));
        let deflater = deflate
            .map(|d| (Deflater::new(&d.agreed, d.window_bits), d.min_size))
            .filter(|(d, _)| d.enabled());
        Framed {
            io,
            reader: FrameReader::new(max_message_size, inflater),
            rbuf: vec![0; READ_CHUNK].into_boxed_slice(),
            rpos: 0,
            rend: 0,
            out: Vec::new(),
            opos: 0,
            deflater,
            zbuf: Vec::new(),
            pending_pong: None,
            close_sent: false,
            close_received: false,
            ended: false,
        }
    }

    fn push_close(&mut self, frame: Option<&CloseFrame>) {
        let mut p = Vec::new();
        if let Some(f) = frame {
            p.extend_from_slice(&u16::from(f.code).to_be_bytes());
            // A close payload is at most 125 bytes (§5.5): cut the reason
            // at a character boundary.
            let mut end = f.reason.len().min(123);
            while !f.reason.is_char_boundary(end) {
                end -= 1;
            }
            p.extend_from_slice(&f.reason.as_bytes()[..end]);
        }
        ws_frame::write_frame(&mut self.out, opcode::CLOSE, false, &p);
        self.close_sent = true;
        self.pending_pong = None;
    }

    fn event(&mut self, ev: Incoming) -> Message {
        match ev {
            // SAFETY: the reader checked the bytes are UTF-8.
            Incoming::Text(v) => {
                Message::Text(unsafe { Utf8Bytes::from_bytes_unchecked(Bytes::from(v)) })
            }
            Incoming::Binary(v) => Message::Binary(Bytes::from(v)),
            Incoming::Ping(p) => {
                if !self.close_sent {
                    self.pending_pong = Some(p.clone());
                }
                Message::Ping(Bytes::from(p))
            }
            Incoming::Pong(p) => Message::Pong(Bytes::from(p)),
            Incoming::Close(c) => {
                self.close_received = true;
                let frame = c.map(|(code, reason)| {
                    if close_code_allowed(code) {
                        CloseFrame {
                            code: CloseCode::from(code),
                            reason: reason.into(),
                        }
                    } else {
                        CloseFrame {
                            code: CloseCode::Protocol,
                            reason: Utf8Bytes::from_static("Protocol violation"),
                        }
                    }
                });
                if !self.close_sent {
                    // The reply echoes the peer's code (§5.5.1).
                    self.push_close(frame.as_ref());
                }
                Message::Close(frame)
            }
        }
    }

    /// Writes the output buffer (then a waiting pong). `Ready(Ok)` once
    /// everything is on the socket.
    fn write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            if self.opos == self.out.len() {
                self.opos = 0;
                if self.out.capacity() > KEEP_OUT {
                    self.out = Vec::new();
                } else {
                    self.out.clear();
                }
                match self.pending_pong.take() {
                    Some(p) if !self.close_sent => {
                        ws_frame::write_frame(&mut self.out, opcode::PONG, false, &p)
                    }
                    _ => return Poll::Ready(Ok(())),
                }
            }
            match Pin::new(&mut self.io).poll_write(cx, &self.out[self.opos..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(Error::Io(std::io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(n)) => self.opos += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Error::Io(e))),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn encode(&mut self, op: u8, data: &[u8]) {
        if let Some((d, min)) = self.deflater.as_mut() {
            if data.len() >= *min {
                self.zbuf.clear();
                if d.compress(data, &mut self.zbuf) {
                    ws_frame::write_frame(&mut self.out, op, true, &self.zbuf);
                    if self.zbuf.capacity() > KEEP_OUT {
                        self.zbuf = Vec::new();
                    }
                    return;
                }
            }
        }
        ws_frame::write_frame(&mut self.out, op, false, data);
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Stream for Framed<S> {
    type Item = Result<Message, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.ended || this.close_received {
                // After the peer's close frame nothing more is read; the
                // driver flushes our reply.
                this.ended = true;
                return Poll::Ready(None);
            }
            if this.rpos < this.rend {
                let (n, res) = this.reader.feed(&this.rbuf[this.rpos..this.rend]);
                this.rpos += n;
                match res {
                    Ok(Some(ev)) => return Poll::Ready(Some(Ok(this.event(ev)))),
                    Ok(None) => continue,
                    Err(e) => {
                        this.ended = true;
                        return Poll::Ready(Some(Err(read_error(e))));
                    }
                }
            }
            let mut buf = ReadBuf::new(&mut this.rbuf);
            match Pin::new(&mut this.io).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) => {
                    let n = buf.filled().len();
                    if n == 0 {
                        this.ended = true;
                        return Poll::Ready(Some(Err(Error::Protocol(
                            ProtocolError::ResetWithoutClosingHandshake,
                        ))));
                    }
                    this.rpos = 0;
                    this.rend = n;
                }
                Poll::Ready(Err(e)) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(Error::Io(e))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Sink<Message> for Framed<S> {
    type Error = Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.write_out(cx)
    }

    fn start_send(mut self: Pin<&mut Self>, msg: Message) -> Result<(), Error> {
        let this = &mut *self;
        match msg {
            Message::Close(f) => {
                if !this.close_sent {
                    this.push_close(f.as_ref());
                }
                Ok(())
            }
            _ if this.close_sent => Err(Error::Protocol(ProtocolError::SendAfterClosing)),
            Message::Text(t) => {
                this.encode(opcode::TEXT, t.as_bytes());
                Ok(())
            }
            Message::Binary(b) => {
                this.encode(opcode::BINARY, &b);
                Ok(())
            }
            Message::Ping(p) => {
                ws_frame::write_frame(&mut this.out, opcode::PING, false, &p[..p.len().min(125)]);
                Ok(())
            }
            Message::Pong(p) => {
                ws_frame::write_frame(&mut this.out, opcode::PONG, false, &p[..p.len().min(125)]);
                Ok(())
            }
            Message::Frame(_) => Ok(()),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        match self.write_out(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.io).poll_flush(cx).map_err(Error::Io),
            other => other,
        }
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        match self.as_mut().poll_flush(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.io).poll_shutdown(cx).map_err(Error::Io),
            other => other,
        }
    }
}
