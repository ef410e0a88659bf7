//! Connection plumbing that lets a handler cut its own TCP connection.
//!
//! hyper owns the socket and offers a handler no way to close it without
//! answering. So [`SimListener`] wraps every accepted stream in a
//! [`SimStream`] whose reads and writes can be switched off from the handler
//! through a [`ConnHandle`] (handed over as axum `ConnectInfo`). Once
//! severed, every I/O call fails: hyper cannot put a single response byte on
//! the wire, gives up on the connection and drops the socket, and the peer
//! sees the connection close mid-request.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Accepts TCP connections and makes each one severable.
pub(super) struct SimListener {
    tcp: TcpListener,
    stopping: watch::Receiver<bool>,
}

impl SimListener {
    /// `stopping` turns `true` (or its sender goes away) when the server
    /// shuts down.
    pub(super) fn new(tcp: TcpListener, stopping: watch::Receiver<bool>) -> Self {
        Self { tcp, stopping }
    }
}

impl Listener for SimListener {
    type Io = SimStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (SimStream, SocketAddr) {
        loop {
            match self.tcp.accept().await {
                Ok((tcp, addr)) => {
                    let stream = SimStream {
                        tcp,
                        switch: Arc::default(),
                        stopping: self.stopping.clone(),
                    };
                    return (stream, addr);
                }
                // A peer that vanished between SYN and accept is routine.
                Err(err) if is_peer_error(&err) => {}
                Err(err) => {
                    // Usually descriptor exhaustion: retrying at once would spin.
                    tracing::warn!(%err, "mock provider: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

fn is_peer_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[derive(Default)]
struct KillSwitch {
    severed: AtomicBool,
    // Whoever is parked on the socket must be woken to notice the cut.
    reader: AtomicWaker,
    writer: AtomicWaker,
}

impl KillSwitch {
    /// Whether I/O must fail; otherwise parks `cx` on `waker` so that
    /// [`ConnHandle::sever`] can wake it.
    fn check(&self, waker: &AtomicWaker, cx: &Context<'_>) -> io::Result<()> {
        if !self.severed.load(Ordering::Acquire) {
            waker.register(cx.waker());
            // Re-check: a sever between the load and the register would
            // otherwise wake a stale waker and be missed.
            if !self.severed.load(Ordering::Acquire) {
                return Ok(());
            }
        }
        Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "connection severed by mock:drop",
        ))
    }
}

/// A TCP stream whose I/O can be switched off from a request handler.
pub(super) struct SimStream {
    tcp: TcpStream,
    switch: Arc<KillSwitch>,
    stopping: watch::Receiver<bool>,
}

impl AsyncRead for SimStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.switch.check(&this.switch.reader, cx)?;
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.switch.check(&this.switch.writer, cx)?;
        Pin::new(&mut this.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.switch.check(&this.switch.writer, cx)?;
        Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // hyper flushes on every turn of its loop, so failing here is what
        // makes it notice the cut promptly even when it is not reading.
        let this = self.get_mut();
        this.switch.check(&this.switch.writer, cx)?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// A request's grip on its own connection.
#[derive(Clone)]
pub(super) struct ConnHandle {
    switch: Arc<KillSwitch>,
    stopping: watch::Receiver<bool>,
}

impl ConnHandle {
    /// Makes all further I/O on the connection fail, so hyper closes it
    /// without writing anything more.
    pub(super) fn sever(&self) {
        self.switch.severed.store(true, Ordering::Release);
        self.switch.reader.wake();
        self.switch.writer.wake();
    }

    /// Resolves once the server is shutting down.
    pub(super) async fn server_stopping(&self) {
        // An error means the sender is gone, i.e. the server is gone too.
        let _ = self.stopping.clone().wait_for(|stopping| *stopping).await;
    }
}

impl Connected<IncomingStream<'_, SimListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, SimListener>) -> Self {
        let io = stream.io();
        Self {
            switch: Arc::clone(&io.switch),
            stopping: io.stopping.clone(),
        }
    }
}
