//! A reply in one `write`: the accepted connection as h2 should see it.
//!
//! h2 puts a reply's HEADERS, DATA and trailing HEADERS frames in one write only when it copies
//! the message into its own buffer. On a socket that takes vectored writes it copies messages of
//! up to 256 bytes and sends a longer one as a slice of its own, flushing before the trailers: two
//! `writev`s and two TCP segments for every RequestToken reply (about 300 bytes), and a client
//! that may wake for each. On a socket that does not take them it copies messages of up to 1 KiB.
//!
//! [`OneWrite`] is that second kind of socket, and it gathers what h2 writes between two flushes
//! in one buffer (tokio's [`BufWriter`], [`BUFFER`] bytes per connection beside h2's own 16 KiB),
//! so that a message of up to 1 KiB leaves with its headers and trailers in one `write`, and a
//! longer one in two, as before (three past the buffer: the rare large listing). The price is one
//! more copy of each reply's bytes (a few hundred, against a system call and a TCP segment saved).
//! Nothing waits in the buffer: h2 flushes at the end of every round of frames it writes.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};
use tonic::transport::server::Connected;

/// The gathering buffer of one connection. A reply with a signed grant statement (about 1.1 KB
/// with its headers) fits, and leaves in one write; its trailers follow in a second, since h2
/// flushes after a message it did not copy.
pub const BUFFER: usize = 4096;

/// An accepted connection whose writes are gathered until h2 flushes.
#[derive(Debug)]
pub struct OneWrite<T>(BufWriter<T>);

impl<T: AsyncWrite> OneWrite<T> {
    /// Wraps an accepted connection.
    pub fn new(io: T) -> Self {
        Self(BufWriter::with_capacity(BUFFER, io))
    }
}

impl<T: Connected + AsyncWrite> Connected for OneWrite<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().connect_info()
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for OneWrite<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for OneWrite<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    /// No: so h2 copies messages of up to 1 KiB into its buffer instead of sending each as a slice
    /// of its own.
    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, duplex};

    use super::*;

    /// Whether `far` has bytes to read now, without waiting for them.
    async fn readable_now(far: &mut tokio::io::DuplexStream) -> bool {
        let mut byte = [0u8; 1];
        poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut byte);
            Poll::Ready(Pin::new(&mut *far).poll_read(cx, &mut buf).is_ready())
        })
        .await
    }

    #[tokio::test]
    async fn what_is_written_between_two_flushes_leaves_in_one_write() {
        let (near, mut far) = duplex(4096);
        let mut io = OneWrite::new(near);
        assert!(
            !io.is_write_vectored(),
            "h2 copies messages up to 1 KiB only then"
        );

        io.write_all(b"HEADERS").await.unwrap();
        io.write_all(b"DATA").await.unwrap();
        io.write_all(b"TRAILERS").await.unwrap();
        assert!(
            !readable_now(&mut far).await,
            "nothing leaves before the flush"
        );

        io.flush().await.unwrap();
        let mut got = [0u8; 64];
        let n = far.read(&mut got).await.unwrap();
        assert_eq!(
            &got[..n],
            b"HEADERSDATATRAILERS",
            "one write carried all three"
        );
    }

    #[tokio::test]
    async fn reads_pass_through() {
        let (near, mut far) = duplex(4096);
        let mut io = OneWrite::new(near);
        far.write_all(b"request").await.unwrap();
        let mut got = [0u8; 7];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"request");
    }
}
