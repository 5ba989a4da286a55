//! The PostgreSQL backend's macros: SQL text shared by statements built with `concat!`
//! (`stamp_sql!`, `counter_sql!`) and the statement runner implemented for each of the
//! connection's borrowers (`run_over!`).

/// The stamp the `machines_stamp` trigger writes, as a statement's own: an uncorrelated scalar
/// subquery, so evaluated once a statement (an `InitPlan`), not once a row. A row written twice
/// within the same millisecond gets the same value again, and the trigger stamps it then.
macro_rules! stamp_sql {
    () => {
        "(SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'))"
    };
}

/// Takes `$2` values of the counter `$1` kept in `meta` at once: the first of them, `first`.
macro_rules! counter_sql {
    () => {
        "INSERT INTO meta (key, value) VALUES ($1, $2::bigint::text) \
         ON CONFLICT (key) DO UPDATE SET value = ((meta.value)::bigint + $2::bigint)::text \
         RETURNING (value)::bigint - $2::bigint AS first"
    };
}

macro_rules! run_over {
    ($ty:ty, $client:ident, $cache:ident) => {
        impl Run for $ty {
            fn execute(&mut self, sql: &str, p: Params<'_>) -> Result<u64, CallError> {
                let st = prepared(
                    BorrowMut::<PgClient>::borrow_mut(&mut self.$client),
                    BorrowMut::<HashMap<String, Statement>>::borrow_mut(&mut self.$cache),
                    sql,
                )?;
                self.$client.execute(&st, p)
            }
            fn query(&mut self, sql: &str, p: Params<'_>) -> Result<Vec<Row>, CallError> {
                let st = prepared(
                    BorrowMut::<PgClient>::borrow_mut(&mut self.$client),
                    BorrowMut::<HashMap<String, Statement>>::borrow_mut(&mut self.$cache),
                    sql,
                )?;
                self.$client.query(&st, p)
            }
            fn query_opt(&mut self, sql: &str, p: Params<'_>) -> Result<Option<Row>, CallError> {
                let st = prepared(
                    BorrowMut::<PgClient>::borrow_mut(&mut self.$client),
                    BorrowMut::<HashMap<String, Statement>>::borrow_mut(&mut self.$cache),
                    sql,
                )?;
                self.$client.query_opt(&st, p)
            }
            fn query_one(&mut self, sql: &str, p: Params<'_>) -> Result<Row, CallError> {
                let st = prepared(
                    BorrowMut::<PgClient>::borrow_mut(&mut self.$client),
                    BorrowMut::<HashMap<String, Statement>>::borrow_mut(&mut self.$cache),
                    sql,
                )?;
                self.$client.query_one(&st, p)
            }
        }
    };
}
