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
//! so that a message of up to 1 KiB leaves with its headers and trailers in one `write`. The price
//! is one more copy of each reply's bytes (a few hundred, against a system call and a TCP segment
//! saved). Nothing waits in the buffer: h2 flushes at the end of every round of frames it writes.
//!
//! A longer message (a signed grant's reply, about 1.1 KB) h2 writes out and flushes before it
//! encodes the trailers, in the same round. On a plaintext connection [`OneWrite`] follows the
//! frames it is given, and that one flush, the first after a DATA frame that does not end its
//! stream, it puts off: the trailers join the message, and the round's closing flush sends both in
//! one `write` (several replies of one round, all in one). A flush is never put off twice with
//! nothing written between the two, and the connection's task is woken when one is, so a message
//! with no trailers behind it (a stream's) leaves at the next flush, at the latest one poll of the
//! connection later.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};
use tonic::transport::server::Connected;

/// The gathering buffer of one connection. A reply with a signed grant statement (about 1.1 KB
/// with its headers and trailers) fits, and on a plaintext connection leaves in one write.
pub const BUFFER: usize = 4096;

/// An accepted connection whose writes are gathered until h2 flushes.
#[derive(Debug)]
pub struct OneWrite<T> {
    io: BufWriter<T>,
    /// The HTTP/2 frames written so far, on a plaintext connection; `None` under TLS (the bytes
    /// here are records, not frames).
    frames: Option<Frames>,
    /// Whether the last flush asked for was put off, and nothing was written since.
    put_off: bool,
}

impl<T: AsyncWrite> OneWrite<T> {
    /// Wraps an accepted plaintext connection: h2's frames are what is written to it.
    pub fn new(io: T) -> Self {
        Self {
            io: BufWriter::with_capacity(BUFFER, io),
            frames: Some(Frames::default()),
            put_off: false,
        }
    }

    /// Wraps an accepted connection under TLS: writes are gathered, no flush is put off.
    pub fn under_tls(io: T) -> Self {
        Self {
            frames: None,
            ..Self::new(io)
        }
    }
}

/// Where the bytes written so far stand in HTTP/2's framing (a 9-byte header: length, type,
/// flags, stream; then the payload): enough to tell whether the last frame written is a DATA
/// frame whose stream goes on.
#[derive(Debug, Default)]
struct Frames {
    header: [u8; FRAME_HEADER],
    /// Bytes of the next frame's header seen so far.
    header_seen: usize,
    /// Bytes of the current frame's payload still to come.
    payload_left: usize,
    /// The type and flags of the last frame whose header was seen.
    last: Option<(u8, u8)>,
}

const FRAME_HEADER: usize = 9;
const DATA: u8 = 0x0;
const END_STREAM: u8 = 0x1;

impl Frames {
    fn written(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER - self.header_seen).min(bytes.len());
            self.header[self.header_seen..self.header_seen + n].copy_from_slice(&bytes[..n]);
            self.header_seen += n;
            bytes = &bytes[n..];
            if self.header_seen == FRAME_HEADER {
                let [a, b, c, kind, flags, ..] = self.header;
                self.payload_left = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
                self.last = Some((kind, flags));
                self.header_seen = 0;
            }
        }
    }

    /// Whether everything written ends with a whole DATA frame that does not end its stream: a
    /// gRPC reply's message, whose trailers come next.
    fn ends_with_a_message(&self) -> bool {
        self.header_seen == 0
            && self.payload_left == 0
            && matches!(self.last, Some((DATA, flags)) if flags & END_STREAM == 0)
    }
}

impl<T: Connected + AsyncWrite> Connected for OneWrite<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.get_ref().connect_info()
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for OneWrite<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for OneWrite<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        if let Some(frames) = &mut this.frames {
            frames.written(&buf[..n]);
        }
        this.put_off &= n == 0;
        Poll::Ready(Ok(n))
    }

    /// No: so h2 copies messages of up to 1 KiB into its buffer instead of sending each as a slice
    /// of its own.
    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let message_last = this
            .frames
            .as_ref()
            .is_some_and(Frames::ends_with_a_message);
        if message_last && !this.put_off && !this.io.buffer().is_empty() {
            // The trailers are on their way; should they not be, the next flush sends it, and the
            // task is polled again for one.
            this.put_off = true;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        this.put_off = false;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
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

    /// An HTTP/2 frame as h2 writes it.
    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len().to_be_bytes();
        let mut bytes = vec![len[5], len[6], len[7], kind, flags, 0, 0, 0, 1];
        bytes.extend_from_slice(payload);
        bytes
    }

    const HEADERS: u8 = 0x1;
    const END_HEADERS: u8 = 0x4;

    /// Everything `far` can read now.
    async fn read_now(far: &mut tokio::io::DuplexStream) -> Vec<u8> {
        let mut got = vec![0u8; 8192];
        let n = far.read(&mut got).await.unwrap();
        got.truncate(n);
        got
    }

    /// A waker that counts its wakes.
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: std::sync::Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// One `poll_flush` with a counting waker: whether it was ready, and the wakes it made.
    fn flush_once<T: AsyncWrite + Unpin>(io: &mut OneWrite<T>) -> (bool, usize) {
        let wakes = std::sync::Arc::new(Wakes(Default::default()));
        let waker = std::task::Waker::from(wakes.clone());
        let ready = Pin::new(io)
            .poll_flush(&mut Context::from_waker(&waker))
            .is_ready();
        (ready, wakes.0.load(std::sync::atomic::Ordering::SeqCst))
    }

    #[tokio::test]
    async fn what_is_written_between_two_flushes_leaves_in_one_write() {
        let (near, mut far) = duplex(8192);
        let mut io = OneWrite::new(near);
        assert!(
            !io.is_write_vectored(),
            "h2 copies messages up to 1 KiB only then"
        );

        let reply = [
            frame(HEADERS, END_HEADERS, b"head"),
            frame(DATA, 0, b"message"),
            frame(HEADERS, END_HEADERS | END_STREAM, b"trailers"),
        ];
        for part in &reply {
            io.write_all(part).await.unwrap();
        }
        assert!(
            !readable_now(&mut far).await,
            "nothing leaves before the flush"
        );

        io.flush().await.unwrap();
        assert_eq!(
            read_now(&mut far).await,
            reply.concat(),
            "all three, at once"
        );
    }

    /// h2 writes a message of over 1 KiB and flushes, then writes the trailers and flushes again:
    /// the first flush is put off, and the second sends the whole reply.
    #[tokio::test]
    async fn the_flush_between_a_long_message_and_its_trailers_is_put_off() {
        let (near, mut far) = duplex(8192);
        let mut io = OneWrite::new(near);
        let head = frame(HEADERS, END_HEADERS, b"head");
        let message = frame(DATA, 0, &[7u8; 1100]);
        io.write_all(&head).await.unwrap();
        // As h2 writes a message it did not copy: its frame header with the buffer, then the
        // payload, split anywhere.
        io.write_all(&message[..5]).await.unwrap();
        io.write_all(&message[5..600]).await.unwrap();
        io.write_all(&message[600..]).await.unwrap();

        assert_eq!(
            flush_once(&mut io),
            (true, 1),
            "put off, and the task woken"
        );
        assert!(
            !readable_now(&mut far).await,
            "the message waits for its trailers"
        );

        let trailers = frame(HEADERS, END_HEADERS | END_STREAM, b"trailers");
        io.write_all(&trailers).await.unwrap();
        assert_eq!(flush_once(&mut io), (true, 0));
        assert_eq!(
            read_now(&mut far).await,
            [head, message, trailers].concat(),
            "one write"
        );
    }

    /// Two long replies in one round of h2's: each message's flush is put off, the round's
    /// closing flush sends both replies.
    #[tokio::test]
    async fn long_replies_of_one_round_leave_together() {
        let (near, mut far) = duplex(8192);
        let mut io = OneWrite::new(near);
        let mut sent = Vec::new();
        for _ in 0..2 {
            let message = [
                frame(HEADERS, END_HEADERS, b"head"),
                frame(DATA, 0, &[7u8; 1100]),
            ];
            io.write_all(&message.concat()).await.unwrap();
            assert_eq!(flush_once(&mut io), (true, 1));
            let trailers = frame(HEADERS, END_HEADERS | END_STREAM, b"trailers");
            io.write_all(&trailers).await.unwrap();
            sent.extend(message.concat());
            sent.extend(trailers);
        }
        assert!(!readable_now(&mut far).await);
        assert_eq!(flush_once(&mut io), (true, 0));
        assert_eq!(read_now(&mut far).await, sent);
    }

    /// A stream's message has no trailers behind it: it leaves at the next flush, and a flush is
    /// never put off twice with nothing written between.
    #[tokio::test]
    async fn a_message_with_nothing_behind_it_leaves_at_the_next_flush() {
        let (near, mut far) = duplex(8192);
        let mut io = OneWrite::new(near);
        let message = frame(DATA, 0, b"one of a stream");
        io.write_all(&message).await.unwrap();
        assert_eq!(flush_once(&mut io), (true, 1));
        assert!(!readable_now(&mut far).await);
        assert_eq!(flush_once(&mut io), (true, 0));
        assert_eq!(read_now(&mut far).await, message);

        // The stream's last message ends it: nothing comes after, nothing is put off.
        let last = frame(DATA, END_STREAM, b"the last");
        io.write_all(&last).await.unwrap();
        assert_eq!(flush_once(&mut io), (true, 0));
        assert_eq!(read_now(&mut far).await, last);
    }

    /// Under TLS the bytes are records, not frames: every flush flushes.
    #[tokio::test]
    async fn under_tls_no_flush_is_put_off() {
        let (near, mut far) = duplex(8192);
        let mut io = OneWrite::under_tls(near);
        let message = frame(DATA, 0, b"message");
        io.write_all(&message).await.unwrap();
        assert_eq!(flush_once(&mut io), (true, 0));
        assert_eq!(read_now(&mut far).await, message);
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
