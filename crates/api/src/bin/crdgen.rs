//! Prints the SafeRollout CustomResourceDefinition as YAML.
//!
//! `cargo run -p saferollout-api --bin crdgen > deploy/crd.yaml`

fn main() {
    print!("{}", saferollout_api::crd_yaml());
}
