//! Exponential backoff, the one schedule every retry loop of the service counts its
//! waits by: a job's retries, a webhook's deliveries, an attempt recording its end.
//! Each caller keeps its own numbers (first wait, cap, jitter); the arithmetic is here.

use rand::Rng;
use std::time::Duration;

/// How much a wait varies around its nominal value, so that things that failed
/// together do not come back together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Jitter {
    /// Exactly the nominal wait.
    None,
    /// "Equal jitter": uniform between half of the nominal wait and all of it.
    Equal,
    /// Uniform within ± this fraction of the nominal wait (0.25: 75 % to 125 %).
    Spread(f64),
}

/// A wait that starts at `first`, doubles with each try, stops at `cap`, and varies by
/// `jitter`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub first: Duration,
    pub cap: Duration,
    pub jitter: Jitter,
}

impl Backoff {
    /// The wait after `tries` failed tries (1 for the first failure) before jitter:
    /// `first` × 2^(tries − 1), at most `cap`. Tries below 1 count as 1.
    pub fn nominal(&self, tries: u32) -> Duration {
        let doublings = tries.saturating_sub(1);
        self.first
            .saturating_mul(2_u32.saturating_pow(doublings))
            .min(self.cap)
    }

    /// The wait after `tries` failed tries, placed within its jitter by `draw`, a number
    /// from 0 (the shortest) to 1 (the longest): deterministic, for callers that draw
    /// it themselves.
    pub fn at(&self, tries: u32, draw: f64) -> Duration {
        let nominal = self.nominal(tries);
        let draw = draw.clamp(0.0, 1.0);
        match self.jitter {
            Jitter::None => nominal,
            Jitter::Equal => nominal / 2 + (nominal / 2).mul_f64(draw),
            Jitter::Spread(fraction) => nominal.mul_f64(1.0 - fraction + 2.0 * fraction * draw),
        }
    }

    /// The wait after `tries` failed tries, with a random jitter.
    pub fn delay(&self, tries: u32) -> Duration {
        self.at(tries, draw())
    }
}

/// A random place within a jitter, for [`Backoff::at`].
pub fn draw() -> f64 {
    rand::rng().random_range(0.0..=1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn the_wait_doubles_from_the_first_and_stops_at_the_cap() {
        let backoff = Backoff {
            first: 2 * SECOND,
            cap: 60 * SECOND,
            jitter: Jitter::None,
        };
        let waits: Vec<u64> = (0..8)
            .map(|tries| backoff.nominal(tries).as_secs())
            .collect();
        assert_eq!(waits, [2, 2, 4, 8, 16, 32, 60, 60]);
        // No overflow however many tries failed.
        assert_eq!(backoff.nominal(u32::MAX), 60 * SECOND);
        assert_eq!(backoff.delay(3), 8 * SECOND);
    }

    #[test]
    fn equal_jitter_spans_half_to_all_of_the_wait() {
        let backoff = Backoff {
            first: 2 * SECOND,
            cap: 60 * SECOND,
            jitter: Jitter::Equal,
        };
        assert_eq!(backoff.at(3, 0.0), 4 * SECOND);
        assert_eq!(backoff.at(3, 0.5), 6 * SECOND);
        assert_eq!(backoff.at(3, 1.0), 8 * SECOND);
        // A draw outside 0..=1 stays within the jitter.
        assert_eq!(backoff.at(3, 7.0), 8 * SECOND);
        assert_eq!(backoff.at(3, -1.0), 4 * SECOND);
        for _ in 0..100 {
            let wait = backoff.delay(3);
            assert!((4 * SECOND..=8 * SECOND).contains(&wait), "{wait:?}");
        }
    }

    #[test]
    fn a_spread_jitter_spans_the_fraction_either_side() {
        let backoff = Backoff {
            first: 4 * SECOND,
            cap: 3600 * SECOND,
            jitter: Jitter::Spread(0.25),
        };
        assert_eq!(backoff.at(1, 0.0), 3 * SECOND);
        assert_eq!(backoff.at(1, 0.5), 4 * SECOND);
        assert_eq!(backoff.at(1, 1.0), 5 * SECOND);
        assert_eq!(backoff.at(40, 1.0), 4500 * SECOND);
        for _ in 0..100 {
            let wait = backoff.delay(2);
            assert!((6 * SECOND..=10 * SECOND).contains(&wait), "{wait:?}");
        }
    }
}
