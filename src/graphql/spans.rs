//! One trace span per GraphQL operation, whatever the transport (HTTP, WebSocket,
//! SSE): named by the operation, with the tenant it acts for. Exported when traces
//! are on (see `telemetry`).

use crate::accounts::Principal;
use async_graphql::Response;
use async_graphql::extensions::{Extension, ExtensionContext, ExtensionFactory, NextExecute};
use std::sync::Arc;
use tracing::Instrument;

/// The schema extension.
pub struct OperationSpans;

impl ExtensionFactory for OperationSpans {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(OperationSpans)
    }
}

#[async_trait::async_trait]
impl Extension for OperationSpans {
    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let tenant = match ctx.data_opt::<Principal>() {
            Some(Principal::Tenant { tenant_id }) => tenant_id.to_string(),
            Some(Principal::Token(grant)) => grant.tenant_id.to_string(),
            Some(Principal::Admin) => "admin".to_owned(),
            None => "anonymous".to_owned(),
        };
        let span = tracing::info_span!(
            "graphql",
            otel.name = format!("graphql {}", operation_name.unwrap_or("anonymous")),
            graphql.operation = operation_name.unwrap_or(""),
            tenant.id = %tenant,
            trace_id = tracing::field::Empty,
        );
        crate::telemetry::record_trace_id(&span);
        next.run(ctx, operation_name).instrument(span).await
    }
}
