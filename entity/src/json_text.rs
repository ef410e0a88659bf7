use sea_orm::DeriveValueType;
use serde_json::Value;

/// A JSON value stored as its serialized text (a `text` column on both backends).
///
/// PostgreSQL's `jsonb` refuses the escape `\u0000`, and sqlx binds JSON as `jsonb`
/// even for a `json` column: a model reply or a prompt holding a NUL character would
/// fail to store. Serialized text keeps every valid JSON value exactly, escapes and
/// all, on both backends.
#[derive(Clone, Debug, PartialEq, Eq, DeriveValueType)]
#[sea_orm(
    value_type = "String",
    from_str = "JsonText::parse",
    to_str = "JsonText::render",
    column_type = "Text"
)]
pub struct JsonText(pub Value);

impl JsonText {
    /// The value a stored text holds.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text).map(Self)
    }

    /// The text stored for this value: compact JSON, with every control character
    /// escaped (so no NUL byte ever reaches the database).
    pub fn render(&self) -> String {
        self.0.to_string()
    }

    /// The value.
    pub fn into_value(self) -> Value {
        self.0
    }
}

impl From<Value> for JsonText {
    fn from(value: Value) -> Self {
        Self(value)
    }
}
