//! Separate processes of the real binary for the crash tests: the simulator, the API
//! and workers, each logging to its own file (printed if the test fails), killed or
//! stopped on demand; and the contract's operations over HTTP.

use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// A port that was free a moment ago.
pub fn free_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// Polls `url` until it answers 200 (bounded), failing early if a process exited.
pub async fn wait_for_http(http: &reqwest::Client, url: &str, processes: &mut Processes) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(response) = http.get(url).send().await
            && response.status().is_success()
        {
            return;
        }
        processes.assert_alive();
        assert!(Instant::now() < deadline, "{url} never answered 200");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The contract's operations over HTTP.
pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
}

impl Client {
    /// A tenant made by `admin` and granted `amount` credits; its API key.
    pub async fn funded_tenant(&self, admin: &str, name: &str, amount: &str) -> String {
        let created = self
            .send(admin, "CreateTenant", json!({"name": name}))
            .await;
        let tenant_id = created["createTenant"]["tenant"]["id"].as_str().unwrap();
        self.send(
            admin,
            "GrantCredits",
            json!({"input": {"tenantId": tenant_id, "amount": amount, "idempotencyKey": format!("{name}-topup")}}),
        )
        .await;
        created["createTenant"]["apiKey"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Sends one contract operation and returns its `data`, failing on any error.
    pub async fn send(&self, key: &str, name: &str, variables: Value) -> Value {
        let response: Value = self
            .http
            .post(&self.url)
            .bearer_auth(key)
            .json(&json!({"query": crate::contract::operation(name), "variables": variables}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(response["errors"].is_null(), "{name} failed: {response}");
        response["data"].clone()
    }

    /// Every job's status, through `Jobs` (all of them fit one page).
    pub async fn job_statuses(&self, key: &str) -> HashMap<String, String> {
        let data = self.send(key, "Jobs", json!({"first": 100})).await;
        data["jobs"]["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|edge| {
                (
                    edge["node"]["id"].as_str().unwrap().to_owned(),
                    edge["node"]["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    pub async fn running_jobs(&self, key: &str) -> usize {
        let data = self
            .send(key, "Jobs", json!({"first": 100, "status": "RUNNING"}))
            .await;
        data["jobs"]["edges"].as_array().unwrap().len()
    }
}

/// The child processes of the test, each logging to its own file. All are killed
/// when this is dropped; if the test is failing, their logs are printed first.
pub struct Processes {
    directory: tempfile::TempDir,
    children: Vec<(String, PathBuf, Child)>,
}

impl Processes {
    pub fn new() -> Self {
        Self {
            directory: tempfile::tempdir().unwrap(),
            children: Vec::new(),
        }
    }

    /// Starts `jobledger mock-llm` on a free port and waits until it answers; returns
    /// its address.
    pub async fn start_simulator(&mut self, http: &reqwest::Client) -> SocketAddr {
        self.start_simulator_with(http, &[]).await
    }

    /// [`Self::start_simulator`] with more arguments of `mock-llm`.
    pub async fn start_simulator_with(
        &mut self,
        http: &reqwest::Client,
        more: &[&str],
    ) -> SocketAddr {
        let mock = free_address();
        let listen = mock.to_string();
        let mut args = vec!["mock-llm", "--listen", &listen];
        args.extend_from_slice(more);
        self.spawn("mock-llm", &args, &[]);
        wait_for_http(http, &format!("http://{mock}/_mock/calls"), self).await;
        mock
    }

    /// Starts the API alone (`serve --workers 0`) on `database_url` with `env`, and
    /// waits until it is ready; returns its address.
    pub async fn start_api(
        &mut self,
        http: &reqwest::Client,
        database_url: &str,
        env: &[(&str, &str)],
    ) -> SocketAddr {
        let api = free_address();
        let listen = api.to_string();
        let args = [
            "serve",
            "--workers",
            "0",
            "--listen",
            &listen,
            "--database-url",
            database_url,
        ];
        self.spawn("api", &args, env);
        wait_for_http(http, &format!("http://{api}/readyz"), self).await;
        api
    }

    /// Starts `jobledger args…` with `env`; returns its index.
    pub fn spawn(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) -> usize {
        let index = self.children.len();
        let log = self.directory.path().join(format!("{index}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_jobledger"))
            .args(args)
            // Nothing of the test's own environment reaches a provider, unless `env`
            // says so.
            .env_remove("DATABASE_URL")
            .env_remove("ANTHROPIC_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .envs(env.iter().copied())
            .env("RUST_LOG", "info,sqlx=warn,sea_orm=warn")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {name}: {error}"));
        self.children.push((name.to_owned(), log, child));
        index
    }

    pub fn pid(&self, index: usize) -> u32 {
        self.children[index].2.id().expect("the process is running")
    }

    fn log(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Waits until the process's log contains `text` (bounded).
    pub async fn wait_for_log(&mut self, index: usize, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !Self::log(&self.children[index].1).contains(text) {
            self.assert_alive();
            assert!(
                Instant::now() < deadline,
                "{} never logged {text:?}",
                self.children[index].0
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Panics if a process that should run has exited.
    pub fn assert_alive(&mut self) {
        for (name, _, child) in &mut self.children {
            if child.id().is_some()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("{name} exited early: {status}");
            }
        }
    }

    /// SIGKILL, and reap.
    pub async fn kill(&mut self, index: usize) {
        let child = &mut self.children[index].2;
        child.start_kill().unwrap();
        child.wait().await.unwrap();
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the process.
    pub async fn signal(&mut self, index: usize, signal: &str) {
        let pid = self.pid(index);
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .await
            .unwrap();
        assert!(sent.success(), "kill -{signal} {pid} failed");
    }

    /// SIGTERM, and wait for a clean exit (bounded).
    pub async fn terminate(&mut self, index: usize) {
        let (name, _, child) = &mut self.children[index];
        let pid = child.id().expect("the process is running");
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .unwrap();
        assert!(sent.success(), "kill -TERM {pid} failed");
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .unwrap_or_else(|_| panic!("{name} did not stop within 30 s of SIGTERM"))
            .unwrap();
        assert!(status.success(), "{name} stopped with {status}");
    }

    pub async fn kill_all(&mut self) {
        for (_, _, child) in &mut self.children {
            if child.id().is_some() {
                child.start_kill().ok();
                child.wait().await.ok();
            }
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (name, log, _) in &self.children {
            eprintln!("===== {name} ({}) =====\n{}", log.display(), Self::log(log));
        }
    }
}
