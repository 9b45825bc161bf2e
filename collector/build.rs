//! `sqlx::migrate!` embeds migrations/ at compile time: rebuild when a migration is added or
//! changed, or a new migration would be missing from the binary (and refused by a database that
//! has it).
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
