//! Inserting many rows of one table in one statement — the bulk path batches take.
//!
//! On PostgreSQL the rows travel as one array per column and are spread out again by
//! `unnest`, so a chunk of 1,000 rows is one statement with one parameter per column
//! whatever its size (planning a statement of 28,000 placeholders costs more than
//! inserting the rows). SQLite has no arrays; there the rows are multi-row `VALUES`,
//! split to stay under its limit of placeholders, all in the caller's transaction.

use sea_orm::{
    ActiveModelTrait, ActiveValue, ConnectionTrait, DbBackend, DbErr, EntityName, EntityTrait,
    Iterable, Statement, Value,
};
use uuid::Uuid;

/// Most placeholders one SQLite statement is given. Far below SQLite's limit (32,766):
/// binding a parameter costs a scan of the statement's parameter names in sqlx, so a
/// statement of 30,000 placeholders spent nearly all its time binding (measured: 97%
/// of a chunk's time, 150 rows/s); statements of about 1,000 bind in linear time.
pub const SQLITE_MAX_PLACEHOLDERS: usize = 1_000;

/// What happens to a row whose unique key is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnConflict {
    /// The statement fails.
    Fail,
    /// The row is skipped; the answer leaves it out.
    Skip,
}

/// Inserts `rows` (every column set) in the caller's transaction and returns the ids
/// of the rows inserted, in no particular order: with [`OnConflict::Skip`] a row whose
/// key was taken is missing.
pub async fn insert<A>(
    db: &impl ConnectionTrait,
    rows: Vec<A>,
    conflict: OnConflict,
) -> Result<Vec<Uuid>, DbErr>
where
    A: ActiveModelTrait,
{
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let columns: Vec<<A::Entity as EntityTrait>::Column> =
        <A::Entity as EntityTrait>::Column::iter().collect();
    let names: Vec<String> = columns
        .iter()
        .map(|column| format!("\"{}\"", sea_orm::IdenStatic::as_str(column)))
        .collect();
    let table = A::Entity::default().table_name().to_owned();
    let values: Vec<Vec<Value>> = rows
        .into_iter()
        .map(|row| {
            columns
                .iter()
                .map(|column| match row.get(*column) {
                    ActiveValue::Set(value) | ActiveValue::Unchanged(value) => Ok(value),
                    ActiveValue::NotSet => Err(DbErr::Custom(format!(
                        "bulk insert into {table}: column {} is not set",
                        sea_orm::IdenStatic::as_str(column)
                    ))),
                })
                .collect::<Result<Vec<Value>, DbErr>>()
        })
        .collect::<Result<_, _>>()?;
    let conflict = match conflict {
        OnConflict::Fail => "",
        OnConflict::Skip => " ON CONFLICT DO NOTHING",
    };
    let head = format!("INSERT INTO \"{table}\" ({})", names.join(", "));
    let mut inserted = Vec::with_capacity(values.len());
    match db.get_database_backend() {
        DbBackend::Postgres => {
            let arrays = columns_as_arrays(&values, names.len())?;
            let casts: Vec<String> = arrays
                .iter()
                .enumerate()
                .map(|(index, (kind, _))| format!("${}::{kind}[]", index + 1))
                .collect();
            let sql = format!(
                "{head} SELECT * FROM unnest({}){conflict} RETURNING \"id\"",
                casts.join(", ")
            );
            let statement = Statement::from_sql_and_values(
                DbBackend::Postgres,
                sql,
                arrays.into_iter().map(|(_, literal)| Value::from(literal)),
            );
            for row in db.query_all_raw(statement).await? {
                inserted.push(row.try_get::<Uuid>("", "id")?);
            }
        }
        backend => {
            let per_statement = (SQLITE_MAX_PLACEHOLDERS / names.len()).max(1);
            let mut values = values.into_iter().peekable();
            while values.peek().is_some() {
                let mut parameters = super::Binds::new(backend);
                let rows: Vec<String> = values
                    .by_ref()
                    .take(per_statement)
                    .map(|row| parameters.row(row))
                    .collect();
                let sql = format!(
                    "{head} VALUES {}{conflict} RETURNING \"id\"",
                    rows.join(", ")
                );
                for row in db.query_all_raw(parameters.statement(sql)).await? {
                    inserted.push(row.try_get::<Uuid>("", "id")?);
                }
            }
        }
    }
    Ok(inserted)
}

/// `texts` as one PostgreSQL `text[]` literal, for `= ANY($n::text[])`.
pub fn text_array<'a>(texts: impl Iterator<Item = &'a str>) -> String {
    let mut literal = String::from("{");
    for (index, text) in texts.enumerate() {
        if index > 0 {
            literal.push(',');
        }
        push_element(&mut literal, &Value::from(text.to_owned()))
            .expect("a string is an array element");
    }
    literal.push('}');
    literal
}

/// Each column of `rows` as a PostgreSQL array literal, with its element type.
fn columns_as_arrays(
    rows: &[Vec<Value>],
    width: usize,
) -> Result<Vec<(&'static str, String)>, DbErr> {
    let mut arrays: Vec<(&'static str, String)> = Vec::with_capacity(width);
    for column in 0..width {
        let kind = element_type(&rows[0][column])?;
        let mut literal = String::from("{");
        for (index, row) in rows.iter().enumerate() {
            if index > 0 {
                literal.push(',');
            }
            push_element(&mut literal, &row[column])?;
        }
        literal.push('}');
        arrays.push((kind, literal));
    }
    Ok(arrays)
}

/// The PostgreSQL type of an array of `value`s.
fn element_type(value: &Value) -> Result<&'static str, DbErr> {
    Ok(match value {
        Value::Bool(_) => "bool",
        Value::Int(_) => "int4",
        Value::BigInt(_) => "int8",
        Value::String(_) => "text",
        Value::Uuid(_) => "uuid",
        other => {
            return Err(DbErr::Custom(format!(
                "bulk insert: no array type for {other:?}"
            )));
        }
    })
}

/// Appends `value` as an element of an array literal: strings quoted, with their
/// backslashes and quotes escaped; NULL unquoted.
fn push_element(literal: &mut String, value: &Value) -> Result<(), DbErr> {
    match value {
        Value::Bool(Some(value)) => literal.push(if *value { 't' } else { 'f' }),
        Value::Int(Some(value)) => literal.push_str(&value.to_string()),
        Value::BigInt(Some(value)) => literal.push_str(&value.to_string()),
        Value::Uuid(Some(value)) => literal.push_str(&value.to_string()),
        Value::String(Some(text)) => {
            literal.push('"');
            for character in text.chars() {
                if matches!(character, '"' | '\\') {
                    literal.push('\\');
                }
                literal.push(character);
            }
            literal.push('"');
        }
        Value::Bool(None)
        | Value::Int(None)
        | Value::BigInt(None)
        | Value::Uuid(None)
        | Value::String(None) => literal.push_str("NULL"),
        other => {
            return Err(DbErr::Custom(format!(
                "bulk insert: cannot write {other:?} into an array"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_elements_survive_quotes_backslashes_braces_and_nulls() {
        let rows = vec![
            vec![Value::from("a\"b\\c{d},e".to_owned()), Value::BigInt(None)],
            vec![Value::String(None), Value::from(7_i64)],
        ];
        let arrays = columns_as_arrays(&rows, 2).unwrap();
        assert_eq!(arrays[0], ("text", r#"{"a\"b\\c{d},e",NULL}"#.to_owned()));
        assert_eq!(arrays[1], ("int8", "{NULL,7}".to_owned()));
    }
}
