//! The integration tests: one binary that drives the real application over HTTP and
//! WebSocket against real databases — SQLite always, PostgreSQL when
//! `TEST_DATABASE_URL` is set — and the provider simulator over real HTTP.

#[macro_use]
mod helpers;
mod socket;

mod access_tokens;
mod accounts;
mod admin_reads;
mod any_text;
mod api_keys;
mod audit;
mod audit_grants;
mod batch_prices;
mod batches;
mod batching;
mod bench;
mod billing;
mod blackbox;
mod charging;
mod config;
mod console;
mod contract;
mod cors;
mod crash;
mod deadlines;
mod deploy;
mod dispatch;
mod engine;
mod error_codes;
mod expiry;
mod fallbacks;
mod faults;
mod fencing;
mod flags;
mod flow_control;
mod hardening;
mod holds;
mod invariants;
mod jobs;
mod labels;
mod limits;
mod loaders;
mod models;
mod operations;
mod parameters;
mod parts;
mod processes;
mod properties;
mod protocol_model;
mod provider_batch_upkeep;
mod provider_batches;
mod providers;
mod reruns;
mod retention;
mod scheduling;
mod schema;
mod simulator;
mod start_messages;
mod streaming;
mod structured;
mod subscriptions;
mod tools;
mod traces;
mod typescript_client;
mod webhooks;
