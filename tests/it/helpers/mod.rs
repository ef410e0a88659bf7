//! What every test uses: a fresh database per test on each backend, the application
//! started on a random port with the simulator beside it, and GraphQL clients.

/// Runs an `async fn(Backend)` as two tests, `sqlite` and `postgres`; the PostgreSQL
/// one passes without running (and says so loudly) when `TEST_DATABASE_URL` is unset.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name(crate::helpers::Backend::Sqlite).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    if let Some(backend) = crate::helpers::Backend::postgres() {
                        super::$name(backend).await;
                    }
                }
            }
        )*
    };
}

mod app;
mod backends;
mod children;
mod graphql;
mod jobs;
mod tenants;

pub use app::{
    ADMIN_TOKEN, AppOptions, RunningSimulator, TestApp, simulated_models, spawn_app,
    spawn_app_beside, spawn_app_with, spawn_app_with_simulator, test_worker_settings,
    wait_until_serving,
};
pub use backends::{Backend, TestDatabase};
pub use children::{Client, Processes, free_address, wait_for_http};
pub use graphql::{decimal, error_code};
pub use jobs::{event_kinds, job_input, large_job_input, one_job_made_once, renew_lease};
pub use tenants::TestTenant;
