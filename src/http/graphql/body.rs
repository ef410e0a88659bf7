//! A request's body, bounded in bytes, JSON values and time before it is parsed.

use crate::accounts::Principal;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Largest GraphQL request body accepted: above the largest job input, so that an
/// oversized input is refused with a `VALIDATION` error that says why, not a bare 413.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// How long a client may take to send its whole request body: 16 MiB at about
/// 4.5 Mbit/s. A client that trickles its body ties up one of its slots only this long.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Bodies larger than this are read only within the process's [`LargeBodies`]
/// budget; smaller ones are bounded well enough by the request slots. (With 1 MiB,
/// twelve tenants each sending eight bodies just under it took 661 MiB.)
const LARGE_BODY_BYTES: usize = 64 * 1024;

/// What serving a body costs in memory, as a multiple of its size: it is parsed as
/// JSON, as GraphQL input, as job inputs and bound as statement parameters, each a
/// copy. A chunk of a thousand 15 KB documents (15 MiB) took 60 MiB on SQLite and
/// 117–156 MiB on PostgreSQL while it was served.
const MEMORY_PER_BODY_BYTE: usize = 10;

/// What the large bodies being read or served at once may cost together, counted at
/// [`MEMORY_PER_BODY_BYTE`]: three 16 MiB chunks at once, or fifty of 1 MiB.
/// (Counting received bytes alone, 12 chunks of 15 MiB were admitted together and
/// the process reached 1.4 GiB; counting 8 bytes a byte, 4 were, and it reached
/// 681 MiB on PostgreSQL.)
const LARGE_BODIES_BUDGET: usize = 512 * 1024 * 1024;

/// How long a large body waits for room in the budget before it is refused.
const LARGE_BODY_WAIT: Duration = Duration::from_secs(10);

/// The budget's unit: permits count KiB, so the whole budget fits a semaphore.
const BUDGET_UNIT: usize = 1024;

/// The process's budget for large request bodies. A body takes its whole cost from
/// it before its first byte is read — all or nothing, so readers that each hold a
/// part can never wait for each other — and gives it back when its response is done.
#[derive(Clone, Debug)]
pub(in crate::http) struct LargeBodies(Arc<Semaphore>);

impl Default for LargeBodies {
    fn default() -> Self {
        Self(Arc::new(Semaphore::new(LARGE_BODIES_BUDGET / BUDGET_UNIT)))
    }
}

/// A large body's share of the budget, given back when dropped.
#[must_use]
pub(in crate::http) struct BodyReservation {
    _permit: Option<OwnedSemaphorePermit>,
}

impl LargeBodies {
    /// Room for a body of `bytes`, waiting at most [`LARGE_BODY_WAIT`]; nothing to
    /// take for a small body.
    async fn reserve(&self, bytes: usize) -> Result<BodyReservation, (StatusCode, String)> {
        if bytes <= LARGE_BODY_BYTES {
            return Ok(BodyReservation { _permit: None });
        }
        let cost = bytes.saturating_mul(MEMORY_PER_BODY_BYTE);
        let units = u32::try_from(cost.div_ceil(BUDGET_UNIT)).unwrap_or(u32::MAX);
        match tokio::time::timeout(LARGE_BODY_WAIT, self.0.clone().acquire_many_owned(units)).await
        {
            Ok(Ok(permit)) => Ok(BodyReservation {
                _permit: Some(permit),
            }),
            _ => Err((
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is reading as many large requests as it can hold; \
                 send this one again shortly"
                    .to_owned(),
            )),
        }
    }
}

/// The `Retry-After` of a refusal `read_body` answered with `status`: a body refused
/// for want of room may be sent again in a moment; other refusals stand.
pub(in crate::http) fn retry_after(status: StatusCode) -> Option<HeaderValue> {
    (status == StatusCode::SERVICE_UNAVAILABLE).then(|| HeaderValue::from_static("2"))
}

/// What a body may hold, by who sends it. Besides bytes, the JSON values outside
/// strings are counted before the body is parsed: a body of tiny objects costs
/// about 60 times its size once parsed (15 MiB of `{"a":1},` took 931 MB), while a
/// job's text is one value however long.
#[derive(Clone, Copy, Debug)]
pub(in crate::http) struct BodyLimit {
    bytes: usize,
    values: usize,
}

impl BodyLimit {
    /// With an API key: the largest job input, and far more values than a job's
    /// 1,000 messages and 64 KiB of metadata hold.
    pub(super) const AUTHENTICATED: Self = Self {
        bytes: MAX_REQUEST_BYTES,
        values: 200_000,
    };
    /// Without one: only the schema can be read.
    pub(super) const ANONYMOUS: Self = Self {
        bytes: 64 * 1024,
        values: 2_000,
    };

    pub(in crate::http) fn of(principal: Option<&Principal>) -> Self {
        match principal {
            Some(_) => Self::AUTHENTICATED,
            None => Self::ANONYMOUS,
        }
    }
}

/// About how many JSON values `body` holds: the separators and openings outside
/// strings. Exact enough to bound what parsing it costs, and linear in its size.
fn json_values(body: &[u8]) -> usize {
    let (mut values, mut in_string, mut escaped) = (0, false, false);
    for &byte in body {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' | b',' | b':' => values += 1,
                _ => {}
            }
        }
    }
    values
}

/// The body, refused when it passes `limit` or takes longer than `BODY_READ_TIMEOUT`
/// to arrive (counted once it may be read). A body larger than [`LARGE_BODY_BYTES`]
/// is read only once the cost of its declared length (without one, of the limit) is
/// reserved in `budget`; the reservation comes back with the body, to be held until
/// the response is sent.
pub(in crate::http) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: BodyLimit,
    budget: &LargeBodies,
) -> Result<(Bytes, BodyReservation), (StatusCode, String)> {
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {} bytes", limit.bytes),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit.bytes as u64) {
        return Err(too_large());
    }
    let reservation = budget
        .reserve(declared.map_or(limit.bytes, |length| length as usize))
        .await?;
    let read = async {
        let mut stream = body.into_data_stream();
        let mut collected = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| {
                (
                    StatusCode::BAD_REQUEST,
                    format!("the body could not be read: {error}"),
                )
            })?;
            if collected.len() + chunk.len() > limit.bytes {
                return Err(too_large());
            }
            collected.extend_from_slice(&chunk);
        }
        if json_values(&collected) > limit.values {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body holds more than {} JSON values; send large texts as strings",
                    limit.values
                ),
            ));
        }
        Ok((Bytes::from(collected), reservation))
    };
    tokio::time::timeout(BODY_READ_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| {
            Err((
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            ))
        })
}
