//! Scalars of the API that async-graphql's built-ins do not get right for money.

use crate::billing::Credits;
use async_graphql::{InputValueError, InputValueResult, Scalar, ScalarType, Value};
use rust_decimal::Decimal;
use std::str::FromStr;

/// An exact decimal amount (credits), the `Decimal` scalar: written as a string such
/// as `"12.5"`. A JSON number with a fraction is refused, since it reaches the server
/// as a float and would lose digits; whole numbers are accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Amount(pub Decimal);

#[Scalar(name = "Decimal")]
impl ScalarType for Amount {
    fn parse(value: Value) -> InputValueResult<Self> {
        match &value {
            Value::String(text) => Decimal::from_str_exact(text.trim())
                .or_else(|_| Decimal::from_str(text.trim()))
                .map(Self)
                .map_err(|error| InputValueError::custom(format!("not a decimal: {error}"))),
            Value::Number(number) => match (number.as_i64(), number.as_u64()) {
                (Some(whole), _) => Ok(Self(Decimal::from(whole))),
                (None, Some(whole)) => Ok(Self(Decimal::from(whole))),
                _ => Err(InputValueError::custom(
                    "send amounts with a fraction as strings, e.g. \"12.5\": a JSON number loses digits",
                )),
            },
            _ => Err(InputValueError::expected_type(value)),
        }
    }

    fn to_value(&self) -> Value {
        Value::String(self.0.normalize().to_string())
    }
}

impl From<Credits> for Amount {
    fn from(value: Credits) -> Self {
        Self(value.to_decimal())
    }
}
