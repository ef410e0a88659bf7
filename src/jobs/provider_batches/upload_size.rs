//! How large an upload a provider takes, as learned from its 413s.
//!
//! The providers' own limits (OpenAI: 200 MB a file; Anthropic: 256 MB a batch) are
//! what a batch is built within, but a gateway in front of one often takes far less
//! (a proxy's body limit of a megabyte is common), and answers a larger upload 413
//! without forwarding it. Such an upload created nothing; its items go out again in
//! provider batches of at most half its size, halving again at each 413, down to
//! one request, which fails if even it is too large. What is learned lasts for the
//! life of the process: a restarted process learns it again from one 413.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The largest upload each provider (by name) is known to take, where one of its
/// uploads was refused as too large.
#[derive(Clone, Default)]
pub(super) struct UploadSizes(Arc<Mutex<HashMap<String, usize>>>);

impl UploadSizes {
    /// The bytes an upload to `provider` may have: `limit`, or less if it refused
    /// more.
    pub(super) fn bound(&self, provider: &str, limit: usize) -> usize {
        let learned = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        learned
            .get(provider)
            .map_or(limit, |&bytes| bytes.min(limit))
    }

    /// `provider` refused an upload of `bytes` as too large: later ones have at most
    /// half.
    pub(super) fn refused(&self, provider: &str, bytes: usize) {
        let mut learned = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let half = bytes / 2;
        learned
            .entry(provider.to_owned())
            .and_modify(|known| *known = (*known).min(half))
            .or_insert(half);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_halves_the_bound_and_never_raises_it() {
        let sizes = UploadSizes::default();
        assert_eq!(sizes.bound("openai", 1000), 1000);
        sizes.refused("openai", 800);
        assert_eq!(sizes.bound("openai", 1000), 400);
        // A refusal of a larger upload (made before the first was learned) does not
        // raise what was learned.
        sizes.refused("openai", 2000);
        assert_eq!(sizes.bound("openai", 1000), 400);
        sizes.refused("openai", 400);
        assert_eq!(sizes.bound("openai", 1000), 200);
        // The provider's own limit still bounds it, and other providers are apart.
        assert_eq!(sizes.bound("openai", 100), 100);
        assert_eq!(sizes.bound("anthropic", 1000), 1000);
    }
}
