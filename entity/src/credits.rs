use rust_decimal::Decimal;
use std::fmt;
use std::ops::{Add, Sub};

/// Fractional digits a credit amount may have: amounts are whole nano-credits.
const SCALE: u32 = 9;

/// An amount of credits, exact to the nano-credit.
///
/// Stored as a count of nano-credits (BIGINT) and shown as a `Decimal`, so sums are
/// exact on every database and no float ever touches money.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Credits(i64);

/// Why a decimal is not an amount of credits.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CreditsError {
    #[error("an amount has at most 9 fractional digits")]
    TooPrecise,
    #[error("the amount is too large")]
    TooLarge,
}

impl Credits {
    /// No credits.
    pub const ZERO: Self = Self(0);

    /// An amount from a count of nano-credits, as stored.
    pub const fn from_nanos(nanos: i64) -> Self {
        Self(nanos)
    }

    /// The count of nano-credits, as stored.
    pub const fn nanos(self) -> i64 {
        self.0
    }

    /// The amount as a decimal with trailing zeros removed (`12.5`, not `12.500000000`).
    pub fn to_decimal(self) -> Decimal {
        Decimal::new(self.0, SCALE).normalize()
    }

    /// The amount a decimal names; refuses more precision than a nano-credit.
    pub fn from_decimal(value: Decimal) -> Result<Self, CreditsError> {
        let normalized = value.normalize();
        if normalized.scale() > SCALE {
            return Err(CreditsError::TooPrecise);
        }
        let nanos = normalized
            .checked_mul(Decimal::from(1_000_000_000_i64))
            .ok_or(CreditsError::TooLarge)?;
        i64::try_from(nanos)
            .map(Self)
            .map_err(|_| CreditsError::TooLarge)
    }

    /// Whether the amount is above zero.
    pub fn is_positive(self) -> bool {
        self.0 > 0
    }

    /// The smaller of two amounts.
    pub fn min(self, other: Self) -> Self {
        Self(self.0.min(other.0))
    }

    /// The amount `factor` times over, saturating like addition.
    pub fn times(self, factor: u32) -> Self {
        Self(self.0.saturating_mul(i64::from(factor)))
    }

    /// Addition that refuses to overflow.
    pub fn checked_add(self, other: Self) -> Option<Self> {
        self.0.checked_add(other.0).map(Self)
    }
}

impl Add for Credits {
    type Output = Self;

    /// Saturates rather than wraps: a balance this large is a bug caught by the audit,
    /// never a silent sign flip.
    fn add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }
}

impl Sub for Credits {
    type Output = Self;

    fn sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }
}

impl std::iter::Sum for Credits {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::ZERO, Add::add)
    }
}

impl fmt::Display for Credits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_decimal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn nine_fractional_digits_survive_a_round_trip() {
        let value = Decimal::from_str("123456.123456789").unwrap();
        let credits = Credits::from_decimal(value).unwrap();
        assert_eq!(credits.nanos(), 123_456_123_456_789);
        assert_eq!(credits.to_decimal(), value);
        assert_eq!(credits.to_string(), "123456.123456789");
    }

    #[test]
    fn trailing_zeros_do_not_count_as_precision() {
        let value = Decimal::from_str("12.5000000000000").unwrap();
        assert_eq!(Credits::from_decimal(value).unwrap().to_string(), "12.5");
    }

    #[test]
    fn a_tenth_of_a_nano_credit_is_refused() {
        let value = Decimal::from_str("0.0000000001").unwrap();
        assert_eq!(Credits::from_decimal(value), Err(CreditsError::TooPrecise));
    }

    #[test]
    fn amounts_beyond_the_column_are_refused() {
        let value = Decimal::from_str("10000000000").unwrap();
        assert_eq!(Credits::from_decimal(value), Err(CreditsError::TooLarge));
    }
}
