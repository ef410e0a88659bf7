//! Connections left half open or idle: dropped or shed while `/healthz` keeps
//! answering.

use super::healthz_keeps_answering;
use crate::helpers::{AppOptions, Backend, spawn_app_with};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

on_both_backends!(
    half_open_sockets_are_dropped_and_healthz_keeps_answering,
    idle_connections_are_shed_when_too_many_are_open,
    one_address_holds_a_bounded_number_of_connections,
);

async fn half_open_sockets_are_dropped_and_healthz_keeps_answering(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    // Many clients that each send half a request line and then nothing.
    let mut sockets = Vec::new();
    for _ in 0..200 {
        let mut socket = TcpStream::connect(app.address).await.unwrap();
        socket.write_all(b"POST /gra").await.unwrap();
        sockets.push(socket);
    }
    let started = Instant::now();
    let dropped = async {
        for socket in &mut sockets {
            let mut buffer = [0_u8; 1024];
            // The server closes without answering (or answers 408 and closes); either
            // way the socket reaches its end.
            loop {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
    };
    healthz_keeps_answering(&app, Duration::from_secs(5), async {
        tokio::time::timeout(Duration::from_secs(15), dropped)
            .await
            .expect("every half-open socket is dropped within 15 s");
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(15));
}

async fn idle_connections_are_shed_when_too_many_are_open(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    // More idle sockets than the server keeps while it sheds load (512): past that,
    // idle ones are closed after a second of silence, long before the 10 s header
    // timeout would close them. They come from four addresses, each within its cap
    // of connections.
    let sockets: Vec<TcpStream> =
        futures_util::future::join_all((0..600).map(|index| async move {
            let source = Ipv4Addr::new(127, 0, 0, 2 + (index % 4) as u8);
            let socket = TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::new(IpAddr::V4(source), 0)).unwrap();
            let mut socket = socket.connect(app.address).await.unwrap();
            socket.write_all(b"GET /heal").await.unwrap();
            socket
        }))
        .await;
    // The point is that the server keeps answering at all (no descriptor or accept
    // starvation), not how fast on a machine the rest of the suite shares: the bound
    // is generous.
    healthz_keeps_answering(
        &app,
        Duration::from_secs(5),
        tokio::time::sleep(Duration::from_secs(4)),
    )
    .await;
    let closed = sockets
        .iter()
        .filter(|socket| {
            let mut buffer = [0_u8; 1024];
            !matches!(socket.try_read(&mut buffer), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    assert!(
        closed >= 600 - 512,
        "only {closed} of 600 idle sockets were closed within 4 s"
    );
}

/// One address holds at most 256 plain HTTP connections: past them a connection is
/// closed as soon as it is accepted, while other addresses are served.
async fn one_address_holds_a_bounded_number_of_connections(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let cap = jobledger::http::MAX_CONNECTIONS_PER_ADDRESS;
    let mut held = Vec::new();
    for _ in 0..cap {
        let mut socket = TcpStream::connect(app.address).await.unwrap();
        socket.write_all(b"GET /heal").await.unwrap();
        held.push(socket);
    }
    let mut extra = TcpStream::connect(app.address).await.unwrap();
    let _ = extra
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut buffer = [0_u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buffer))
        .await
        .expect("the connection past the cap is closed at once");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "the connection past the cap was served"
    );
    // Another address is not affected.
    let client = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 7)))
        .build()
        .unwrap();
    let response = client
        .get(format!("http://{}/healthz", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    drop(held);
}
