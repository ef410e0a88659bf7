//! Serving the router over HTTP/1.1 with the timeouts `axum::serve` lacks: a client
//! that never finishes its request head, keeps a connection open without using it,
//! or stops reading its response is dropped, so half-open sockets cannot pile up
//! until the process runs out of file descriptors. One address holds at most
//! [`MAX_CONNECTIONS_PER_ADDRESS`] connections; a live stream (SSE) of an
//! authenticated caller is never shed as idle (see [`LiveStreams`]).

use super::client_limits::{AddressCounts, ClientAddress, MAX_CONNECTIONS_PER_ADDRESS};
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1::UpgradeableConnection;
use hyper::service::HttpService;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// How long a client may take to send a whole request head, counted from the moment
/// the server waits for one: a socket that sends half a request line is closed after
/// it, and so is a keep-alive connection that stays unused for as long (hyper starts
/// the same timer while it waits for the next request).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may go without a byte moving either way while no request is
/// being handled on it: a client that stops reading its response is dropped after it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Past this many open connections the server sheds idle ones quickly, so that new
/// clients are served before the process runs out of file descriptors.
const SHEDDING_THRESHOLD: usize = 512;

/// The idle time after which a connection is dropped while the server sheds load.
const IDLE_TIMEOUT_WHEN_SHEDDING: Duration = Duration::from_secs(1);

/// How long the accept loop pauses after a lasting failure (such as running out of
/// descriptors, while shedding frees some).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `shutdown` is cancelled; then stops accepting,
/// lets every open request finish (idle connections close at once) and returns when
/// all connections are closed. Handlers see the peer as `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let load = Arc::new(ServerLoad::default());
    let per_address = AddressCounts::new(MAX_CONNECTIONS_PER_ADDRESS);
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            // A connection reset before it was accepted concerns that client only.
            Err(error) if is_connection_error(&error) => continue,
            // Anything else (out of descriptors, of memory) lasts a while: pause rather
            // than spin, and shed idle connections when descriptors ran out.
            Err(error) => {
                if out_of_descriptors(&error) {
                    load.descriptors_exhausted_at
                        .store(load.now_millis(), Ordering::Relaxed);
                }
                tracing::warn!(error = %error, "accepting a connection failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Closed at once: the client holds its share of the descriptors already.
        let Some(place) = per_address.admit(ClientAddress::from(peer.ip())) else {
            tracing::debug!(peer = %peer, "refused a connection past the address's cap");
            continue;
        };
        let connection = Connection {
            activity: Arc::new(Activity::default()),
            load: load.clone(),
        };
        let live_streams = LiveStreams(connection.activity.clone());
        let service = router
            .clone()
            .map_request(move |mut request: hyper::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request.extensions_mut().insert(live_streams.clone());
                request.map(Body::new)
            })
            .map_future({
                let activity = connection.activity.clone();
                move |response| {
                    let handling = HandlingGuard::start(activity.clone());
                    async move {
                        let response = response.await;
                        drop(handling);
                        response
                    }
                }
            });
        let http = http.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let io = TokioIo::new(TrackedIo {
                inner: stream,
                activity: connection.activity.clone(),
                load: connection.load.clone(),
            });
            let served = http
                .serve_connection(io, TowerToHyperService::new(service))
                .with_upgrades();
            connection.run(served, peer, shutdown).await;
            drop(place);
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Whether accepting failed because of that one connection.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Whether accepting failed because the process or system has no descriptor left.
fn out_of_descriptors(error: &io::Error) -> bool {
    // EMFILE and ENFILE on Linux and the BSDs.
    matches!(error.raw_os_error(), Some(23 | 24))
}

/// What every connection shares: how many are open and when the descriptors last ran
/// out, which together decide whether idle connections are shed.
struct ServerLoad {
    started: Instant,
    open: AtomicUsize,
    /// Milliseconds since `started`; 0 when it never happened.
    descriptors_exhausted_at: AtomicU64,
}

impl Default for ServerLoad {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            open: AtomicUsize::new(0),
            descriptors_exhausted_at: AtomicU64::new(0),
        }
    }
}

impl ServerLoad {
    fn now_millis(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The idle time allowed now: short while there are too many connections or the
    /// descriptors ran out in the last few seconds.
    fn idle_timeout(&self) -> Duration {
        let exhausted_at = self.descriptors_exhausted_at.load(Ordering::Relaxed);
        let recently_exhausted =
            exhausted_at != 0 && self.now_millis().saturating_sub(exhausted_at) < 5_000;
        if recently_exhausted || self.open.load(Ordering::Relaxed) > SHEDDING_THRESHOLD {
            IDLE_TIMEOUT_WHEN_SHEDDING
        } else {
            IDLE_TIMEOUT
        }
    }
}

/// One connection's signs of life.
#[derive(Default)]
struct Activity {
    /// `ServerLoad::now_millis` when a byte last moved.
    last_io_millis: AtomicU64,
    /// Requests whose handler has not answered yet.
    handling: AtomicUsize,
    /// Responses that are live streams, which send only an occasional keepalive.
    live_streams: AtomicUsize,
}

/// Put in each request's extensions: lets a handler mark its response as a live
/// stream, so that the connection is not shed as idle between its events (their
/// keepalives come every 15 s, the shed timeout is 1 s), while the server is not
/// shutting down.
#[derive(Clone)]
pub struct LiveStreams(Arc<Activity>);

impl LiveStreams {
    /// Counts a live stream on this connection until the returned guard is dropped.
    pub fn hold(&self) -> LiveStream {
        self.0.live_streams.fetch_add(1, Ordering::Relaxed);
        LiveStream(self.0.clone())
    }
}

/// A live stream in progress; dropped with the response body.
pub struct LiveStream(Arc<Activity>);

impl Drop for LiveStream {
    fn drop(&mut self) {
        self.0.live_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a request as being handled until its response head is ready.
struct HandlingGuard(Arc<Activity>);

impl HandlingGuard {
    fn start(activity: Arc<Activity>) -> Self {
        activity.handling.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

impl Drop for HandlingGuard {
    fn drop(&mut self) {
        self.0.handling.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Connection {
    activity: Arc<Activity>,
    load: Arc<ServerLoad>,
}

impl Connection {
    /// Drives `served` to its end, asks it to finish after its current request when
    /// `shutdown` comes, and drops it (closing the socket) once it has been idle too
    /// long.
    async fn run<S>(
        self,
        served: UpgradeableConnection<TokioIo<TrackedIo>, S>,
        peer: SocketAddr,
        shutdown: CancellationToken,
    ) where
        S: HttpService<Incoming>,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        S::ResBody: hyper::body::Body + 'static,
        <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.load.open.fetch_add(1, Ordering::Relaxed);
        self.activity
            .last_io_millis
            .store(self.load.now_millis(), Ordering::Relaxed);
        let mut served = std::pin::pin!(served);
        let mut draining = false;
        loop {
            let check_in = self.until_idle_check();
            tokio::select! {
                result = served.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(peer = %peer, error = %error, "connection ended with an error");
                    }
                    break;
                }
                () = shutdown.cancelled(), if !draining => {
                    draining = true;
                    served.as_mut().graceful_shutdown();
                }
                () = tokio::time::sleep(check_in) => {
                    if self.is_idle(draining) {
                        tracing::debug!(peer = %peer, "closing an idle connection");
                        break;
                    }
                }
            }
        }
        self.load.open.fetch_sub(1, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = self.activity.last_io_millis.load(Ordering::Relaxed);
        Duration::from_millis(self.load.now_millis().saturating_sub(last))
    }

    /// Whether the connection may be closed: nothing is being handled, no live stream
    /// is open (unless the server is draining) and nothing moved for too long.
    fn is_idle(&self, draining: bool) -> bool {
        self.activity.handling.load(Ordering::Relaxed) == 0
            && (draining || self.activity.live_streams.load(Ordering::Relaxed) == 0)
            && self.idle_for() >= self.load.idle_timeout()
    }

    /// When to look again: when the connection would become idle, but at least every
    /// second, since shedding can shorten the allowed idle time at any moment.
    fn until_idle_check(&self) -> Duration {
        self.load
            .idle_timeout()
            .saturating_sub(self.idle_for())
            .clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// The socket, noting every time a byte moves.
struct TrackedIo {
    inner: TcpStream,
    activity: Arc<Activity>,
    load: Arc<ServerLoad>,
}

impl TrackedIo {
    fn moved(&self) {
        self.activity
            .last_io_millis
            .store(self.load.now_millis(), Ordering::Relaxed);
    }
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.moved();
        }
        polled
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            self.moved();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, data);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            self.moved();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
