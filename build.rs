//! The web console's files are compiled into the binary (`include_dir!` in
//! `src/http/console.rs`), which cannot tell cargo that it read them: this makes a
//! change under `console/` rebuild the crate.

fn main() {
    println!("cargo:rerun-if-changed=console");
}
