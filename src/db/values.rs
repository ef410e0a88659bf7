//! Rows of values that one hand-written statement changes or reads many rows by, as
//! a table whose columns are named once: `WITH v (id, status, …) AS (VALUES (…), …)
//! UPDATE jobs SET status = v.status … FROM v WHERE jobs.id = v.id`. A bare `VALUES`
//! list names its columns `column1`, `column2`, … on both backends, and a statement
//! that counted them wrong read one column for another without an error.

use super::Binds;
use sea_orm::{DbBackend, Statement, Value};

/// The rows, each exactly as wide as the column names (the array length says so), and
/// any other values the statement binds.
pub struct Values<const N: usize> {
    parameters: Binds,
    name: &'static str,
    columns: [&'static str; N],
    rows: Vec<String>,
}

impl<const N: usize> Values<N> {
    /// No rows yet, for a table `name` with `columns`.
    pub fn new(backend: DbBackend, name: &'static str, columns: [&'static str; N]) -> Self {
        Self {
            parameters: Binds::new(backend),
            name,
            columns,
            rows: Vec::new(),
        }
    }

    /// Binds a value the statement uses outside the rows; returns its placeholder.
    pub fn bind(&mut self, value: impl Into<Value>) -> String {
        self.parameters.bind(value)
    }

    /// Adds a row: one value per column, in the order the columns were named.
    pub fn push(&mut self, row: [Value; N]) {
        let row = self.parameters.row(row);
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// `sql` after the table's `WITH` clause, with every value bound. There must be a
    /// row: `VALUES` cannot be empty.
    pub fn statement(self, sql: &str) -> Statement {
        debug_assert!(!self.rows.is_empty(), "a VALUES table needs a row");
        let text = format!(
            "WITH {name} ({columns}) AS (VALUES {rows}) {sql}",
            name = self.name,
            columns = self.columns.join(", "),
            rows = self.rows.join(", "),
        );
        self.parameters.statement(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_columns_are_named_once_and_the_values_numbered_in_binding_order() {
        let mut values = Values::new(DbBackend::Postgres, "v", ["id", "status"]);
        let at = values.bind(7);
        values.push([1.into(), "a".into()]);
        values.push([2.into(), "b".into()]);
        let statement = values.statement(&format!(
            "UPDATE t SET status = v.status, at = {at} FROM v WHERE t.id = v.id"
        ));
        assert_eq!(
            statement.sql,
            "WITH v (id, status) AS (VALUES ($2, $3), ($4, $5)) \
             UPDATE t SET status = v.status, at = $1 FROM v WHERE t.id = v.id"
        );
        assert_eq!(statement.values.unwrap().0.len(), 5);
    }

    #[test]
    fn sqlite_placeholders_are_numbered_too() {
        let mut values = Values::new(DbBackend::Sqlite, "v", ["id"]);
        values.push([1.into()]);
        values.push([2.into()]);
        assert_eq!(
            values.statement("SELECT id FROM v").sql,
            "WITH v (id) AS (VALUES (?1), (?2)) SELECT id FROM v"
        );
    }
}
