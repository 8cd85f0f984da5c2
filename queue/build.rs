// `sqlx::migrate!` embeds the migrations when this crate compiles, and cargo does not know
// it read them: without this, a new migration file is left out of builds until some source
// file of the crate changes.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
