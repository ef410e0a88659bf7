//! jobledger: durable, accountable LLM jobs.
//!
//! A job is created through GraphQL and lives in the database; workers claim it under
//! a lease, call the model, and settle the credits held for it. See
//! `docs/architecture.md` for the lifecycle and its invariants section for the
//! invariants.

pub mod accounts;
pub mod app;
pub mod backoff;
pub mod bench;
pub mod billing;
pub mod bus;
pub mod cli;
pub mod config;
pub mod db;
pub mod error;
pub mod graphql;
pub mod http;
pub mod jobs;
pub mod keyed_slots;
pub mod llm;
pub mod metrics;
pub mod outbox;
pub mod page;
pub mod startup;
pub mod telemetry;
pub mod validation;
pub mod webhooks;
