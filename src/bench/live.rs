//! Scenarios against a live `jobledger serve`, started as a child process so that its
//! memory is measured alone:
//! - pickup (job created → attempt started, on an idle queue) and subscription
//!   delivery (event stamped → received by a WebSocket client), p50 and p99;
//! - 1,000 attempts in flight, each call taking 2 s at the simulator: jobs/s and the
//!   server's peak RSS;
//! - 10,000 idle subscriptions: the server's peak RSS, and that one event still
//!   reaches its subscribers.

use super::scratch::{Engine, ScratchDatabase};
use super::{BenchError, Figure, Scale, audited, percentile, seed, succeeded_attempts};
use chrono::{DateTime, Utc};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The admin token of the child servers.
const ADMIN_TOKEN: &str = "benchmark-admin-token-with-32-characters";
/// How long a child server may take to answer `/healthz`.
const STARTUP: Duration = Duration::from_secs(30);
/// How long a scenario may wait for one message.
const MESSAGE_WAIT: Duration = Duration::from_secs(30);
/// Subscriptions per WebSocket connection in the idle scenario: the server's cap.
const SUBSCRIPTIONS_PER_CONNECTION: usize = crate::graphql::MAX_SUBSCRIPTIONS_PER_CONNECTION;
/// Subscriptions per tenant in the idle scenario: the server's cap.
const SUBSCRIPTIONS_PER_TENANT: usize = crate::bus::MAX_SUBSCRIPTIONS_PER_TENANT;

/// How much each live scenario does.
#[derive(Clone, Copy, Debug)]
pub struct LiveScale {
    /// Jobs created one after another for the latency figures.
    pub sequential: u64,
    /// Concurrent attempts, and jobs run at that concurrency.
    pub in_flight: usize,
    pub in_flight_jobs: u64,
    /// Idle subscriptions held open.
    pub idle_subscriptions: usize,
}

impl LiveScale {
    /// The live part of `scale`.
    pub fn of(scale: Scale) -> Self {
        if scale.drain >= Scale::FULL.drain {
            Self {
                sequential: 300,
                in_flight: 1_000,
                in_flight_jobs: 6_000,
                idle_subscriptions: 10_000,
            }
        } else {
            Self {
                sequential: 20,
                in_flight: 50,
                in_flight_jobs: 100,
                idle_subscriptions: 300,
            }
        }
    }
}

/// Runs the live scenarios on `engine`.
pub async fn run(engine: &Engine, scale: Scale) -> Result<Vec<Figure>, BenchError> {
    let scale = LiveScale::of(scale);
    let mut figures = latencies(engine, scale).await?;
    figures.extend(in_flight(engine, scale).await?);
    figures.extend(idle_subscriptions(engine, scale).await?);
    Ok(figures)
}

/// A `jobledger serve` child process on a database of the benchmark's.
struct Server {
    child: tokio::process::Child,
    address: SocketAddr,
}

impl Server {
    async fn start(database: &ScratchDatabase, workers: usize) -> Result<Self, BenchError> {
        // The port is free when asked; nothing else on this machine races for it.
        let address = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(failed)?;
        let child = tokio::process::Command::new(std::env::current_exe().map_err(failed)?)
            .args(["serve", "--listen", &address.to_string()])
            .args(["--database-url", &database.url])
            .args(["--workers", &workers.to_string()])
            // A clean environment: no provider keys, so the built-in simulator answers.
            .env_clear()
            .env("JOBLEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(failed)?;
        let server = Self { child, address };
        let started = Instant::now();
        let client = reqwest::Client::new();
        loop {
            let health = client.get(format!("http://{address}/healthz")).send().await;
            if health.is_ok_and(|response| response.status().is_success()) {
                return Ok(server);
            }
            if started.elapsed() > STARTUP {
                return Err(BenchError::Failed("the server did not start".into()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The most memory the server held at once, from the kernel (`VmHWM`).
    fn peak_rss_mb(&self) -> Result<f64, BenchError> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| BenchError::Failed("the server has exited".into()))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(failed)?;
        let kilobytes = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| {
                value
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .ok_or_else(|| BenchError::Failed("no VmHWM in /proc".into()))?;
        Ok(kilobytes / 1_024.0)
    }

    /// Stops the server. Every scenario waits for its jobs first, so nothing is in
    /// flight and the audit that follows sees settled books.
    async fn stop(mut self) -> Result<(), BenchError> {
        self.child.kill().await.map_err(failed)
    }
}

fn failed(error: impl std::fmt::Display) -> BenchError {
    BenchError::Failed(error.to_string())
}

/// A `graphql-transport-ws` connection with its key accepted.
struct Socket(WebSocketStream<MaybeTlsStream<TcpStream>>);

impl Socket {
    async fn open(address: SocketAddr, key: &str) -> Result<Self, BenchError> {
        let mut request = format!("ws://{address}/graphql/ws")
            .into_client_request()
            .map_err(failed)?;
        request.headers_mut().insert(
            "sec-websocket-protocol",
            "graphql-transport-ws".parse().expect("a header value"),
        );
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .map_err(failed)?;
        let mut socket = Self(socket);
        socket
            .send(json!({"type": "connection_init", "payload": {"authorization": format!("Bearer {key}")}}))
            .await?;
        match socket.next().await? {
            message if message["type"] == "connection_ack" => Ok(socket),
            other => Err(BenchError::Failed(format!("connection refused: {other}"))),
        }
    }

    async fn send(&mut self, message: Value) -> Result<(), BenchError> {
        self.0
            .send(Message::Text(message.to_string().into()))
            .await
            .map_err(failed)
    }

    async fn subscribe_account(&mut self, id: usize) -> Result<(), BenchError> {
        self.send(
            json!({"id": id.to_string(), "type": "subscribe", "payload": {
                "query": "subscription { accountJobUpdates { seq jobId kind status at } }"
            }}),
        )
        .await
    }

    /// The next protocol message.
    async fn next(&mut self) -> Result<Value, BenchError> {
        let wait = async {
            while let Some(frame) = self.0.next().await {
                if let Message::Text(text) = frame.map_err(failed)? {
                    return serde_json::from_str(&text).map_err(failed);
                }
            }
            Err(BenchError::Failed(
                "the server closed the connection".into(),
            ))
        };
        tokio::time::timeout(MESSAGE_WAIT, wait)
            .await
            .map_err(|_| BenchError::Failed("no message in time".into()))?
    }
}

async fn create_job(
    client: &reqwest::Client,
    address: SocketAddr,
    key: &str,
    index: u64,
) -> Result<String, BenchError> {
    let body = json!({
        "query": "mutation($input: CreateJobInput!) { createJob(input: $input) { job { id } } }",
        "variables": {"input": {
            "idempotencyKey": format!("live-{index}"),
            "model": seed::MODEL,
            "messages": [{"role": "user", "content": "Summarise: the quarter went well."}],
            "maxOutputTokens": 64,
        }},
    });
    let response: Value = client
        .post(format!("http://{address}/graphql"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .map_err(failed)?
        .json()
        .await
        .map_err(failed)?;
    response["data"]["createJob"]["job"]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| BenchError::Failed(format!("createJob failed: {response}")))
}

fn stamped_at(event: &Value) -> Result<DateTime<Utc>, BenchError> {
    event["at"]
        .as_str()
        .and_then(|at| at.parse().ok())
        .ok_or_else(|| BenchError::Failed(format!("an event without a time: {event}")))
}

/// Jobs created one at a time on an idle server: how soon each is picked up, and how
/// soon each of its events reaches a subscriber.
async fn latencies(engine: &Engine, scale: LiveScale) -> Result<Vec<Figure>, BenchError> {
    let database = ScratchDatabase::create(engine).await?;
    let (_, key) = seed::funded_tenant(&database.db, "live", scale.sequential).await?;
    let server = Server::start(&database, 32).await?;
    let mut socket = Socket::open(server.address, &key).await?;
    socket.subscribe_account(1).await?;
    // The subscription is registered once the server has read it; a moment is plenty.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = reqwest::Client::new();
    let (mut pickups, mut deliveries) = (Vec::new(), Vec::new());
    for index in 0..scale.sequential {
        let id = create_job(&client, server.address, &key, index).await?;
        let mut created_at = None;
        loop {
            let message = socket.next().await?;
            let received = Utc::now();
            let event = &message["payload"]["data"]["accountJobUpdates"];
            if event["jobId"] != id.as_str() {
                continue;
            }
            let at = stamped_at(event)?;
            deliveries.push((received - at).as_seconds_f64() * 1_000.0);
            match event["kind"].as_str() {
                Some("CREATED") => created_at = Some(at),
                Some("ATTEMPT_STARTED") => {
                    let created_at = created_at
                        .ok_or_else(|| BenchError::Failed("started before created".into()))?;
                    pickups.push((at - created_at).as_seconds_f64() * 1_000.0);
                }
                Some("SUCCEEDED") => break,
                other => return Err(BenchError::Failed(format!("unexpected event {other:?}"))),
            }
        }
    }
    server.stop().await?;
    audited(database).await?;
    pickups.sort_by(f64::total_cmp);
    deliveries.sort_by(f64::total_cmp);
    let name = engine.name();
    let mut figures = Vec::new();
    for (label, samples) in [
        ("pickup (created → attempt started)", &pickups),
        ("subscription delivery (event → client)", &deliveries),
    ] {
        for (quantile, fraction) in [("p50", 0.5), ("p99", 0.99)] {
            figures.push(Figure {
                engine: name,
                name: format!("{label}, {quantile}"),
                value: percentile(samples, fraction),
                unit: "ms",
                ratio: None,
            });
        }
    }
    Ok(figures)
}

/// Jobs whose calls take 2 s each, run `in_flight` at a time by one server.
async fn in_flight(engine: &Engine, scale: LiveScale) -> Result<Vec<Figure>, BenchError> {
    const CALL: Duration = Duration::from_secs(2);
    let database = ScratchDatabase::create(engine).await?;
    let (tenant, _) = seed::funded_tenant(&database.db, "slow", scale.in_flight_jobs).await?;
    let providers = super::seeding_providers();
    seed::queued_jobs(
        &database.db,
        &providers,
        tenant,
        scale.in_flight_jobs - 1,
        seed::job_saying(
            0,
            &format!("Summarise. [mock:delay_ms={}]", CALL.as_millis()),
        ),
    )
    .await?;
    let server = Server::start(&database, scale.in_flight).await?;
    let started = Instant::now();
    while succeeded_attempts(&database.db).await? < scale.in_flight_jobs {
        if started.elapsed() > MESSAGE_WAIT * 20 {
            return Err(BenchError::Failed(
                "the jobs in flight did not finish".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rate = scale.in_flight_jobs as f64 / started.elapsed().as_secs_f64();
    let peak = server.peak_rss_mb()?;
    server.stop().await?;
    audited(database).await?;
    let name = engine.name();
    let ceiling = scale.in_flight as f64 / CALL.as_secs_f64();
    Ok(vec![
        Figure {
            engine: name,
            name: format!("{} in flight, 2 s calls", scale.in_flight),
            value: rate,
            unit: "jobs/s",
            ratio: Some((
                rate / ceiling,
                format!("{ceiling:.0} jobs/s, all slots busy"),
            )),
        },
        Figure {
            engine: name,
            name: format!("{} in flight, server peak RSS", scale.in_flight),
            value: peak,
            unit: "MB",
            ratio: None,
        },
    ])
}

/// Many idle subscriptions held by one API server: its peak memory, and that an event
/// of one tenant still reaches every one of that tenant's subscriptions.
async fn idle_subscriptions(engine: &Engine, scale: LiveScale) -> Result<Vec<Figure>, BenchError> {
    let database = ScratchDatabase::create(engine).await?;
    let tenants = scale.idle_subscriptions.div_ceil(SUBSCRIPTIONS_PER_TENANT);
    let mut keys = Vec::new();
    for index in 0..tenants {
        keys.push(
            seed::funded_tenant(&database.db, &format!("idle-{index}"), 10)
                .await?
                .1,
        );
    }
    let server = Server::start(&database, 0).await?;
    let baseline = server.peak_rss_mb()?;
    let mut sockets = Vec::new();
    let mut opened = 0;
    while opened < scale.idle_subscriptions {
        let key = &keys[opened / SUBSCRIPTIONS_PER_TENANT];
        let mut socket = Socket::open(server.address, key).await?;
        let here = SUBSCRIPTIONS_PER_CONNECTION.min(scale.idle_subscriptions - opened);
        for id in 0..here {
            socket.subscribe_account(id).await?;
        }
        opened += here;
        sockets.push(socket);
    }
    // Every subscription is live once the first tenant's job reaches all of its own.
    let first_tenant = SUBSCRIPTIONS_PER_TENANT.min(scale.idle_subscriptions);
    let connections = first_tenant.div_ceil(SUBSCRIPTIONS_PER_CONNECTION);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sent = Instant::now();
    let id = create_job(&reqwest::Client::new(), server.address, &keys[0], 0).await?;
    let mut reached = 0;
    for socket in sockets.iter_mut().take(connections) {
        let mut subscriptions = std::collections::HashSet::new();
        while subscriptions.len() < SUBSCRIPTIONS_PER_CONNECTION.min(first_tenant - reached) {
            let message = socket.next().await?;
            if message["payload"]["data"]["accountJobUpdates"]["jobId"] == id.as_str() {
                subscriptions.insert(message["id"].as_str().unwrap_or_default().to_owned());
            }
        }
        reached += subscriptions.len();
    }
    let fan_out = sent.elapsed().as_secs_f64() * 1_000.0;
    let peak = server.peak_rss_mb()?;
    drop(sockets);
    server.stop().await?;
    audited(database).await?;
    let name = engine.name();
    Ok(vec![
        Figure {
            engine: name,
            name: format!(
                "{} idle subscriptions, server peak RSS",
                scale.idle_subscriptions
            ),
            value: peak,
            unit: "MB",
            ratio: Some((peak / baseline, "the idle server".into())),
        },
        Figure {
            engine: name,
            name: format!("one event to {reached} subscriptions"),
            value: fan_out,
            unit: "ms",
            ratio: None,
        },
    ])
}
