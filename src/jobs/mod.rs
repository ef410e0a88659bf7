//! Jobs: how they are created and read, claimed under a lease, run by workers, and
//! how their events reach subscribers.

pub mod batches;
pub mod budget;
pub mod events;
pub mod fallbacks;
pub mod flow;
pub mod holds;
pub mod input;
pub mod labels;
pub mod leases;
pub mod lifecycle;
pub mod measuring;
pub mod observe;
pub mod parameters;
pub mod parts;
pub mod provider_batches;
pub mod queue;
pub mod quote;
pub mod reach;
pub mod rerun;
pub mod retention;
pub mod service;
pub mod tokens;
pub mod tools;
pub mod worker;
