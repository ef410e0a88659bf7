//! Connections left half open or idle: dropped or shed while `/healthz` keeps
//! answering.

use super::healthz_keeps_answering;
use crate::helpers::{AppOptions, Backend, spawn_app_with};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

on_both_backends!(
    half_open_sockets_are_dropped_and_healthz_keeps_answering,
    idle_connections_are_shed_when_too_many_are_open,
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
    // timeout would close them.
    let sockets: Vec<TcpStream> = futures_util::future::join_all((0..600).map(|_| async {
        let mut socket = TcpStream::connect(app.address).await.unwrap();
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
