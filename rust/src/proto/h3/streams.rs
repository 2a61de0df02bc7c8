//! h3's QUIC stream traits on the quinn streams a client opens, in place
//! of `h3-quinn`'s for them.
//!
//! `h3-quinn` 0.0.10's receiving stream moves its quinn stream into the
//! read future while a read is pending, and `stop_sending` and `recv_id`
//! unwrap it: stopping a stream whose next bytes have not arrived (a
//! request head that timed out, [`super::deadline`]) panicked the task,
//! and quinn then dropped the stream with STOP_SENDING code 0. Here the
//! quinn stream stays in place: quinn's `read_chunk` is cancel-safe and
//! keeps its state in the stream, so each poll makes its future afresh
//! (on the stack, no allocation). The sending half is `h3-quinn`'s (whose
//! constructor is private), writing each frame as one chunk.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};
use quinn::VarInt;
use tokio_util::sync::ReusableBoxFuture;

/// A QUIC error code as quinn takes it; codes past 2^62 (never h3's) as
/// the largest.
fn code(c: u64) -> VarInt {
    VarInt::from_u64(c).unwrap_or(VarInt::MAX)
}

/// h3's form of a quinn stream id.
fn stream_id(id: quinn::StreamId) -> StreamId {
    // quinn's stream ids are varints (< 2^62), which h3 accepts.
    StreamId::try_from(u64::from(id)).expect("a quinn stream id is a varint")
}

/// A lost connection as h3 sees it (as `h3-quinn` maps it).
pub(crate) fn connection_error(e: quinn::ConnectionError) -> ConnectionErrorIncoming {
    match e {
        quinn::ConnectionError::ApplicationClosed(close) => {
            ConnectionErrorIncoming::ApplicationClose {
                error_code: close.error_code.into(),
            }
        }
        quinn::ConnectionError::TimedOut => ConnectionErrorIncoming::Timeout,
        other => ConnectionErrorIncoming::Undefined(Arc::new(other)),
    }
}

/// The receiving half of a client's stream.
pub(crate) struct Recv {
    stream: quinn::RecvStream,
}

impl Recv {
    pub(crate) fn new(stream: quinn::RecvStream) -> Self {
        Recv { stream }
    }
}

impl quic::RecvStream for Recv {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let read = pin!(self.stream.read_chunk(usize::MAX, true));
        Poll::Ready(match ready!(read.poll(cx)) {
            Ok(chunk) => Ok(chunk.map(|c| c.bytes)),
            Err(quinn::ReadError::Reset(c)) => Err(StreamErrorIncoming::StreamTerminated {
                error_code: c.into_inner(),
            }),
            Err(quinn::ReadError::ConnectionLost(e)) => {
                Err(StreamErrorIncoming::ConnectionErrorIncoming {
                    connection_error: connection_error(e),
                })
            }
            Err(e) => Err(StreamErrorIncoming::Unknown(Box::new(e))),
        })
    }

    fn stop_sending(&mut self, error_code: u64) {
        // Err: already stopped or finished and read; nothing to do.
        let _ = self.stream.stop(code(error_code));
    }

    fn recv_id(&self) -> StreamId {
        stream_id(self.stream.id())
    }
}

/// The sending half of a client's bidirectional stream. Unlike
/// `h3-quinn`'s, each frame h3 hands over (its header and payload) is
/// written to quinn as one chunk: one lock of the connection and one wake
/// of its driver per frame, not one per piece, and quinn keeps the chunk
/// instead of copying it again.
pub(crate) struct Send<B: Buf> {
    stream: quinn::SendStream,
    /// The frame being written, what quinn has not taken of it.
    writing: Option<Bytes>,
    _payload: PhantomData<B>,
}

impl<B: Buf> Send<B> {
    pub(crate) fn new(stream: quinn::SendStream) -> Self {
        Send {
            stream,
            writing: None,
            _payload: PhantomData,
        }
    }
}

/// Implements `quic::SendStream<B>` for `$t<B>`, a wrapper of a
/// bidirectional stream, by forwarding every call to its field `$field`
/// (the wrappers watch only what is received).
macro_rules! forward_send_stream {
    ($t:ident, $field:ident) => {
        impl<B: ::bytes::Buf> ::h3::quic::SendStream<B> for $t<B> {
            fn poll_ready(
                &mut self,
                cx: &mut ::std::task::Context<'_>,
            ) -> ::std::task::Poll<Result<(), ::h3::quic::StreamErrorIncoming>> {
                self.$field.poll_ready(cx)
            }

            fn send_data<T: Into<::h3::quic::WriteBuf<B>>>(
                &mut self,
                data: T,
            ) -> Result<(), ::h3::quic::StreamErrorIncoming> {
                self.$field.send_data(data)
            }

            fn poll_finish(
                &mut self,
                cx: &mut ::std::task::Context<'_>,
            ) -> ::std::task::Poll<Result<(), ::h3::quic::StreamErrorIncoming>> {
                self.$field.poll_finish(cx)
            }

            fn reset(&mut self, reset_code: u64) {
                self.$field.reset(reset_code)
            }

            fn send_id(&self) -> ::h3::quic::StreamId {
                self.$field.send_id()
            }
        }
    };
}
pub(crate) use forward_send_stream;

fn write_error(e: quinn::WriteError) -> StreamErrorIncoming {
    match e {
        quinn::WriteError::Stopped(c) => StreamErrorIncoming::StreamTerminated {
            error_code: c.into_inner(),
        },
        quinn::WriteError::ConnectionLost(e) => StreamErrorIncoming::ConnectionErrorIncoming {
            connection_error: connection_error(e),
        },
        other => StreamErrorIncoming::Unknown(Box::new(other)),
    }
}

impl<B: Buf> quic::SendStream<B> for Send<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        while let Some(chunk) = self.writing.as_mut().filter(|c| !c.is_empty()) {
            // Cancel-safe: what quinn takes is split off `chunk`.
            let write = pin!(self.stream.write_chunks(std::slice::from_mut(chunk)));
            ready!(write.poll(cx)).map_err(write_error)?;
        }
        self.writing = None;
        Poll::Ready(Ok(()))
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        if self.writing.is_some() {
            // h3 misusing the trait (as `h3-quinn` answers it).
            return Err(StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error: ConnectionErrorIncoming::InternalError(
                    "send_data while a write is pending".into(),
                ),
            });
        }
        let mut frame: WriteBuf<B> = data.into();
        let mut chunk = BytesMut::with_capacity(frame.remaining());
        chunk.put(&mut frame);
        self.writing = Some(chunk.freeze());
        Ok(())
    }

    fn poll_finish(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        Poll::Ready(
            self.stream
                .finish()
                .map_err(|e| StreamErrorIncoming::Unknown(Box::new(e))),
        )
    }

    fn reset(&mut self, reset_code: u64) {
        let _ = self.stream.reset(code(reset_code));
    }

    fn send_id(&self) -> StreamId {
        stream_id(self.stream.id())
    }
}

/// An accept of quinn's, boxed to be polled from h3's traits; the box is
/// kept and reused from one stream to the next.
type Accepting<T> = ReusableBoxFuture<'static, Result<T, quinn::ConnectionError>>;

/// Accepts the client's streams of a connection, one kind at a time.
pub(crate) struct Acceptor {
    qconn: quinn::Connection,
    bidi: Accepting<(quinn::SendStream, quinn::RecvStream)>,
    /// Whether `bidi` holds an accept not yet resolved.
    bidi_pending: bool,
    uni: Accepting<quinn::RecvStream>,
    uni_pending: bool,
}

impl Acceptor {
    pub(crate) fn new(qconn: quinn::Connection) -> Self {
        let (b, u) = (qconn.clone(), qconn.clone());
        Acceptor {
            qconn,
            bidi: ReusableBoxFuture::new(async move { b.accept_bi().await }),
            bidi_pending: true,
            uni: ReusableBoxFuture::new(async move { u.accept_uni().await }),
            uni_pending: true,
        }
    }

    /// The next bidirectional stream the client opens.
    pub(crate) fn poll_bidi<B: Buf>(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(Send<B>, Recv), ConnectionErrorIncoming>> {
        if !self.bidi_pending {
            let q = self.qconn.clone();
            self.bidi.set(async move { q.accept_bi().await });
            self.bidi_pending = true;
        }
        let got = ready!(self.bidi.poll(cx));
        self.bidi_pending = false;
        let (send, recv) = got.map_err(connection_error)?;
        Poll::Ready(Ok((Send::new(send), Recv::new(recv))))
    }

    /// The next unidirectional stream the client opens.
    pub(crate) fn poll_uni(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Recv, ConnectionErrorIncoming>> {
        if !self.uni_pending {
            let q = self.qconn.clone();
            self.uni.set(async move { q.accept_uni().await });
            self.uni_pending = true;
        }
        let got = ready!(self.uni.poll(cx));
        self.uni_pending = false;
        Poll::Ready(Ok(Recv::new(got.map_err(connection_error)?)))
    }
}
