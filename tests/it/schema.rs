//! `schema.graphql` is the schema the code serves.

/// Fails when the committed SDL differs from the code's; `UPDATE_SCHEMA=1` rewrites it.
#[test]
fn committed_schema_matches_the_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schema.graphql");
    let sdl = jobledger::graphql::sdl();
    if std::env::var("UPDATE_SCHEMA").is_ok_and(|value| value == "1") {
        std::fs::write(&path, &sdl).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == sdl,
        "schema.graphql differs from the code's schema; run `UPDATE_SCHEMA=1 cargo test --test it schema` and review the diff"
    );
}
